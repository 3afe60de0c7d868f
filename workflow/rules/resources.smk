# Slurm routing: config/site.yaml (or $RETINABENCH_SITE) -> every rule's Slurm resources, for
# snakemake-executor-plugin-slurm (docs/slurm.md; the logic is retinabench.pipeline.slurm). Rules only say what
# they need: `resources: gpu=N` plus mem_mb/runtime; apply_site_resources(), called once after the last rule, sends
# GPU jobs to the site's GPU partition and every other job to its CPU partition. Other executors ignore these.
from snakemake.exceptions import WorkflowError

from retinabench.pipeline import slurm as _slurm

try:
    SLURM_SITE = _slurm.load_site(workflow)
except _slurm.SiteError as err:
    raise WorkflowError(str(err))
_slurm.warn_on_architecture(SLURM_SITE)
apply_site_resources = lambda rules=None: _slurm.apply_site_resources(workflow, SLURM_SITE, rules)  # noqa: E731

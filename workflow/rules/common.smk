# The plan (retinabench.plan): what the config selects, every layer's paths, settings, resources and code
# hashes, built once here and asked by every rule file. Start-up checks (fractions, unpinned encoders, devices,
# class placement and knn.k on built manifests, raw-data changes) stop `snakemake` and `snakemake -n` before any job
# runs, all listed at once; remote jobs re-read the Snakefile and skip them.
from snakemake.exceptions import WorkflowError

from retinabench.plan import WorkflowPlan
from retinabench.plan.run_lock import RunLockError
from retinabench.plan.selection import ConfigError

P = WorkflowPlan(config)

REG = P.reg
STAGE = "../scripts/stage.py"
# Conda environments of the rule groups (envs/*.yaml, pinned from requirements.lock by envs/sync.py); used with
# `--sdm conda`, ignored otherwise (the active .venv runs every job).
CORE_ENV = "../../envs/core.yaml"
TORCH_ENV = "../../envs/torch.yaml"
MLLM_ENV = "../../envs/mllm.yaml"
VLLM_ENV = "../../envs/vllm.yaml"  # the mllm rule on `mllm.backend: vllm` (workflow/rules/interfaces.smk)

try:
    P.start(main_process=workflow.is_main_process)
except ConfigError as err:
    raise WorkflowError(str(err))


wildcard_constraints:
    dataset="[A-Za-z0-9_.+-]+",
    task="[A-Za-z0-9_.+-]+",
    encoder="[A-Za-z0-9_.+-]+",

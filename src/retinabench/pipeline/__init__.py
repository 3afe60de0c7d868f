"""The glue between the Snakemake rules and the domain packages.

* :mod:`~retinabench.pipeline.job` — :class:`Job` (a rule's job as plain data) and :func:`write_outputs` (the one
  writer: atomic, a provenance sidecar beside every artifact);
* :mod:`~retinabench.pipeline.stages` — stages keyed by rule name, duplicates refused;
* one module per ``workflow/rules/*.smk`` file holding that file's stages: ``data``, ``features``, ``probes``,
  ``finetune``, ``reliability``, ``analysis``, ``saliency``, ``compute``;

The plan (which jobs, every path, settings, resources) is :mod:`retinabench.plan`, which the stages may import and
which never imports this package.
"""
import os

from retinabench.pipeline.job import Job, write_outputs
from retinabench.pipeline.stages import STAGES, stage

# Set to 1, a job uses its inputs without checking them against their sidecars, and says so in its log: only for
# measuring what verification costs (bench/verify_overhead.py), never for a run whose results are used.
SKIP_VERIFICATION_ENV = "RETINABENCH_SKIP_INPUT_VERIFICATION"


def run_stage(rule: str, job: Job) -> None:
    """Run the stage of ``rule`` on ``job``: first every input is checked against the sha256 its provenance sidecar
    records (:func:`retinabench.integrity.verify_inputs`: a changed intermediate stops the job, named, before it is
    used); on any failure, no sidecar or temporary file of its outputs is left; on success the last line printed
    is the job's ``[done]`` summary (:func:`~retinabench.pipeline.job.job_summary`)."""
    import time

    from retinabench.integrity import ArtifactChanged, verify_inputs
    from retinabench.pipeline.job import announce, job_summary, remove_leftovers
    fn = STAGES.get(rule)
    remove_leftovers(job)
    start = time.perf_counter()
    if os.environ.get(SKIP_VERIFICATION_ENV) == "1":  # bench/verify_overhead.py's baseline run only
        announce(f"retinabench: warning: {SKIP_VERIFICATION_ENV}=1: inputs of rule {rule} are used unverified")
        verified = "inputs not verified"
    else:
        try:
            n = verify_inputs(job.inputs_flat(), consumer=f"rule {rule}")
        except ArtifactChanged as err:
            announce(f"retinabench: {err}")
            raise
        verified = f"{n} input(s) verified in {time.perf_counter() - start:.3f} s"
    try:
        fn(job)
    except BaseException:
        remove_leftovers(job)
        raise
    # The log's last line (stdout is the job's log inside Snakemake): what was written, how much, how long.
    summary = job_summary(job.rule, job.wildcards, job.outputs_flat(), time.perf_counter() - start)
    print(f"{summary[:-1]}; {verified})", flush=True)  # ... in 0:00:12 (12.3 s; 4 input(s) verified in 0.010 s)


__all__ = ["STAGES", "Job", "run_stage", "stage", "write_outputs"]

"""The glue between the Snakemake rules and the domain packages.

* :mod:`~retinabench.pipeline.job` — :class:`Job` (a rule's job as plain data) and :func:`write_outputs` (the one
  writer: atomic, a provenance sidecar beside every artifact);
* :mod:`~retinabench.pipeline.registry` — stages keyed by rule name, duplicates refused;
* one module per ``workflow/rules/*.smk`` file holding that file's stages: ``data``, ``features``, ``probes``,
  ``finetune``, ``reliability``, ``analysis``, ``saliency``, ``compute``;
* :mod:`~retinabench.pipeline.plan` — the torch-free planner: every layer's targets, paths and settings.
* :mod:`~retinabench.pipeline.run_lock` — one writer per results folder (the Snakefile's onstart takes it).
"""
from retinabench.pipeline.job import Job, write_outputs
from retinabench.pipeline.registry import STAGES, stage


def run_stage(rule: str, job: Job) -> None:
    """Run the stage of ``rule`` on ``job``; on any failure, no sidecar or temporary file of its outputs is left;
    on success the last line printed is the job's ``[done]`` summary (:func:`~retinabench.pipeline.job.job_summary`)."""
    import time

    from retinabench.pipeline.job import job_summary, remove_leftovers
    fn = STAGES.get(rule)
    remove_leftovers(job)
    start = time.perf_counter()
    try:
        fn(job)
    except BaseException:
        remove_leftovers(job)
        raise
    # The log's last line (stdout is the job's log inside Snakemake): what was written, how much, how long.
    print(job_summary(job.rule, job.wildcards, job.outputs_flat(), time.perf_counter() - start), flush=True)


__all__ = ["STAGES", "Job", "run_stage", "stage", "write_outputs"]

# retinabench: data -> splits -> image cache -> features -> frozen probes -> metrics -> ranks -> figures.
# Run: snakemake --profile profiles/local all   (see README for Slurm, other configs and partial reruns)
from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from retinabench.settings import ConfigError, load

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# The config through its typed models first (retinabench.settings, docs/configuration.md): every problem in one
# short message, an unknown key with a "did you mean"; the workflow then reads the validated values (--config
# strings coerced, defaults filled). The JSON schema is generated from the same models; validating against it
# afterwards is Snakemake's convention and checks that the committed schema still accepts what the models produce.
try:
    config.update(load(config).plain())
except ConfigError as err:
    raise WorkflowError(str(err))


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/resources.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/probes.smk"
include: "workflow/rules/finetune.smk"
include: "workflow/rules/interfaces.smk"
include: "workflow/rules/lora.smk"
include: "workflow/rules/reliability.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/saliency.smk"
include: "workflow/rules/compute.smk"


rule all:
    default_target: True
    input:
        P.all_targets(),


# The prompt-based protocols alone, without features / probes / analysis (config/interfaces_demo.yaml).
rule interfaces:
    input:
        P.interface_targets(),


# LoRA SFT of MLLMs alone: train -> base + adapter inference -> paired deltas (config/mllm_demo.yaml).
rule lora:
    input:
        P.lora_targets(),


apply_site_resources()  # workflow/rules/resources.smk (retinabench.pipeline.slurm): Slurm partition / GPU request of every rule (docs/slurm.md)


# One writer per results folder (retinabench.plan.run_lock): <results>/.retinabench.lock, seen by every checkout
# and host sharing the folder. Snakemake calls onstart only in the main process of a run that executes jobs (not in
# Slurm / remote jobs, dry runs, --lint); a second run on the folder is refused there, naming the holder.
onstart:
    try:
        P.take_run_lock(enabled=workflow.execution_settings.lock)
    except RunLockError as err:
        raise WorkflowError(str(err))
    if not P.local:  # a cluster launch: jobs and GPU-hours first (retinabench.estimate)
        from retinabench.estimate import before_launch

        before_launch(P)


onsuccess:
    P.run_lock.release()
    # What this run did not produce, and why (results/skipped_analyses.csv; retinabench.skipped). Written by the
    # skipped_analyses rule; a run of other targets prints the table of the last full run (dated).
    import sys
    from retinabench.skipped import print_table

    print_table(P.analysis.skipped_table, file=sys.stderr)


onerror:
    P.run_lock.release()
    # Tables and figures left from an earlier run that no longer match their inputs (retinabench.integrity).
    import sys
    from retinabench.integrity import report_stale

    report_stale(P.aggregate_targets(), file=sys.stderr)

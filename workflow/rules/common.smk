# Shared helpers: what the config selects, output paths, resources by encoder size class.
import os
import re

from snakemake.exceptions import WorkflowError

from retinabench.models.lock import unlocked
from retinabench.models.sizes import SIZE_CLASSES, feature_batch_size
from retinabench.workflow_plan import package_code_hash, plan

PLAN = plan(config)
REG = PLAN.registries
R = PLAN.results
STAGE = "../scripts/stage.py"
PHANTOM_DEFAULTS = {"n_patients": 80, "seed": 0, "image_size": 256}
CACHE_TAG = f"{config['image_cache']['size']}_{config['image_cache']['resize']}"


wildcard_constraints:
    dataset="[A-Za-z0-9_.+-]+",
    task="[A-Za-z0-9_.+-]+",
    encoder="[A-Za-z0-9_.+-]+",


# Per encoder size class (src/retinabench/models/sizes.py): feature batch size, host memory (MB), runtime (min) of
# a features job and its GPU request; every class fits one GPU (ViT-G/14 included, far below an H100's 80 GB).
SIZE_RESOURCES = SIZE_CLASSES

# A selected encoder whose weights are not pinned by the lock file cannot run: refuse it now (snakemake -n too),
# with the command that pins it, rather than failing in a job.
_ENCODERS_USED = set(PLAN.encoders) | set(
    ((config.get("finetune") or {}).get("encoders") or []) if (config.get("finetune") or {}).get("enabled") else [])
_UNLOCKED = unlocked(sorted(_ENCODERS_USED), REG.encoders)
if _UNLOCKED:
    raise WorkflowError("encoders without a valid lock record (" + str(REG.encoders_lock_path) + "):\n  "
                        + "\n  ".join(_UNLOCKED))


def code_hash(*parts):
    """sha256 of the package sources a rule depends on (a param: editing them reruns exactly those jobs)."""
    return package_code_hash(*parts)


def encoder_resource(key):
    return lambda wc: SIZE_RESOURCES[REG.encoder(wc.encoder)["size_class"]][key]


def feature_settings(wc):
    """The features config of one encoder's jobs, its batch size resolved from the size class (batch_size: auto)."""
    return {**config["features"], "batch_size": feature_batch_size(REG.encoder(wc.encoder), config["features"])}


def task_dataset(wc):
    return REG.task(wc.task)["dataset"]


def cache_files(dataset):
    return {"array": f"{R}/data/{dataset}/images_{CACHE_TAG}.npy",
            "index": f"{R}/data/{dataset}/images_{CACHE_TAG}.index.parquet"}


def frozen_outputs(kind):
    return [f"{R}/{kind}/frozen/{e}/{t}.parquet" for e in PLAN.encoders for t in PLAN.tasks]


def all_metrics_files():
    """Per-job metrics tables of every protocol the config runs (collect_metrics concatenates them)."""
    return frozen_outputs("metrics") + finetune_metrics_files()  # finetune_metrics_files(): finetune.smk


def all_targets():
    targets = [f"{R}/metrics.parquet", f"{R}/analysis/rank_summary.csv", f"{R}/figures/rank_distribution.png"]
    targets += [f"{R}/data/{d}/exclusions.parquet" for d in PLAN.datasets]
    # analysis_targets(): analysis.smk; reliability_targets(): reliability.smk; finetune_targets(): finetune.smk;
    # saliency_targets(): saliency.smk; compute_targets(): compute.smk
    return (targets + analysis_targets() + reliability_targets() + finetune_targets() + saliency_targets()
            + compute_targets())

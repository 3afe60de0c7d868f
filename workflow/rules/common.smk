# Shared helpers: what the config selects, output paths, resources by encoder size class.
import os
import re
import sys

import yaml
from snakemake.exceptions import WorkflowError

from retinabench.data.raw_state import RawState
from retinabench.models.sizes import SIZE_CLASSES, feature_batch_size
from retinabench.workflow_plan import (ConfigError, check_config, dataset_tasks, manifest_code_hash,
                                       package_code_hash, plan)

PLAN = plan(config)
REG = PLAN.registries
R = PLAN.results
RAW_STATES = {d: RawState(PLAN.dataset_root(d), f"{R}/data/{d}") for d in PLAN.datasets
              if not REG.dataset(d).get("generated")}
RAW_REFRESHED = set()
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



def raw_fingerprint(dataset):
    """The dataset's raw fingerprint (retinabench.data.raw_state), refreshed once per workflow start in the main
    process: a changed, added or removed raw file makes it newer than the manifest, which reruns. Generated
    datasets have none (their raw folder is an output of the phantom rule)."""
    if REG.dataset(dataset).get("generated") or not RAW_STATES[dataset].root.is_dir():
        return []  # no raw folder: Snakemake reports the manifest's missing index files, as it should
    path = RAW_STATES[dataset].fingerprint_path
    if workflow.is_main_process and dataset not in RAW_REFRESHED:
        changes = RAW_STATES[dataset].refresh()
        RAW_REFRESHED.add(dataset)
        listed = changes["changed"] + changes["added"] + changes["removed"]
        if listed and os.path.exists(f"{R}/data/{dataset}/manifest.parquet"):
            print(f"retinabench: raw data of {dataset} changed since its manifest was built: "
                  f"{len(changes['changed'])} changed, {len(changes['added'])} added, "
                  f"{len(changes['removed'])} removed (e.g. {listed[:3]}); see {path}", file=sys.stderr)
    return [str(path)]


def _intended_executor():
    """The executor this run will use (--executor / -e, else the profile's `executor`), read from the command
    line: Snakemake picks the executor only after it has parsed the Snakefile."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg in ("--executor", "-e") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--executor="):
            return arg.split("=", 1)[1]
    profile = next((argv[i + 1] for i, a in enumerate(argv) if a == "--profile" and i + 1 < len(argv)),
                   os.environ.get("SNAKEMAKE_PROFILE"))
    if profile:
        for folder in (profile, os.path.join(os.path.expanduser("~/.config/snakemake"), profile)):
            cfg = os.path.join(folder, "config.yaml")
            if os.path.isfile(cfg):
                with open(cfg) as fh:
                    return (yaml.safe_load(fh) or {}).get("executor")
    return None


# Config problems that are knowable now (fractions; a selected encoder whose weights the lock file does not pin,
# with the command that pins it; devices; class placement and knn.k on existing manifests) stop `snakemake` and
# `snakemake -n` before any job runs, all listed at once. Remote jobs re-read the Snakefile:
# they skip this (the main process checked).
if workflow.is_main_process:
    for _dataset in RAW_STATES:  # raw changes first: a dataset whose raw data changed is rebuilt, not checked
        raw_fingerprint(_dataset)
    try:
        for note in check_config(config, PLAN, local=_intended_executor() in (None, "local", "dryrun")):
            print(f"retinabench: {note}", file=sys.stderr)
    except ConfigError as err:
        raise WorkflowError(str(err))


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
    targets += [f"{R}/data/{d}/duplicates.parquet" for d in PLAN.datasets]
    if len(PLAN.datasets) > 1:  # test images of one dataset that duplicate training images of another
        targets.append(f"{R}/data/cross_dataset_duplicates.parquet")
    # analysis_targets(): analysis.smk; reliability_targets(): reliability.smk; finetune_targets(): finetune.smk;
    # saliency_targets(): saliency.smk; compute_targets(): compute.smk
    return (targets + analysis_targets() + reliability_targets() + finetune_targets() + saliency_targets()
            + compute_targets())

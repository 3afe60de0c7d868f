"""What a config selects (datasets, tasks, encoders) and where outputs go; shared by the Snakefile and the CLI."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from retinabench.registry import Registries, RegistryError
from retinabench.settings.base import DEVICE_PATTERN
from retinabench.settings.errors import ConfigError as SettingsError


GENERATED_FOLDER = "raw"  # generated datasets' raw folders, inside the results folder: <results>/raw/<root>


@dataclass
class Plan:
    results: str
    data_root: str
    registries: Registries
    datasets: list[str]
    tasks: list[str]
    encoders: list[str]

    def dataset_root(self, dataset: str) -> str:
        """A dataset's raw folder: ``<data_root>/<root>``; a generated one (the phantom) is written by the pipeline
        under ``<results>/raw/<root>``, so it follows ``results:`` wherever that points."""
        entry = self.registries.dataset(dataset)
        base = Path(self.results) / GENERATED_FOLDER if entry.get("generated") else Path(self.data_root)
        return str(base / entry["root"])

    def tasks_of(self, dataset: str) -> list[str]:
        return [t for t in self.tasks if self.registries.task(t)["dataset"] == dataset]


def plan(config: dict) -> Plan:
    """What ``config`` (a loaded config's plain data, retinabench.settings) selects."""
    reg = Registries.from_config(config)
    wanted_datasets = list(config["datasets"])
    for d in wanted_datasets:
        reg.dataset(d)
    # without a task list: every task of the datasets except a paper's label variants (data/derived.py), which a
    # config names (config/focus.yaml) since they redefine another task's label
    tasks = list(config["tasks"] or [t for t, e in reg.tasks.items()
                                     if e["dataset"] in wanted_datasets and not e.get("label_variant")])
    for t in tasks:
        if reg.task(t)["dataset"] not in wanted_datasets:
            raise RegistryError(f"task {t!r} belongs to dataset {reg.task(t)['dataset']!r}, which the config's "
                                f"datasets {wanted_datasets} do not include")
    if not tasks:
        raise RegistryError(f"the config selects no tasks (datasets {wanted_datasets})")
    encoders = list(config["encoders"])
    for e in encoders:
        reg.encoder(e)
    if not encoders:
        raise RegistryError("the config selects no encoders")
    datasets = [d for d in wanted_datasets if any(reg.task(t)["dataset"] == d for t in tasks)]
    return Plan(results=str(config["results"]), data_root=str(config["data_root"]),
                registries=reg, datasets=datasets, tasks=tasks, encoders=encoders)


class ConfigError(SettingsError):
    """Problems found before any job runs that need more than the config itself (registries, lock records,
    devices, built manifests); all of them, one per line. The config's own problems are found earlier, by
    retinabench.settings.load."""

    header = "the configuration cannot run"
    footer = ("(checks on built manifests can be left to the jobs with RETINABENCH_NO_DATA_CHECKS=1, e.g. when an "
              "adapter fix will rebuild them)")


_DEVICE = re.compile(DEVICE_PATTERN)


def device_problems(value: str, where: str, *, local: bool, gpus_per_job: int = 1) -> list[str]:
    """A device that is not a device name, or that does not exist where the jobs run.

    ``local``: jobs run on this machine, so CUDA / MPS availability and the GPU count are checked here; on a
    cluster the check is against the GPUs one job is given (``gpus_per_job``; CUDA numbers a job's GPUs from 0)."""
    m = _DEVICE.match(str(value))
    if not m:
        return [f"{where}: {value!r} is not a device (auto, cpu, cuda, cuda:N or mps)"]
    if value in ("auto", "cpu"):
        return []
    index = int(m.group(3)) if m.group(3) else 0
    if not local:
        if value.startswith("cuda") and index >= gpus_per_job:
            return [f"{where}: {value!r} does not exist in a job, which is given {gpus_per_job} GPU(s) numbered "
                    f"from 0"]
        return []
    import torch
    if value == "mps":
        return [] if torch.backends.mps.is_available() else [f"{where}: 'mps' is not available on this machine"]
    if not torch.cuda.is_available():
        return [f"{where}: {value!r} but this machine has no CUDA device (use auto or cpu, or run on a GPU node)"]
    if index >= torch.cuda.device_count():
        return [f"{where}: {value!r} but this machine has {torch.cuda.device_count()} CUDA device(s)"]
    return []


def unpinned_encoders(registries: Registries, names: list[str]) -> list[str]:
    """Selected encoders whose weights the lock file does not pin (retinabench.registry.lockfile)."""
    from retinabench.registry.lockfile import unlocked
    lines = unlocked(sorted(set(names)), registries.encoders)
    if not lines:
        return []
    locks = ", ".join(sorted({str(registries.lock_path(n)) for n in names}))
    return [f"encoders without a valid lock record ({locks}):\n      "
            + "\n      ".join(lines)]


def dataset_tasks(registries: Registries, dataset: str) -> list[dict]:
    """Every registry task of a dataset: its one split assignment keeps all their classes in every split."""
    return sorted((t for t in registries.tasks.values() if t["dataset"] == dataset), key=lambda t: t["name"])


def data_problems(config: dict, plan_: Plan) -> tuple[list[str], list[str]]:
    """Checks that need a dataset's manifest (class placement, knn.k); datasets without one are noted only.

    Uses the same functions as the split jobs on the manifest (and duplicate table) already built."""
    from retinabench.data.sizing import sizing_problems
    from retinabench.schemas import read_table
    knn_k = config["knn"]["k"] if "knn" in config["protocols"] else None
    problems, notes, unbuilt = [], [], []
    for dataset in plan_.datasets:
        manifest_path = Path(plan_.results) / "data" / dataset / "manifest.parquet"
        if not manifest_path.is_file():
            unbuilt.append(dataset)
            continue
        entry = plan_.registries.dataset(dataset)
        inputs = [Path(plan_.dataset_root(dataset)) / f for f in entry["index_files"]]
        inputs.append(manifest_path.with_name("raw_fingerprint.json"))
        newer = [str(f) for f in inputs if f.is_file() and f.stat().st_mtime > manifest_path.stat().st_mtime]
        if newer:  # the manifest will be rebuilt: its old content must not block the run that fixes it
            notes.append(f"{dataset}: the manifest is older than {newer[0]}, so class placement and knn.k are "
                         f"checked by its split and frozen jobs")
            continue
        manifest = read_table(manifest_path, "manifest")
        dup_path = manifest_path.with_name("duplicates.parquet")
        dups = read_table(dup_path, "duplicates") if dup_path.is_file() else None
        problems += sizing_problems(manifest, dataset, dataset_tasks(plan_.registries, dataset),
                                    [plan_.registries.task(t) for t in plan_.tasks_of(dataset)], split=config["split"],
                                    knn_k=knn_k, regimes=config["regimes"], duplicates=dups)
    if unbuilt:
        notes.append(f"no manifest yet for {', '.join(unbuilt)}: class placement and knn.k are checked by their "
                     f"split and frozen jobs")
    return problems, notes


def check_config(config: dict, plan_: Plan, *, local: bool = True, data: bool = True) -> list[str]:
    """Every problem of a (loaded: retinabench.settings) configuration that is knowable before jobs run but needs
    more than the config itself — unpinned encoders, devices missing where the jobs run, class placement and
    knn.k on built manifests — raised at once as a ConfigError; returns notes on what could not be checked yet."""
    problems: list[str] = []
    finetune = config["finetune"]
    encoders = list(plan_.encoders)
    if finetune["enabled"]:
        encoders += [e for e in (finetune["encoders"] or []) if e not in encoders]
    problems += unpinned_encoders(plan_.registries, encoders)
    problems += device_problems(config["features"]["device"], "features.device", local=local)
    if finetune["enabled"]:
        problems += device_problems(finetune["device"], "finetune.device", local=local)
    notes: list[str] = []
    if os.environ.get("RETINABENCH_NO_DATA_CHECKS"):
        data = False
        notes.append("RETINABENCH_NO_DATA_CHECKS is set: class placement and knn.k are checked by the jobs only")
    if data and not problems:
        more, notes = data_problems(config, plan_)
        problems += more
    if problems:
        raise ConfigError(problems)
    return notes

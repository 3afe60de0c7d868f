"""What a config selects (datasets, tasks, encoders) and where outputs go; shared by the Snakefile and the CLI."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from retinabench.registry import Registries, RegistryError


@dataclass
class Plan:
    results: str
    data_root: str
    registries: Registries
    datasets: list[str]
    tasks: list[str]
    encoders: list[str]

    def dataset_root(self, dataset: str) -> str:
        return str(Path(self.data_root) / self.registries.dataset(dataset)["root"])

    def tasks_of(self, dataset: str) -> list[str]:
        return [t for t in self.tasks if self.registries.task(t)["dataset"] == dataset]


def plan(config: dict) -> Plan:
    reg = Registries.from_config(config)
    wanted_datasets = list(config.get("datasets") or [])
    for d in wanted_datasets:
        reg.dataset(d)
    tasks = list(config.get("tasks") or [t for t, e in reg.tasks.items() if e["dataset"] in wanted_datasets])
    for t in tasks:
        if reg.task(t)["dataset"] not in wanted_datasets:
            raise RegistryError(f"task {t!r} belongs to dataset {reg.task(t)['dataset']!r}, which the config's "
                                f"datasets {wanted_datasets} do not include")
    if not tasks:
        raise RegistryError(f"the config selects no tasks (datasets {wanted_datasets})")
    encoders = list(config.get("encoders") or [])
    for e in encoders:
        reg.encoder(e)
    if not encoders:
        raise RegistryError("the config selects no encoders")
    datasets = [d for d in wanted_datasets if any(reg.task(t)["dataset"] == d for t in tasks)]
    return Plan(results=str(config.get("results", "results")), data_root=str(config["data_root"]),
                registries=reg, datasets=datasets, tasks=tasks, encoders=encoders)


@lru_cache(maxsize=None)
def package_code_hash(*parts: str) -> str:
    """Short sha256 over the source files of package parts (``"protocols"``, ``"data/splits.py"``, ...)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for part in parts:
        target = root / part
        if not target.exists():
            raise FileNotFoundError(f"package_code_hash: {target} does not exist")
        files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
        for f in files:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]

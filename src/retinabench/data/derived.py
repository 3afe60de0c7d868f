"""Derived and harmonised task labels, defined as registry data (config/tasks.yaml), never as code per dataset.

A task entry may carry

* ``derive``: ``{class: [source values]}`` — the task's classes computed from the manifest column ``label``
  (e.g. any DR: ``{"no": [none], "yes": [npdr, pdr]}`` on ``dr3``). Every source value must map to exactly
  one class; a missing source value stays missing (the adapter's ``label:<column>`` exclusion covers it).
* ``harmonised``: the id of a harmonised task (``any_dr``, ``referable_dr``, ``gon``). Tasks sharing a
  harmonised id and a modality are the same question asked of different datasets: the transfer protocol trains
  on one and evaluates on the others, and the Shift score compares them.

The harmonised catalogue (definitions, and the datasets that cannot support a task with the reason) lives in
the config's ``reliability.harmonised`` section; see docs/reliability.md.
"""
from __future__ import annotations

from collections import defaultdict

import pandas as pd


class DeriveError(ValueError):
    pass


def derive_map(task: dict) -> dict[str, str] | None:
    """``source value -> class`` of a task with ``derive`` (None without); checks the mapping is a function
    onto the task's classes."""
    spec = task.get("derive")
    if spec is None:
        return None
    name = task.get("name", "?")
    if not isinstance(spec, dict) or not spec:
        raise DeriveError(f"task {name!r}: derive must be a non-empty mapping class -> [source values]")
    classes = list(task["classes"])
    unknown = [c for c in spec if c not in classes]
    if unknown:
        raise DeriveError(f"task {name!r}: derive names classes {unknown} that are not in classes {classes}")
    missing = [c for c in classes if c not in spec]
    if missing:
        raise DeriveError(f"task {name!r}: derive gives no source values for classes {missing}")
    out: dict[str, str] = {}
    for cls, values in spec.items():
        if isinstance(values, str) or not values:
            raise DeriveError(f"task {name!r}: derive[{cls!r}] must be a non-empty list of source values")
        for v in values:
            v = str(v)
            if v in out:
                raise DeriveError(f"task {name!r}: source value {v!r} maps to both {out[v]!r} and {cls!r}")
            out[v] = cls
    return out


def apply_derive(values: pd.Series, task: dict) -> pd.Series:
    """Task classes for the source ``values`` (missing stays missing); unmapped source values are an error."""
    mapping = derive_map(task)
    if mapping is None:
        return values
    present = values.dropna().astype(str)
    unmapped = sorted(set(present) - set(mapping))
    if unmapped:
        raise DeriveError(f"task {task.get('name', '?')!r}: {task['label']} values {unmapped} have no class in "
                          f"derive {task['derive']}")
    return values.map(lambda v: mapping[str(v)] if pd.notna(v) else pd.NA).astype("string")


def harmonised_groups(tasks: dict[str, dict]) -> dict[str, list[str]]:
    """``"<harmonised>_<modality>" -> [task names]`` for tasks with a harmonised id, in the order given.

    Tasks of one group must have the same classes (they are the same question); two tasks of one dataset in
    one group would make 'other dataset' ambiguous, so that is an error too.
    """
    groups: dict[str, list[str]] = defaultdict(list)
    for name, task in tasks.items():
        h = task.get("harmonised")
        if h:
            groups[f"{h}_{task['modality']}"].append(name)
    for group, names in groups.items():
        classes = {tuple(tasks[n]["classes"]) for n in names}
        if len(classes) > 1:
            raise DeriveError(f"harmonised group {group!r}: tasks {names} have different classes {sorted(classes)}")
        datasets = [tasks[n]["dataset"] for n in names]
        dupes = sorted({d for d in datasets if datasets.count(d) > 1})
        if dupes:
            raise DeriveError(f"harmonised group {group!r}: dataset(s) {dupes} have several tasks {names}")
    return dict(groups)


def transfer_groups(tasks: dict[str, dict]) -> dict[str, list[str]]:
    """Harmonised groups with at least two datasets (the only ones where out-of-distribution transfer exists)."""
    return {g: names for g, names in harmonised_groups(tasks).items() if len(names) >= 2}


def unsupported_harmonised(catalogue: dict[str, dict], datasets: list[str], tasks: dict[str, dict]
                           ) -> pd.DataFrame:
    """Coverage rows for harmonised tasks a selected dataset does not take part in, with the recorded reason.

    A dataset with no task of a harmonised id and no recorded reason gets 'no task entry in the task registry',
    so a missing definition is visible rather than silent.
    """
    rows = []
    for h, entry in catalogue.items():
        reasons = entry.get("not_supported") or {}
        for d in datasets:
            has = [n for n, t in tasks.items() if t.get("harmonised") == h and t["dataset"] == d]
            if has:
                if d in reasons:
                    raise DeriveError(f"harmonised task {h!r}: dataset {d!r} has tasks {has} but is also listed "
                                      f"as not supported ({reasons[d]!r})")
                continue
            rows.append({"dataset": d, "task": h, "reason": reasons.get(d, "no task entry in the task registry")})
    return pd.DataFrame(rows, columns=["dataset", "task", "reason"])

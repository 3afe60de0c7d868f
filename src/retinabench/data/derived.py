"""Derived and harmonised task labels, defined as registry data (config/tasks.yaml), never as code per dataset.

A task entry may carry

* ``derive``: ``{class: [source values]}`` — the task's classes computed from the manifest column ``label``
  (e.g. any DR: ``{"no": [none], "yes": [npdr, pdr]}`` on ``dr3``). Every source value must map to exactly
  one class; a missing source value stays missing (the adapter's ``label:<column>`` exclusion covers it).
  Or ``{sources: [...], rules: [...]}`` combining several manifest columns (:func:`derive_rules`), e.g. FOCUS's
  referable DR: ICDR >= 2 **or** macular edema.
* ``harmonised``: the id of a harmonised task (``any_dr``, ``referable_dr``, ``gon``). Tasks sharing a
  harmonised id and a modality are the same question asked of different datasets: the transfer protocol trains
  on one and evaluates on the others, and the Shift score compares them.

* ``label_variant``: a paper's label definition (``focus``) of a question we label otherwise or not at all, as
  its own task entry (one home per definition): ``variant_of`` names our entry of the question when there is one
  (a config selects one of the two: both in one harmonised group is an error), ``approximation`` says how the
  paper's label only approximates the definition (e.g. RFMiD's referable DR from an edema flag alone). Variants
  are selected by name only (config/focus.yaml), never by a dataset's default task list; the approximation goes
  into the task's outputs (its split's provenance, the reliability coverage table: :func:`label_variants`).

The harmonised catalogue (definitions, and the datasets that cannot support a task with the reason) lives in
the config's ``reliability.harmonised`` section; see docs/reliability.md.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from typing import TypeGuard

import pandas as pd


class DeriveError(ValueError):
    pass


def derive_map(task: dict) -> dict[str, str] | None:
    """``source value -> class`` of a task with a *mapping* ``derive`` (None without one, or for a rules
    ``derive``); checks the mapping is a function onto the task's classes."""
    spec = task.get("derive")
    if spec is None or is_rules(spec):
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


def is_rules(spec: object) -> TypeGuard[dict]:
    return isinstance(spec, dict) and "rules" in spec


def derive_rules(task: dict) -> dict | None:
    """The checked rules ``derive`` of a task (None without one)::

        derive:
          sources: [dr5, dme]          # manifest columns read; the task's `label` must be one of them
          rules:                       # first matching rule wins
            - {class: "yes", any: {dr5: [moderate, severe, pdr], dme: ["yes"]}}
            - {class: "no", all: {dr5: [none, mild], dme: ["no"]}}
          unlabelled: {dr5: [...]}     # values that, alone, decide nothing (listed so a typo cannot hide)

    ``any`` matches when one listed column holds one of its values, ``all`` when every listed column does (a
    missing value never matches). A row no rule matches has no label for the task: it leaves the task and is
    counted (e.g. mild DR with unknown macular edema is neither referable nor known non-referable).
    """
    spec = task.get("derive")
    if not is_rules(spec):
        return None
    name = task.get("name", "?")
    sources = list(spec.get("sources") or [])
    if task["label"] not in sources:
        raise DeriveError(f"task {name!r}: derive.sources {sources} must include the task's label column "
                          f"{task['label']!r} (rows without it are the task's unlabelled rows)")
    classes = list(task["classes"])
    produced = set()
    for i, rule in enumerate(spec["rules"]):
        kinds = [k for k in ("any", "all") if k in rule]
        if rule.get("class") not in classes or len(kinds) != 1:
            raise DeriveError(f"task {name!r}: derive rule {i} must have a `class` in {classes} and exactly one "
                              f"of `any` / `all`; got {rule}")
        cond = rule[kinds[0]]
        bad = [c for c in cond if c not in sources]
        if bad or not cond:
            raise DeriveError(f"task {name!r}: derive rule {i} reads columns {bad or '(none)'} not in sources "
                              f"{sources}")
        for col, values in cond.items():
            if isinstance(values, str) or not values:
                raise DeriveError(f"task {name!r}: derive rule {i}: {col} must list values")
        produced.add(rule["class"])
    never = [c for c in classes if c not in produced]
    if never:
        raise DeriveError(f"task {name!r}: no derive rule produces classes {never}")
    bad = [c for c in (spec.get("unlabelled") or {}) if c not in sources]
    if bad:
        raise DeriveError(f"task {name!r}: derive.unlabelled names columns {bad} not in sources {sources}")
    return spec


def _mentioned(spec: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for rule in spec["rules"]:
        for col, values in rule.get("any", rule.get("all", {})).items():
            out[col] |= {str(v) for v in values}
    for col, values in (spec.get("unlabelled") or {}).items():
        out[col] |= {str(v) for v in values}
    return out


def apply_derive(rows: pd.DataFrame, task: dict) -> pd.DataFrame:
    """``rows`` (a task's labelled manifest rows) with the task's ``label`` column holding its classes.

    Mapping ``derive``: every source value must map to a class (missing stays missing). Rules ``derive``:
    several source columns combine (e.g. referable DR = ICDR >= 2 or macular edema); rows no rule matches
    leave the task and their count is printed. Any source value a rule never mentions is an error (typo
    guard). The manifest itself is never changed; without ``derive`` the rows come back as they are.
    """
    spec = task.get("derive")
    if spec is None:
        return rows
    label = task["label"]
    name = task.get("name", "?")
    if not is_rules(spec):
        mapping = derive_map(task)
        assert mapping is not None  # a mapping derive (neither None nor rules)
        values = rows[label]
        present = values.dropna().astype(str)
        unmapped = sorted(set(present) - set(mapping))
        if unmapped:
            raise DeriveError(f"task {name!r}: {label} values {unmapped} have no class in derive {spec}")
        return rows.assign(**{label: values.map(lambda v: mapping[str(v)] if pd.notna(v) else pd.NA)
                              .astype("string")})
    spec = derive_rules(task)
    assert spec is not None  # a rules derive
    missing_cols = [c for c in spec["sources"] if c not in rows.columns]
    if missing_cols:
        raise DeriveError(f"task {name!r}: derive.sources {missing_cols} are not manifest columns of "
                          f"{task.get('dataset', '?')!r}")
    mentioned = _mentioned(spec)
    for col in spec["sources"]:
        present = set(rows[col].dropna().astype(str))
        stray = sorted(present - mentioned.get(col, set()))
        if stray:
            raise DeriveError(f"task {name!r}: {col} values {stray} appear in no derive rule and not in "
                              f"derive.unlabelled; say what they mean")
    out = pd.Series(pd.NA, index=rows.index, dtype="object")
    decided = pd.Series(False, index=rows.index)
    for rule in spec["rules"]:
        cond = rule.get("any", rule.get("all"))
        hits = [rows[c].astype("string").isin([str(v) for v in vals]).fillna(False) for c, vals in cond.items()]
        match = pd.concat(hits, axis=1)
        match = match.any(axis=1) if "any" in rule else match.all(axis=1)
        new = match & ~decided
        out[new] = rule["class"]
        decided |= new
    n_undecided = int((~decided).sum())
    if n_undecided:
        print(f"task {name!r}: {n_undecided} of {len(rows)} labelled rows match no derive rule (e.g. a source "
              f"value in derive.unlabelled or an unknown secondary column) and leave the task", file=sys.stderr)
    return rows.loc[decided].assign(**{label: out[decided].astype("string")})


def derive_sources(task: dict) -> list[str]:
    """Manifest columns a task reads (its label, plus a rules derive's other sources)."""
    spec = task.get("derive")
    if is_rules(spec):
        return list(dict.fromkeys([task["label"], *spec.get("sources", [])]))
    return [task["label"]]


def derive_values(task: dict) -> dict[str, set[str]]:
    """``source column -> values the derive mentions`` (registry checks against an adapter's codes)."""
    spec = task.get("derive")
    if spec is None:
        return {}
    if is_rules(spec):
        return dict(_mentioned(spec))
    return {task["label"]: set(derive_map(task) or {})}


def harmonised_groups(tasks: dict[str, dict]) -> dict[str, list[str]]:
    """``"<harmonised>_<modality>" -> [task names]`` for tasks with a harmonised id, in the order given.

    Tasks of one group must have the same classes (they are the same question); two tasks of one dataset in
    one group would make 'other dataset' ambiguous, so that is an error too.
    """
    label_variants(tasks)  # a variant's declaration is checked wherever groups are formed
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


LABEL_VARIANTS = ("focus",)
VARIANT_COLUMNS = ["task", "dataset", "label_variant", "variant_of", "approximation"]


def label_variants(tasks: dict[str, dict]) -> pd.DataFrame:
    """The paper label variants among ``tasks`` (one row each: VARIANT_COLUMNS), checked: a known variant name,
    and ``variant_of`` (when selected too) on the same dataset with the same classes and harmonised id."""
    rows = []
    for name, task in tasks.items():
        variant = task.get("label_variant")
        if variant is None:
            for key in ("variant_of", "approximation"):
                if task.get(key):
                    raise DeriveError(f"task {name!r}: `{key}` belongs to a label variant; set label_variant")
            continue
        if variant not in LABEL_VARIANTS:
            raise DeriveError(f"task {name!r}: label_variant {variant!r} unknown (one of {list(LABEL_VARIANTS)})")
        base = task.get("variant_of")
        if base in tasks:
            b = tasks[base]
            same = {k: (b.get(k), task.get(k)) for k in ("dataset", "classes", "harmonised")
                    if b.get(k) != task.get(k)}
            if same:
                raise DeriveError(f"task {name!r} is the {variant} variant of {base!r} but differs in {same}")
        rows.append({"task": name, "dataset": task["dataset"], "label_variant": variant, "variant_of": base,
                     "approximation": task.get("approximation")})
    return pd.DataFrame(rows, columns=VARIANT_COLUMNS)

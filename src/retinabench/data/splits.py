"""One patient-disjoint, duplicate-aware train/val/test assignment per dataset; per-task views of it.

**Groups** (retinabench.data.split_groups): connected components of patient id ∪ sha256 ∪ duplicate cluster,
each placed whole. Four methods (``split.method``) place them:

**hash** (config/config.yaml): each group by a seeded hash of its id alone, ``u = sha256(salt:seed:group id)``
as a number in [0, 1), train if ``u < 0.70``, val if ``u < 0.85``, test otherwise (the configured fractions).
Removing a patient moves no image of any other patient; adding patients moves none of the existing ones (only
groups that new duplicate links merge can move, together). Because every group is placed independently, the
realised fractions are binomial, not exact: the image fraction of split s has standard deviation
``sd = sqrt(p_s (1 - p_s) Σ n_g²) / Σ n_g`` (n_g: images of group g), and :func:`assign_splits` fails when a split
is more than :data:`TOLERANCE_SD` = 4 sd from its target (probability < 1e-4 per split). On tvhl (2,661 images in
1,755 groups) the tolerance is ±5.8 / ±4.5 points (realised: 71.9 / 13.7 / 14.4 %).
**ranked**: groups in hash order, cut where the cumulative image count crosses 70 % and 85 %, so image fractions
are exact to within one group, and a removed or added group moves the groups it shifts across a cut.
**stratified_grouped** (config/ocularbench.yaml; retinabench.data.split_stratified): the same cut within each
label stratum of groups, with a seeded random start per stratum, so label proportions match across splits; an
edit moves a few groups next to the cuts of one stratum. **file** (retinabench.data.split_file): a study's
published split files, checked for leakage. Every computed method then requires every task's classes in every
split:

**Class presence.** For every task of the dataset (all registry tasks, so the assignment does not depend on which
tasks a config selects) and every class with at least three groups, a split without any group of that class gets
one: the group of that class whose ``u`` is closest to the split's interval, taken from a split that keeps at
least one of the class (and, where possible, without emptying another task's class there). Such groups have
``placed_by = "class presence"``. A class held by fewer than three groups cannot be in all three splits: the task's
view fails with that reason (and ``snakemake -n`` refuses the task when the manifest exists).

**Per-task views** (:func:`task_split`): the task's rows (its modality, a valid label) with the dataset's split,
the class index ``y`` and the ``balanced`` variant (each class undersampled to the rarest class's count per split,
keeping the images with the smallest seeded hash of their id, so it is stable too) for the paper's regimes
u-u / u-b / b-b / b-u (first letter: training data, second: test data).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from retinabench.data.reports import exclusion_lines
from retinabench.data.split_groups import (SplitError, check_assignment, check_fractions, split_groups,  # noqa: F401
                                           task_rows)
from retinabench.data.split_file import LEAK_ALLOWED
from retinabench.data.split_stratified import label_deviation, label_profiles, strata, stratified_positions
from retinabench.hashing import unit_hash
from retinabench.schemas import DATASET_SPLIT, SPLIT, SPLITS
from retinabench.settings.data import SplitSettings

SALT = "retinabench-split-v1"
TOLERANCE_SD = 4.0
# The library's defaults are the config's (`split:`, retinabench.settings), declared there once.
_SPLIT = SplitSettings()
DEFAULT_FRACTIONS = _SPLIT.fractions.plain()
PRESENCE = "class presence"
METHODS = ("hash", "ranked", "stratified_grouped", "file")


def require_images(manifest: pd.DataFrame, task: dict, exclusions: pd.DataFrame | None = None) -> None:
    """A task whose modality has no image left in the manifest is an error naming the task, the modality and the
    dataset's image exclusions by reason (what removed them), not a complaint about split fractions."""
    if (manifest["modality"] == task["modality"]).any():
        return
    present = ", ".join(f"{m} {n}" for m, n in manifest["modality"].value_counts().sort_index().items()) or "none"
    kinds = exclusion_lines(exclusions, scopes=("image",), indent="  ") if exclusions is not None else []
    why = ("the dataset's image exclusions by reason:\n" + "\n".join(kinds)) if kinds else \
        "the exclusions table records no image exclusions (does the adapter read this modality at all?)"
    raise SplitError(f"task {task['name']!r}: dataset {task['dataset']!r} has no {task['modality']} images left "
                     f"after exclusions (manifest images by modality: {present}); {why}\nFix: the manifest job's log "
                     f"shows the same counts; restore the excluded images (or the rows naming them), or drop the "
                     f"task from the config")


def _requirements(manifest: pd.DataFrame, groups: pd.DataFrame, tasks: list[dict]) -> dict[tuple[str, str], list]:
    """(task, class) -> sorted group ids holding that class in the task's rows."""
    gid = dict(zip(groups["image_id"], groups["group_id"]))
    reqs: dict[tuple[str, str], list] = {}
    for task in sorted(tasks, key=lambda t: t["name"]):
        rows, _ = task_rows(manifest, task)
        g = rows["image_id"].map(gid)
        for cls in task["classes"]:
            reqs[(task["name"], cls)] = sorted(set(g[rows[task["label"]] == cls]))
    return reqs


def _interval_distance(u: float, lo: float, hi: float) -> float:
    return 0.0 if lo <= u < hi else min(abs(u - lo), abs(u - hi))


def _ensure_presence(split_of: dict, u: dict, reqs: dict, bounds: dict) -> tuple[list[dict], list[dict]]:
    """Move the fewest groups so every feasible (task, class) has a group in every split (see module doc)."""
    member: dict[str, list] = {}
    for r, gs in reqs.items():
        for g in gs:
            member.setdefault(g, []).append(r)
    infeasible = [{"task": t, "class": c, "groups": len(gs)} for (t, c), gs in reqs.items() if len(gs) < len(SPLITS)]
    feasible = {r: gs for r, gs in reqs.items() if len(gs) >= len(SPLITS)}
    moves: list[dict] = []
    moved: set = set()

    def count(r, s):
        return sum(split_of[g] == s for g in feasible[r])

    for _ in range(len(SPLITS) * 4):
        changed = False
        for r in sorted(feasible):
            gs = feasible[r]
            for s in SPLITS:
                if any(split_of[g] == s for g in gs):
                    continue
                cands = [g for g in gs if g not in moved and count(r, split_of[g]) >= 2]
                safe = [g for g in cands
                        if all(count(q, split_of[g]) >= 2 for q in member[g] if q in feasible and q != r)]
                pool = safe or cands
                if not pool:
                    raise SplitError(f"task {r[0]!r}: class {r[1]!r} ({len(gs)} groups) cannot be placed in {s}")
                g = min(pool, key=lambda x: (_interval_distance(u[x], *bounds[s]), x))
                moves.append({"group_id": g, "from": split_of[g], "to": s, "task": r[0], "class": r[1]})
                split_of[g] = s
                moved.add(g)
                changed = True
        if not changed:
            break
    missing = [(r, s) for r in feasible for s in SPLITS if count(r, s) == 0]
    if missing:
        (t, c), s = missing[0]
        raise SplitError(f"task {t!r}: class {c!r} could not be placed in {s} ({len(missing)} such gaps)")
    return moves, infeasible


def fraction_tolerance(group_sizes: np.ndarray, fractions: dict[str, float]) -> dict[str, float]:
    """``TOLERANCE_SD`` standard deviations of each split's image fraction under independent group placement."""
    n = float(group_sizes.sum())
    conc = math.sqrt(float((group_sizes.astype(float) ** 2).sum())) / n if n else 1.0
    return {s: TOLERANCE_SD * math.sqrt(p * (1 - p)) * conc for s, p in fractions.items()}


def assign_splits(manifest: pd.DataFrame, tasks: list[dict], *, fractions: dict[str, float] | None = None,
                  seed: int = _SPLIT.seed, duplicates: pd.DataFrame | None = None,
                  near: bool = _SPLIT.group_near_duplicates, method: str = _SPLIT.method,
                  dataset: str | None = None, file: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """The dataset's split assignment (schema ``dataset_split``) and its report (groups, merges, fractions,
    tolerance, class-presence moves, label deviation per task). See the module doc; ``file``: the ``split.file``
    section, read by ``method: file`` (retinabench.data.split_file)."""
    fractions = check_fractions(fractions or DEFAULT_FRACTIONS)
    dataset = dataset or (str(manifest["dataset"].iloc[0]) if len(manifest) else "?")
    if not len(manifest):
        raise SplitError(f"dataset {dataset!r}: the manifest has no images: every raw row was excluded (the "
                         f"manifest job's log and exclusions.parquet count them by reason)")
    groups, report = split_groups(manifest, duplicates, near=near)
    if groups["group_id"].nunique() < len(SPLITS):
        raise SplitError(f"dataset {dataset!r}: {groups['group_id'].nunique()} groups (patients ∪ duplicate "
                         f"clusters), fewer than the {len(SPLITS)} splits")
    if method not in METHODS:
        raise SplitError(f"split method must be one of {METHODS}, got {method!r}")
    if method == "file":
        from retinabench.data.split_file import assign_from_file
        out, report = assign_from_file(manifest, groups, report, file or {}, dataset=dataset, tasks=tasks,
                                       fractions=fractions, seed=seed)
        report["label_deviation"] = label_deviation(manifest, out[out["split"].isin(SPLITS)], tasks)
        return out[DATASET_SPLIT.names].reset_index(drop=True), report
    gids = sorted(groups["group_id"].unique())
    u = {g: unit_hash(SALT, seed, g) for g in gids}
    n_strata = None
    if method == "stratified_grouped":
        stratum_of = strata(label_profiles(manifest, groups, tasks))
        n_strata = len(set(stratum_of.values()))
        pos = stratified_positions(groups["group_id"].value_counts(), stratum_of, u, seed, SALT)
    elif method == "ranked":  # position = midpoint of the group's share of the images, in hash order
        size = groups["group_id"].value_counts()
        order = sorted(gids, key=lambda g: (u[g], g))
        cum = np.cumsum([size[g] for g in order]) / len(groups)
        pos = dict(zip(order, cum - np.array([size[g] for g in order]) / (2 * len(groups))))
    else:
        pos = u
    edges = np.cumsum([fractions[s] for s in SPLITS])
    bounds = {s: (0.0 if k == 0 else float(edges[k - 1]), 1.0 if k == len(SPLITS) - 1 else float(edges[k]))
              for k, s in enumerate(SPLITS)}
    split_of = {g: next(s for s in SPLITS if pos[g] < bounds[s][1]) for g in gids}
    u = pos  # class-presence moves take the group closest to the missing split's interval in this position
    moves, infeasible = _ensure_presence(split_of, u, _requirements(manifest, groups, tasks), bounds)
    moved = {m["group_id"] for m in moves}
    out = groups.assign(dataset=dataset, split=groups["group_id"].map(split_of),
                        placed_by=np.where(groups["group_id"].isin(moved), PRESENCE,
                                           "stratified" if method == "stratified_grouped" else "hash"))
    out["patient_id"] = out["patient_id"].astype(object).where(out["patient_id"].notna(), None)
    sizes = out["group_id"].value_counts().to_numpy()
    tol = fraction_tolerance(sizes, fractions)
    realised = out["split"].value_counts(normalize=True).reindex(list(SPLITS), fill_value=0.0)
    report |= {"method": method, "seed": seed, "fractions": fractions,
               "realised_fractions": {s: round(float(realised[s]), 4) for s in SPLITS},
               "group_fractions": {s: round(sum(v == s for v in split_of.values()) / len(gids), 4) for s in SPLITS},
               "tolerance": {s: round(t, 4) for s, t in tol.items()},
               "class_presence_moves": moves, "classes_too_rare": infeasible,
               "label_deviation": label_deviation(manifest, out, tasks)}
    if n_strata is not None:
        report["strata"] = n_strata
    if method == "ranked":  # exact up to the groups straddling the cuts
        tol = {s: float(max(sizes)) * 2 / len(out) for s in SPLITS}
    moved_share = float(out["placed_by"].eq(PRESENCE).mean())  # class-presence moves widen it by what they moved
    tol = {s: t + moved_share for s, t in tol.items()}
    report["tolerance"] = {s: round(t, 4) for s, t in tol.items()}
    off = [s for s in SPLITS if abs(realised[s] - fractions[s]) > tol[s]]
    if off:
        s = off[0]
        raise SplitError(f"dataset {dataset!r}: {s} holds {realised[s]:.1%} of the images, target {fractions[s]:.0%} "
                         f"± {tol[s]:.1%} ({TOLERANCE_SD:g} sd of independent group placement); largest group "
                         f"{report['largest_group_images']} images. Check the duplicate clusters and patient ids")
    check_assignment(out, manifest)
    return out[DATASET_SPLIT.names].reset_index(drop=True), report


def _balanced_mask(df: pd.DataFrame, seed: int) -> np.ndarray:
    """Per split, each class undersampled to the rarest class's count: the images with the smallest seeded hash."""
    h = df["image_id"].map(lambda i: unit_hash(SALT, "balanced", seed, i)).to_numpy()
    mask = np.zeros(len(df), dtype=bool)
    for s in SPLITS:
        part = df["split"].to_numpy() == s
        counts = df.loc[part, "y"].value_counts()
        if counts.empty:
            continue
        n_min = counts.min()
        for cls in counts.index:
            idx = np.flatnonzero(part & (df["y"].to_numpy() == cls))
            mask[idx[np.argsort(h[idx], kind="stable")[:n_min]]] = True
    return mask


def task_split(manifest: pd.DataFrame, assignment: pd.DataFrame, task: dict, *, seed: int = _SPLIT.seed,
               exclusions: pd.DataFrame | None = None) -> pd.DataFrame:
    """The task's view of the dataset assignment (schema ``split``), checked (see :func:`check_split`)."""
    require_images(manifest, task, exclusions)
    rows, _ = task_rows(manifest, task)
    rows = rows.sort_values("image_id", kind="stable").reset_index(drop=True)
    a = assignment.set_index("image_id")
    missing = rows.loc[~rows["image_id"].isin(a.index), "image_id"]
    if len(missing):
        raise SplitError(f"task {task['name']!r}: {len(missing)} images have no split assignment, e.g. "
                         f"{missing.iloc[0]} (is the split older than the manifest?)")
    rows = rows[a.loc[rows["image_id"], "split"].isin(SPLITS).to_numpy()].reset_index(drop=True)  # file: excluded
    classes = list(task["classes"])
    y = rows[task["label"]].map({c: i for i, c in enumerate(classes)}).to_numpy()
    group = a.loc[rows["image_id"], "group_id"].to_numpy()
    pid = rows["patient_id"].astype("string").to_numpy()
    out = pd.DataFrame({"image_id": rows["image_id"], "patient_id": np.where(pd.isna(pid), group, pid).astype(str),
                        "dataset": task["dataset"], "task": task["name"], "label": rows[task["label"]].astype(str),
                        "y": y.astype("int64"), "split": a.loc[rows["image_id"], "split"].to_numpy()})
    out["balanced"] = _balanced_mask(out, seed)
    allowed = a.loc[rows["image_id"], "placed_by"].eq(LEAK_ALLOWED).to_numpy()  # split.file's recorded leaks
    check_split(out, task, groups=group, sha256=rows["sha256"].to_numpy() if "sha256" in rows else None,
                allowed=allowed)
    return out[SPLIT.names]


def make_split(manifest: pd.DataFrame, task: dict, *, fractions: dict[str, float] | None = None,
               seed: int = _SPLIT.seed, duplicates: pd.DataFrame | None = None,
               method: str = _SPLIT.method) -> pd.DataFrame:
    """One task's split computed from its manifest alone (the workflow uses one assignment per dataset)."""
    assignment, _ = assign_splits(manifest, [task], fractions=fractions, seed=seed, duplicates=duplicates,
                                  method=method, dataset=task["dataset"])
    return task_split(manifest, assignment, task, seed=seed)


def check_split(df: pd.DataFrame, task: dict, *, groups=None, sha256=None, allowed=None) -> None:
    """Fail loudly on a patient, group or identical image in two splits, a missing class, or an unbalanced
    'balanced' variant. ``allowed``: a mask of rows exempt from the leakage checks (a split file's leaks that the
    config allows with their count, retinabench.data.split_file)."""
    where = f"split of task {task['name']!r}"
    keep = ~np.asarray(allowed, dtype=bool) if allowed is not None else np.ones(len(df), dtype=bool)
    for values, what in ((df["patient_id"].to_numpy(), "patient"), (groups, "group"),
                         (sha256, "identical image (sha256)")):
        if values is None:
            continue
        per = pd.Series(df["split"].to_numpy()[keep]).groupby(np.asarray(values)[keep]).nunique()
        leaked = per[per > 1]
        if len(leaked):
            key = leaked.index[0]
            seen = sorted(df.loc[np.asarray(values) == key, "split"].unique())
            raise SplitError(f"{where}: {what} {key} appears in {seen} ({len(leaked)} {what}s in several splits)")
    if df["image_id"].duplicated().any():
        raise SplitError(f"{where}: duplicate image_id {df.loc[df['image_id'].duplicated(), 'image_id'].iloc[0]}")
    counts = df.groupby(["split", "y"]).size().unstack(fill_value=0).reindex(index=list(SPLITS), fill_value=0)
    counts = counts.reindex(columns=range(len(task["classes"])), fill_value=0)
    for s in SPLITS:
        for k, cls in enumerate(task["classes"]):
            if counts.loc[s, k] == 0:
                per = ", ".join(f"{t} {counts.loc[t, k]}" for t in SPLITS)
                groups_of = df.loc[df["y"] == k, "patient_id"].nunique() if groups is None else \
                    len(set(np.asarray(groups)[df["y"].to_numpy() == k]))
                raise SplitError(f"{where}: class {cls!r} has no images in {s} ({per}; {groups_of} patient "
                                 f"groups hold it, {len(SPLITS)} needed); the task needs more patients of that class")
    bal = df[df["balanced"]].groupby(["split", "y"]).size().unstack(fill_value=0)
    for s in bal.index:
        if bal.loc[s].nunique() != 1:
            raise SplitError(f"{where}: balanced {s} subset has unequal class counts {bal.loc[s].to_dict()}")


def split_summary(df: pd.DataFrame, task: dict) -> dict:
    counts = df.groupby(["split", "label"]).size()
    return {
        "n_images": int(len(df)), "n_patients": int(df["patient_id"].nunique()),
        "counts": {f"{s}/{c}": int(n) for (s, c), n in counts.items()},
        "balanced_counts": {f"{s}/{c}": int(n)
                            for (s, c), n in df[df["balanced"]].groupby(["split", "label"]).size().items()},
        "realised_fractions": {s: round(float((df["split"] == s).mean()), 4) for s in SPLITS},
    }


def regime_rows(split: pd.DataFrame, part: str, balanced: bool) -> pd.DataFrame:
    rows = split[split["split"] == part]
    return rows[rows["balanced"]] if balanced else rows

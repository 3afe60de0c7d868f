"""Leakage control: re-rank without tasks an encoder may have seen in pretraining.

The encoder registry records, per encoder, the benchmark datasets with *known* pretraining exposure
(``exposure``); the dataset registry records each dataset's *web-scale exposure risk* (``web_exposure_risk``:
low when access needs a human-mediated request, high when the images are freely downloadable). Two task
subsets are re-ranked: (a) tasks of datasets no selected encoder is known to have seen, and (b) tasks of
low-risk datasets. Per-task ranks stay those among all encoders. Each encoder's signed rank change follows the
benchmark's one convention (reference − comparison, stats.distance): the reference is the full benchmark, the
comparison the restricted one, so ``position_change`` = position on all tasks − position on the subset (and
``mean_rank_change`` likewise): **positive = improved rank on the restricted benchmark** (OcularBench Fig. 2).
"""
from __future__ import annotations

import pandas as pd

from retinabench.stats.ranks import positions, select

OPHTHALMIC_DOMAINS = ("cfp", "oct", "cfp+oct")
SUBSET_LABELS = {"no_known_exposure": "tasks without known exposure", "low_risk": "low web-exposure-risk datasets"}
LEAKAGE_REFERENCE = "all tasks"
LEAKAGE_MEANING = ("positive = improved rank on the restricted benchmark (position / mean rank on all tasks minus on "
                   "the subset)")


def _get(entry: dict, key: str, what: str):
    if key not in entry:
        raise KeyError(f"{what}: registry entry lacks {key!r} (needed for the leakage analysis)")
    return entry[key]


def exposed_datasets(encoders: dict[str, dict], benchmark_datasets: list[str]) -> dict[str, list[str]]:
    """Per encoder, the benchmark datasets its registry entry says it saw in pretraining."""
    return {e: sorted(set(_get(m, "exposure", f"encoder {e!r}")) & set(benchmark_datasets))
            for e, m in encoders.items()}


def exposure_likelihood(encoders: dict[str, dict], datasets: dict[str, dict]) -> dict[str, str]:
    """``known``: exposure to a benchmark dataset is recorded; ``possible``: pretrained on retinal images
    (domain cfp / oct / cfp+oct) while the benchmark holds freely downloadable (high-risk) datasets;
    ``unlikely`` otherwise."""
    exposed = exposed_datasets(encoders, list(datasets))
    any_high = any(_get(d, "web_exposure_risk", f"dataset {n!r}") == "high" for n, d in datasets.items())
    out = {}
    for e, meta in encoders.items():
        if exposed[e]:
            out[e] = "known"
        elif any_high and _get(meta, "domain", f"encoder {e!r}") in OPHTHALMIC_DOMAINS:
            out[e] = "possible"
        else:
            out[e] = "unlikely"
    return out


def leakage_subsets(tasks: dict[str, dict], encoders: dict[str, dict],
                    datasets: dict[str, dict]) -> dict[str, list[str]]:
    """The two task subsets of the leakage control (either may be empty)."""
    task_ds = {t: _get(m, "dataset", f"task {t!r}") for t, m in tasks.items()}
    unknown = sorted(set(task_ds.values()) - set(datasets))
    if unknown:
        raise KeyError(f"leakage: tasks refer to datasets without registry entries: {unknown}")
    seen = set().union(*exposed_datasets(encoders, list(datasets)).values()) if encoders else set()
    return {
        "no_known_exposure": sorted(t for t, d in task_ds.items() if d not in seen),
        "low_risk": sorted(t for t, d in task_ds.items()
                           if _get(datasets[d], "web_exposure_risk", f"dataset {d!r}") == "low"),
    }


def high_leakage_datasets(encoders: dict[str, dict], datasets: dict[str, dict]) -> list[str]:
    """Datasets with high web-exposure risk or with known exposure of any selected encoder."""
    seen = set().union(*exposed_datasets(encoders, list(datasets)).values()) if encoders else set()
    return sorted(d for d, m in datasets.items()
                  if d in seen or _get(m, "web_exposure_risk", f"dataset {d!r}") == "high")


def informative_subsets(subsets: dict[str, list[str]], all_tasks: list[str]) -> dict[str, list[str]]:
    """Subsets that change anything: non-empty and smaller than the full task set."""
    return {k: v for k, v in subsets.items() if v and set(v) != set(all_tasks)}


def leakage_rerank(ranks: pd.DataFrame, subsets: dict[str, list[str]], *, metric: str, protocol: str,
                   regime: str, likelihood: dict[str, str], exposure: dict[str, list[str]]) -> pd.DataFrame:
    """Per (subset, encoder): mean rank and position on all tasks and on the subset, and the signed changes."""
    base = select(ranks, metric=metric, protocol=protocol, regime=regime)
    all_mean = base.groupby("encoder")["rank"].mean()
    all_pos = positions(all_mean)
    frames = []
    for name, members in subsets.items():
        if not members:
            raise ValueError(f"leakage subset {name!r} has no tasks")
        sub = select(base, tasks=members).groupby("encoder")["rank"].mean()
        if set(sub.index) != set(all_mean.index):
            raise ValueError(f"leakage subset {name!r}: encoders {sorted(set(all_mean.index) - set(sub.index))} "
                             "have no ranks on its tasks")
        pos = positions(sub)
        enc = list(all_mean.index)
        frames.append(pd.DataFrame({
            "subset": name, "encoder": enc, "n_tasks": len(members), "n_tasks_all": base["task"].nunique(),
            "mean_rank_all": all_mean.loc[enc].to_numpy(), "mean_rank_subset": sub.loc[enc].to_numpy(),
            "position_all": all_pos.loc[enc].to_numpy(), "position_subset": pos.loc[enc].to_numpy()}))
    out = pd.concat(frames, ignore_index=True)
    out.insert(1, "reference", LEAKAGE_REFERENCE)
    out.insert(2, "comparison", [SUBSET_LABELS.get(s, s) for s in out["subset"]])
    out["mean_rank_change"] = out["mean_rank_all"] - out["mean_rank_subset"]
    out["position_change"] = out["position_all"] - out["position_subset"]
    out["meaning"] = LEAKAGE_MEANING
    out["likelihood"] = [likelihood[e] for e in out["encoder"]]
    out["known_exposure"] = [",".join(exposure.get(e, [])) for e in out["encoder"]]
    return out.assign(metric=metric, protocol=protocol, regime=regime)


def top_k(ranks: pd.DataFrame, tasks: dict[str, dict], clean_tasks: list[str], *, k: int, metric: str,
          protocol: str, regime: str, modalities: list[str]) -> pd.DataFrame:
    """Top-k encoders by mean rank on the clean tasks: all of them and each modality (panels without tasks are
    left out). Columns: panel, position, encoder, mean_rank, sd_rank, n_tasks."""
    if k < 1:
        raise ValueError(f"top_k: k must be >= 1, got {k}")
    panels = {"all": sorted(clean_tasks)}
    for m in modalities:
        panels[m] = sorted(t for t in clean_tasks if _get(tasks[t], "modality", f"task {t!r}") == m)
    frames = []
    for panel, members in panels.items():
        if not members:
            continue
        d = select(ranks, metric=metric, protocol=protocol, regime=regime, tasks=members)
        g = d.groupby("encoder")["rank"]
        t = pd.DataFrame({"mean_rank": g.mean(), "sd_rank": g.std(), "n_tasks": g.size()})
        t["position"] = positions(t["mean_rank"])
        t = t.reset_index().sort_values(["mean_rank", "encoder"]).head(k)
        frames.append(t.assign(panel=panel))
    if not frames:
        raise ValueError("top_k: no clean tasks in any panel")
    out = pd.concat(frames, ignore_index=True)
    return out[["panel", "position", "encoder", "mean_rank", "sd_rank", "n_tasks"]].assign(
        metric=metric, protocol=protocol, regime=regime)

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


# How likely an encoder's pretraining exposed it to the benchmark's images (OcularBench Fig. 2 colours each encoder by
# its estimated likelihood of web-scale exposure), derived from the registry's `exposure` and `pretraining_data`:
#   known     `exposure` names a benchmark dataset (recorded in the encoder's paper or model card);
#   likely    a pretraining corpus crawled from the web at scale (WEB_SCALE_CORPORA) while the benchmark holds a
#             freely downloadable dataset (web_exposure_risk high): web-scale natural-image and CLIP-like encoders;
#   possible  a collection assembled from public ophthalmic datasets without an itemised list (PUBLIC_COLLECTIONS);
#   unlikely  curated or institutional data only (ImageNet, hospital archives, pathology slides, chest x-rays), or no
#             pretraining at all (random initialisation).
# A pretraining_data item is matched by its id (the text before " (", lower case). A new web-scale corpus or public
# collection is added here.
WEB_SCALE_CORPORA = frozenset({"lvd-142m", "lvd-1689m", "wit-400m", "webli", "web-text-image", "llava-next-data",
                               "laion-400m", "laion-2b", "datacomp-1b"})
PUBLIC_COLLECTIONS = frozenset({"public-cfp-collection", "flair-collection", "flair-37-datasets", "oct-public",
                                "eyeclip-2.77m-multimodal-ophthalmic"})
LIKELIHOODS = ("known", "likely", "possible", "unlikely")


def _corpus_id(item: str) -> str:
    return str(item).split(" (")[0].strip().lower()


def exposure_assessment(encoders: dict[str, dict], datasets: dict[str, dict]) -> dict[str, tuple[str, str]]:
    """Per encoder: (likelihood, basis) by the rules above; ``basis`` says which registry field decided it."""
    exposed = exposed_datasets(encoders, list(datasets))
    any_high = any(_get(d, "web_exposure_risk", f"dataset {n!r}") == "high" for n, d in datasets.items())
    out = {}
    for e, meta in encoders.items():
        corpora = [_corpus_id(c) for c in meta.get("pretraining_data") or []]
        web = [c for c in corpora if c in WEB_SCALE_CORPORA]
        public = [c for c in corpora if c in PUBLIC_COLLECTIONS]
        if exposed[e]:
            out[e] = ("known", f"exposure: {', '.join(exposed[e])}")
        elif web and any_high:
            out[e] = ("likely", f"web-scale pretraining: {', '.join(web)}")
        elif public:
            out[e] = ("possible", f"public ophthalmic collection: {', '.join(public)}")
        elif web:
            out[e] = ("unlikely", f"web-scale pretraining ({', '.join(web)}) but no freely downloadable dataset")
        else:
            out[e] = ("unlikely", f"curated pretraining data: {', '.join(corpora)}" if corpora else "no pretraining")
    return out


def exposure_likelihood(encoders: dict[str, dict], datasets: dict[str, dict]) -> dict[str, str]:
    """Per encoder its exposure likelihood (one of :data:`LIKELIHOODS`; :func:`exposure_assessment`)."""
    return {e: level for e, (level, _) in exposure_assessment(encoders, datasets).items()}


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
                   regime: str, likelihood: dict[str, tuple[str, str]], exposure: dict[str, list[str]]
                   ) -> pd.DataFrame:
    """Per (subset, encoder): mean rank and position on all tasks and on the subset, the signed changes, and the
    encoder's exposure likelihood with its basis (``likelihood``: :func:`exposure_assessment`)."""
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
    out["likelihood"] = [likelihood[e][0] for e in out["encoder"]]
    out["likelihood_basis"] = [likelihood[e][1] for e in out["encoder"]]
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

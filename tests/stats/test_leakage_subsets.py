"""Leakage re-ranking and subset rankings on small hand tables."""
import pytest

from retinabench.stats.leakage import (exposed_datasets, exposure_assessment, exposure_likelihood,
                                       high_leakage_datasets, informative_subsets, leakage_rerank, leakage_subsets,
                                       top_k)
from retinabench.stats.subsets import subset_rankings, task_subsets

# dsA: low risk but encoder e1 saw it in pretraining; dsB: freely downloadable (high risk); dsC: clean.
DATASETS = {"dsA": {"web_exposure_risk": "low"}, "dsB": {"web_exposure_risk": "high"},
            "dsC": {"web_exposure_risk": "low"}}
TASKS = {"tA": {"dataset": "dsA", "modality": "cfp", "family": "dr_staging"},
         "tB": {"dataset": "dsB", "modality": "cfp", "family": "glaucoma"},
         "tC1": {"dataset": "dsC", "modality": "oct", "family": "dme"},
         "tC2": {"dataset": "dsC", "modality": "cfp", "family": "dr_staging"}}
ENCODERS = {"e1": {"domain": "cfp", "exposure": ["dsA", "eyepacs"], "pretraining_data": ["meh-midas-cfp", "eyepacs"]},
            "e2": {"domain": "natural", "exposure": [], "pretraining_data": ["lvd-142m"]},
            "e3": {"domain": "cfp", "exposure": [], "pretraining_data": ["shanghai-cfp"]}}
# Per-task order (best first): e1 wins the exposed and the high-risk task, loses the clean ones.
SCORES = {"tA": {"e1": 0.9, "e2": 0.8, "e3": 0.7}, "tB": {"e1": 0.9, "e2": 0.7, "e3": 0.8},
          "tC1": {"e1": 0.6, "e2": 0.9, "e3": 0.8}, "tC2": {"e1": 0.7, "e2": 0.8, "e3": 0.9}}


def test_exposure_and_subsets():
    assert exposed_datasets(ENCODERS, list(DATASETS)) == {"e1": ["dsA"], "e2": [], "e3": []}  # eyepacs not here
    # web-scale pretraining is "likely" exposure, a retinal encoder on institutional data "unlikely"
    assert exposure_likelihood(ENCODERS, DATASETS) == {"e1": "known", "e2": "likely", "e3": "unlikely"}
    # without a freely downloadable dataset in the benchmark, web-scale pretraining cannot have seen it
    assert exposure_likelihood(ENCODERS, {k: DATASETS[k] for k in ("dsA", "dsC")})["e2"] == "unlikely"
    subsets = leakage_subsets(TASKS, ENCODERS, DATASETS)
    assert subsets == {"no_known_exposure": ["tB", "tC1", "tC2"], "low_risk": ["tA", "tC1", "tC2"]}
    assert high_leakage_datasets(ENCODERS, DATASETS) == ["dsA", "dsB"]
    assert informative_subsets({"x": list(TASKS), "y": [], "z": ["tA"]}, list(TASKS)) == {"z": ["tA"]}


def test_leakage_rerank_by_hand(ranks_from):
    ranks = ranks_from(SCORES)
    # all tasks: e1 ranks 1,1,3,3 (mean 2), e2 2,3,1,2 (2), e3 3,2,2,1 (2) -> positions 2, 2, 2
    # no known exposure (tB, tC1, tC2): e1 1,3,3 = 7/3; e2 3,1,2 = 2; e3 2,2,1 = 5/3 -> positions 3, 2, 1
    # low risk (tA, tC1, tC2): e1 1,3,3 = 7/3; e2 2,1,2 = 5/3; e3 3,2,1 = 2 -> positions 3, 1, 2
    subsets = leakage_subsets(TASKS, ENCODERS, DATASETS)
    out = leakage_rerank(ranks, subsets, metric="accuracy", protocol="linear", regime="u-u",
                         likelihood=exposure_assessment(ENCODERS, DATASETS),
                         exposure=exposed_datasets(ENCODERS, list(DATASETS))).set_index(["subset", "encoder"])
    assert out.loc[("no_known_exposure", "e1"), "mean_rank_all"] == pytest.approx(2.0)
    assert out.loc[("no_known_exposure", "e1"), "mean_rank_subset"] == pytest.approx(7 / 3)
    # signed changes: all tasks (reference) minus the restricted benchmark: positive = improved rank there
    assert out.loc[("no_known_exposure", "e1"), "mean_rank_change"] == pytest.approx(-1 / 3)
    change = out["position_change"].to_dict()
    assert change == {("no_known_exposure", "e1"): -1.0, ("no_known_exposure", "e2"): 0.0,
                      ("no_known_exposure", "e3"): 1.0, ("low_risk", "e1"): -1.0, ("low_risk", "e2"): 1.0,
                      ("low_risk", "e3"): 0.0}
    # e2 gains rank on the low-risk subset (position 2 -> 1): a positive change; e1 loses its exposed task
    assert out.loc[("low_risk", "e2"), "position_change"] > 0 and out.loc[("low_risk", "e1"), "position_change"] < 0
    assert set(out["reference"]) == {"all tasks"}
    assert out.loc[("low_risk", "e2"), "comparison"] == "low web-exposure-risk datasets"
    assert set(out["meaning"]) == {"positive = improved rank on the restricted benchmark (position / mean rank on "
                                   "all tasks minus on the subset)"}
    assert out.loc[("low_risk", "e1"), "known_exposure"] == "dsA" and out.loc[("low_risk", "e1"), "n_tasks"] == 3


def test_top_k_on_clean_tasks(ranks_from):
    ranks = ranks_from(SCORES)
    clean = [t for t, m in TASKS.items() if m["dataset"] not in high_leakage_datasets(ENCODERS, DATASETS)]
    assert clean == ["tC1", "tC2"]
    t = top_k(ranks, TASKS, clean, k=2, metric="accuracy", protocol="linear", regime="u-u",
              modalities=["cfp", "oct", "slo"])
    assert list(dict.fromkeys(t["panel"])) == ["all", "cfp", "oct"]  # no SLO task: no panel
    top_all = t[t["panel"] == "all"]
    assert top_all["encoder"].tolist() == ["e2", "e3"] and top_all["mean_rank"].tolist() == [1.5, 1.5]
    assert t[t["panel"] == "oct"]["encoder"].tolist() == ["e2", "e3"]
    assert t[t["panel"] == "cfp"]["encoder"].tolist() == ["e3", "e2"]


def test_subset_rankings(ranks_from):
    ranks = ranks_from(SCORES)
    subsets = task_subsets(TASKS, {"modality": ["cfp", "oct"], "family": ["dr_staging", "amd"]})
    assert subsets == {"modality=cfp": ["tA", "tB", "tC2"], "modality=oct": ["tC1"],
                       "family=dr_staging": ["tA", "tC2"]}
    t = subset_rankings(ranks, subsets, metric="accuracy", protocol="linear", regime="u-u").set_index(
        ["subset", "encoder"])
    assert t.loc[("modality=cfp", "e1"), "mean_rank"] == pytest.approx(5 / 3)  # ranks 1, 1, 3
    assert t.loc[("family=dr_staging", "e3"), "position"] == 2.0               # ranks 3, 1 -> 2 (e2: 2, 2)
    assert t.loc[("all", "e2"), "n_tasks"] == 4
    with pytest.raises(KeyError, match="subset key 'site'"):
        task_subsets(TASKS, {"site": ["x"]})

"""Signed rank distance, Kruskal–Wallis across encoder groups, Spearman agreement between rankings."""
import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from retinabench.stats.agreement import agreement_table, spearman, spearman_matrix
from retinabench.stats.distance import (distance_table, kruskal_by_group, kruskal_table, protocol_comparisons,
                                        signed_rank_distance, subset_comparisons)

ENCODERS = {"a": {"domain": "natural", "method": "supervised", "method_group": "supervised"},
            "b": {"domain": "cfp", "method": "MAE", "method_group": "masked_modelling"},
            "c": {"domain": "oct", "method": "MAE", "method_group": "masked_modelling"},
            "d": {"domain": "natural", "method": "MAE", "method_group": "masked_modelling"}}


def test_signed_rank_distance_by_hand():
    reference = pd.Series({"e1": 1.0, "e2": 3.0, "e3": 2.0})
    comparison = pd.Series({"e3": 3.0, "e1": 2.0, "e2": 1.0})  # other order: aligned by encoder, not position
    d = signed_rank_distance(reference, comparison)  # (rank_reference - rank_comparison)/sqrt(2)
    assert d.to_dict() == pytest.approx({"e1": -1 / math.sqrt(2), "e2": 2 / math.sqrt(2), "e3": -1 / math.sqrt(2)})
    a = reference
    with pytest.raises(ValueError, match="different encoders.*e4"):
        signed_rank_distance(a, pd.Series({"e1": 1.0, "e2": 2.0, "e4": 3.0}))


def test_kruskal_hand_computed_case():
    # Groups {1,2,3} and {4,5,6}: rank sums 6 and 15, N = 6:
    # H = 12/(N(N+1)) * (6²/3 + 15²/3) - 3(N+1) = (12/42) * 87 - 21 = 27/7; p = chi²_1 sf(27/7).
    values = pd.Series([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], index=list("uvwxyz"))
    groups = pd.Series(["g1"] * 3 + ["g2"] * 3, index=list("uvwxyz"))
    res = kruskal_by_group(values, groups)
    assert res["H"] == pytest.approx(27 / 7)
    assert res["p"] == pytest.approx(stats.chi2.sf(27 / 7, 1)) and res["p"] < 0.05 and res["significant"]
    assert res["groups"] == "g1 (n=3); g2 (n=3)"


def test_kruskal_matches_scipy_with_ties_and_uneven_groups():
    rng = np.random.default_rng(3)
    values = pd.Series(np.round(rng.normal(size=11), 1), index=[f"e{i}" for i in range(11)])
    groups = pd.Series(["x"] * 4 + ["y"] * 2 + ["z"] * 5, index=values.index)
    res = kruskal_by_group(values, groups, alpha=0.05)
    ref = stats.kruskal(values[:4], values[4:6], values[6:])
    assert res["H"] == pytest.approx(ref.statistic) and res["p"] == pytest.approx(ref.pvalue)


def test_kruskal_undefined_cases_are_noted_not_hidden():
    v = pd.Series([0.5, -0.2, 0.1], index=list("abc"))
    one = kruskal_by_group(v, pd.Series(["g"] * 3, index=list("abc")))
    assert math.isnan(one["p"]) and "fewer than two groups" in one["note"] and not one["significant"]
    singletons = kruskal_by_group(v[:2], pd.Series(["g", "h"], index=list("ab")))
    assert math.isnan(singletons["p"]) and "one encoder per group" in singletons["note"]
    same = kruskal_by_group(pd.Series([0.0] * 3, index=list("abc")), pd.Series(["g", "h", "h"], index=list("abc")))
    assert math.isnan(same["H"]) and "all distances equal" in same["note"]
    with pytest.raises(KeyError, match="no group for encoders"):
        kruskal_by_group(v, pd.Series(["g"], index=["a"]))


def test_distance_and_kruskal_tables(ranks_from):
    knn = ranks_from({"t1": {"a": 4, "b": 3, "c": 2, "d": 1}, "t2": {"a": 4, "b": 3, "c": 1, "d": 2}},
                     protocol="knn")
    lin = ranks_from({"t1": {"a": 1, "b": 2, "c": 3, "d": 4}, "t2": {"a": 1, "b": 2, "c": 4, "d": 3}})
    ranks = pd.concat([knn, lin], ignore_index=True)
    comps = protocol_comparisons(["knn", "linear"], metric="accuracy", regime="u-u")
    table = distance_table(ranks, comps, ENCODERS)
    # the trained linear probe is the declared reference of the pair (not the config order)
    assert set(table["reference"]) == {"linear"} and set(table["comparison"]) == {"knn"}
    d = table.set_index("encoder")["distance"]
    # (scores: higher = better) a: rank 4 on both tasks under linear, 1 under knn -> (4 - 1)/sqrt(2) > 0, better
    # under knn; c: ranks 2, 1 (mean 1.5) under linear and 3, 4 (3.5) under knn -> (1.5 - 3.5)/sqrt(2)
    assert d["a"] == pytest.approx(3 / math.sqrt(2)) and d["b"] == pytest.approx(1 / math.sqrt(2))
    assert d["c"] == pytest.approx(-2 / math.sqrt(2)) and d["d"] == pytest.approx(-2 / math.sqrt(2))
    assert table.set_index("encoder").loc["c", ["rank_reference", "rank_comparison"]].tolist() == [1.5, 3.5]
    assert table.set_index("encoder")["domain"].to_dict() == {e: m["domain"] for e, m in ENCODERS.items()}
    assert set(table["meaning"]) == {"positive = better relative rank under knn than under linear"}
    # the paper's groups: cfp and oct encoders are one retinal group
    assert table.set_index("encoder")["domain_group"].to_dict() == {"a": "natural", "b": "retinal", "c": "retinal",
                                                                   "d": "natural"}
    kw = kruskal_table(table).set_index("group_by")
    assert set(kw.index) == {"domain_group", "method_group"}
    ref = stats.kruskal([d["a"], d["d"]], [d["b"], d["c"]])  # natural vs retinal
    assert kw.loc["domain_group", "H"] == pytest.approx(ref.statistic)
    assert kw.loc["domain_group", "p"] == pytest.approx(ref.pvalue)
    assert kw.loc["domain_group", "reference"] == "linear" and kw.loc["domain_group", "comparison"] == "knn"
    # groups listed largest first: three masked-modelling encoders, then the supervised one
    assert kw.loc["method_group", "groups"] == "masked_modelling (n=3); supervised (n=1)"


def test_finetune_is_the_reference_whatever_the_config_order(ranks_from):
    # Encoder a is the best under full fine-tuning and the worst under linear probing (OcularBench Fig. 5:
    # distance = (rank_FT - rank_LP)/sqrt(2), positive = better relative rank under linear probing).
    ft = ranks_from({"t1": {"a": 9, "b": 5, "c": 1}, "t2": {"a": 9, "b": 1, "c": 5}}, protocol="finetune")
    lp = ranks_from({"t1": {"a": 1, "b": 5, "c": 9}, "t2": {"a": 1, "b": 9, "c": 5}}, protocol="linear_aug")
    ranks = pd.concat([ft, lp], ignore_index=True)
    encoders = {e: ENCODERS[e] for e in "abc"}
    tables = []
    for order in (["linear_aug", "finetune"], ["finetune", "linear_aug"], ["knn", "linear_aug", "finetune"]):
        comps = [c for c in protocol_comparisons(order, metric="accuracy", regime="u-u") if "knn" not in c.name]
        t = distance_table(ranks, comps, encoders)
        assert set(t["reference"]) == {"finetune"} and set(t["comparison"]) == {"linear_aug"}
        assert set(t["name"]) == {"finetune vs linear_aug"}
        tables.append(t.set_index("encoder")["distance"])
    for t in tables:
        assert t["a"] == pytest.approx((1 - 3) / math.sqrt(2)) and t["a"] < 0
        assert t["b"] == pytest.approx((2.5 - 1.5) / math.sqrt(2))  # FT ranks 2, 3; LP ranks 2, 1
    assert [c.reference for c in protocol_comparisons(["knn", "logreg", "linear", "linear_aug", "finetune"],
                                                       metric="accuracy", regime="u-u")] == \
        ["logreg", "linear", "linear_aug", "finetune", "linear", "linear_aug", "finetune", "linear_aug", "finetune",
         "finetune"]


def test_subset_distance_is_positive_when_the_encoder_ranks_better_on_the_subset(ranks_from):
    # a: the best on the two CFP tasks, the worst on the two OCT tasks -> positive CFP-vs-rest distance
    tasks = {"c1": {"modality": "cfp", "family": "glaucoma"}, "c2": {"modality": "cfp", "family": "dr_staging"},
             "o1": {"modality": "oct", "family": "dme"}, "o2": {"modality": "oct", "family": "amd"}}
    ranks = ranks_from({"c1": {"a": 9, "b": 5, "c": 1}, "c2": {"a": 9, "b": 1, "c": 5},
                        "o1": {"a": 1, "b": 5, "c": 9}, "o2": {"a": 1, "b": 9, "c": 5}})
    comps = subset_comparisons(tasks, {"modality": ["cfp"]}, metric="accuracy", protocol="linear", regime="u-u")
    t = distance_table(ranks, comps, {e: ENCODERS[e] for e in "abc"}).set_index("encoder")
    assert set(t["reference"]) == {"rest"} and set(t["comparison"]) == {"cfp"}
    assert t.loc["a", "rank_comparison"] == 1.0 and t.loc["a", "rank_reference"] == 3.0
    assert t.loc["a", "distance"] == pytest.approx(2 / math.sqrt(2)) and t.loc["a", "distance"] > 0
    assert t.loc["a", "meaning"] == "positive = better relative rank on cfp tasks than on the rest"


def test_subset_comparisons_need_tasks_on_both_sides():
    tasks = {"t1": {"modality": "cfp", "family": "glaucoma"}, "t2": {"modality": "cfp", "family": "dr_staging"}}
    comps = subset_comparisons(tasks, {"modality": ["cfp", "oct"], "family": ["glaucoma"]}, metric="accuracy",
                               protocol="linear", regime="u-u")
    assert [c.name for c in comps] == ["glaucoma vs rest"]  # all tasks are CFP: no "rest"; no OCT task
    assert comps[0].where_comparison["tasks"] == ["t1"] and comps[0].where_reference["tasks"] == ["t2"]


def test_spearman_by_hand_with_exact_p():
    a = pd.Series([1, 2, 3, 4, 5], index=list("abcde"), dtype=float)
    b = pd.Series([2, 1, 4, 3, 5], index=list("abcde"), dtype=float)
    rho, p, note = spearman(a, b)
    assert rho == pytest.approx(1 - 6 * 4 / (5 * 24))  # sum d² = 4 -> rho = 0.8
    # exact two-sided p by enumeration of the 120 orderings
    count = sum(abs(1 - 6 * sum((i - j) ** 2 for i, j in zip(range(1, 6), perm)) / 120) >= 0.8 - 1e-12
                for perm in itertools.permutations(range(1, 6)))
    assert p == pytest.approx(count / 120) and "exact" in note


def test_spearman_large_n_uses_scipy_and_constant_is_undefined():
    rng = np.random.default_rng(0)
    a, b = pd.Series(rng.random(12)), pd.Series(rng.random(12))
    ref = stats.spearmanr(a, b)
    assert spearman(a, b)[:2] == pytest.approx((ref.statistic, ref.pvalue))
    rho, p, note = spearman(pd.Series([1.0, 1.0, 1.0]), pd.Series([1.0, 2.0, 3.0]))
    assert math.isnan(rho) and "constant" in note


def test_agreement_table_pairs_protocols_and_regimes(ranks_from):
    frames = []
    for protocol, regime, order in (("knn", "u-u", "abcd"), ("linear", "u-u", "abcd"), ("knn", "b-b", "dcba"),
                                    ("linear", "b-b", "abdc")):
        scores = {t: {e: 10 - i for i, e in enumerate(order)} for t in ("t1", "t2")}
        frames.append(ranks_from(scores, protocol=protocol, regime=regime))
    ranks = pd.concat(frames, ignore_index=True)
    t = agreement_table(ranks, metric="accuracy", protocols=["knn", "linear"], regimes=["u-u", "b-b"])
    rows = {(r.kind, r.within, r.a, r.b): r.rho for r in t.itertuples()}
    assert rows[("protocols", "u-u", "knn", "linear")] == pytest.approx(1.0)
    assert rows[("protocols", "b-b", "knn", "linear")] == pytest.approx(-0.8)  # dcba vs abdc
    assert rows[("regimes", "knn", "u-u", "b-b")] == pytest.approx(-1.0)
    rho, p = spearman_matrix(ranks[ranks["regime"] == "u-u"].groupby(["encoder", "protocol"])["rank"].mean()
                             .unstack("protocol"))
    assert rho.loc["knn", "linear"] == pytest.approx(1.0) and rho.loc["knn", "knn"] == 1.0

"""Ranks: ties averaged, metric direction, multi-metric tables, complete score matrices, one encoder order."""
import pandas as pd
import pytest

from retinabench.schemas import METRICS
from retinabench.stats.ranks import (encoder_order, higher_is_better, mean_ranks, positions, rank_summaries,
                                     rank_summary, rank_table, rank_tables, score_matrix, select)


def metrics(rows):
    base = {"dataset": "ds", "protocol": "linear", "regime": "u-u", "split": "test", "n": 10}
    return pd.DataFrame([base | r for r in rows])[METRICS.names]


def test_ties_get_the_average_rank_after_seed_averaging():
    m = metrics([
        {"task": "t1", "encoder": "a", "seed": 0, "metric": "accuracy", "value": 0.8},
        {"task": "t1", "encoder": "a", "seed": 1, "metric": "accuracy", "value": 0.6},   # mean 0.7
        {"task": "t1", "encoder": "b", "seed": 0, "metric": "accuracy", "value": 0.7},   # ties a
        {"task": "t1", "encoder": "c", "seed": 0, "metric": "accuracy", "value": 0.9},
        {"task": "t1", "encoder": "d", "seed": 0, "metric": "accuracy", "value": 0.7},   # three-way tie
    ])
    r = rank_table(m).set_index("encoder")["rank"]
    assert r.to_dict() == {"a": 3.0, "b": 3.0, "c": 1.0, "d": 3.0}  # ranks 2, 3, 4 averaged


def test_lower_is_better_for_ece_only():
    assert not higher_is_better("ece") and higher_is_better("auroc")
    with pytest.raises(KeyError, match="unknown metric 'brier'"):
        higher_is_better("brier")
    m = metrics([{"task": "t1", "encoder": e, "seed": 0, "metric": "ece", "value": v}
                 for e, v in (("a", 0.05), ("b", 0.20))])
    r = rank_tables(m, ["ece"]).set_index("encoder")["rank"]
    assert r["a"] == 1.0 and r["b"] == 2.0


def test_rank_tables_and_summaries_keep_metrics_apart():
    rows = []
    for t, (acc_a, auc_a) in {"t1": (0.9, 0.6), "t2": (0.8, 0.5)}.items():
        rows += [{"task": t, "encoder": "a", "seed": 0, "metric": "accuracy", "value": acc_a},
                 {"task": t, "encoder": "b", "seed": 0, "metric": "accuracy", "value": 0.7},
                 {"task": t, "encoder": "a", "seed": 0, "metric": "auroc", "value": auc_a},
                 {"task": t, "encoder": "b", "seed": 0, "metric": "auroc", "value": 0.7}]
    r = rank_tables(metrics(rows), ["accuracy", "auroc", "accuracy"])
    assert sorted(r["metric"].unique()) == ["accuracy", "auroc"] and len(r) == 8
    s = rank_summaries(r).set_index(["metric", "encoder"])["mean_rank"]
    assert s[("accuracy", "a")] == 1.0 and s[("auroc", "a")] == 2.0
    # rank_summary itself is unchanged: one block per (protocol, regime)
    one = rank_summary(r[r["metric"] == "accuracy"])
    assert {"mean_rank", "sd_rank", "n_tasks"} <= set(one.columns) and "metric" not in one.columns


def test_score_matrix_requires_a_complete_design(ranks_from):
    r = ranks_from({"t1": {"a": 0.9, "b": 0.8, "c": 0.7}, "t2": {"a": 0.6, "b": 0.8}})
    with pytest.raises(ValueError, match="incomplete.*t2/c"):
        score_matrix(r, metric="accuracy", protocol="linear", regime="u-u")
    full = score_matrix(r, metric="accuracy", protocol="linear", regime="u-u", tasks=["t1"])
    assert full.shape == (1, 3)


def test_select_names_what_is_missing(ranks_from):
    r = ranks_from({"t1": {"a": 0.9, "b": 0.8}})
    with pytest.raises(ValueError, match="protocol='knn'.*protocols \\['linear'\\]"):
        select(r, protocol="knn")


def test_positions_and_one_encoder_order(ranks_from):
    r = ranks_from({"t1": {"a": 0.9, "b": 0.8, "c": 0.7}, "t2": {"a": 0.7, "b": 0.8, "c": 0.6}})
    mr = mean_ranks(r, metric="accuracy", protocol="linear", regime="u-u")
    assert mr.to_dict() == {"a": 1.5, "b": 1.5, "c": 3.0}
    assert positions(mr).to_dict() == {"a": 1.5, "b": 1.5, "c": 3.0}
    assert encoder_order(r, metric="accuracy", regime="u-u") == ["a", "b", "c"]  # ties broken by name

"""The metric table (retinabench.metrics.table): one record per metric, its one implementation, direction and
aggregation; what the results tables report; the vocabulary every consumer reads from it."""
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from retinabench.metrics import point
from retinabench.metrics.table import (ANSWER_METRICS, METRICS, METRICS_TABLE, RELIABILITY_BINARY,
                                       RELIABILITY_MULTICLASS, Metric, display_name, higher_is_better, metric,
                                       metric_family, metric_family_names, metrics_table_names, reliability_name,
                                       threshold_free)

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "retinabench"


def test_every_reported_name_is_declared_and_applies_to_its_tasks():
    for names, n_classes in ((METRICS_TABLE, 2), (ANSWER_METRICS, 2), (RELIABILITY_BINARY, 2),
                             (RELIABILITY_MULTICLASS, 3)):
        for name in names:
            assert metric(name).compute is not None and metric(name).applies_to(n_classes), name
    assert metrics_table_names(3) == tuple(m for m in METRICS_TABLE if m != "ece")


def test_every_metric_list_of_the_package_names_declared_metrics():
    from retinabench.metrics import fairness
    from retinabench.reliability import adapter_deltas
    from retinabench.stats.baselines import chance_levels
    for names, n_classes in ((fairness.GAP_METRICS_BINARY, 2), (fairness.QUALITY_METRICS_BINARY, 2),
                             (fairness.GAP_METRICS_MULTI, 3), (fairness.QUALITY_METRICS_MULTI, 3),
                             (adapter_deltas.TABLE5_METRICS, 2)):
        assert all(metric(m).applies_to(n_classes) for m in names), names
    assert set(chance_levels(np.array([0.3, 0.7]))) == set(METRICS_TABLE)
    empty = pd.DataFrame(columns=["variant", "protocol", "encoder", "domain", "metric_family"])
    assert list(adapter_deltas.table5(empty).columns) == ["model", "domain", "ΔAUROC", "ΔAUPRC", "ΔAccuracy", "ΔF1",
                                                          "ΔECE (lower better)", "ΔInvalid rate", "n"]


def test_aliases_share_one_implementation():
    assert metric("auroc_macro").compute is metric("auroc").compute is point.auroc
    assert metric("auprc_macro").compute is metric("auprc").compute is point.auprc
    assert {m.name: m.alias_of for m in METRICS.values() if m.alias_of} == {"auroc_macro": "auroc",
                                                                           "auprc_macro": "auprc"}


def test_one_auroc_for_binary_and_multiclass_tasks():
    rng = np.random.default_rng(0)
    y = np.r_[0, 1, 2, rng.integers(0, 3, 60)]
    proba = rng.dirichlet(np.ones(3), size=len(y))
    s = point.Scored.of(y, proba, proba.argmax(1))
    assert point.auroc(s) == pytest.approx(skm.roc_auc_score(y, proba, multi_class="ovr", average="macro"))
    yb = (y == 1).astype(int)
    pb = np.c_[1 - proba[:, 1], proba[:, 1]]
    assert point.auroc(point.Scored.of(yb, pb, pb.argmax(1))) == pytest.approx(skm.roc_auc_score(yb, pb[:, 1]))
    assert np.isnan(point.auroc(point.Scored.of(np.zeros(4, int), pb[:4], np.zeros(4, int))))


def test_directions_come_from_the_table():
    assert not higher_is_better("ece") and not higher_is_better("ece_top_label") and higher_is_better("auroc")
    assert not higher_is_better("invalid_rate") and not higher_is_better("fpr")
    with pytest.raises(ValueError, match="no better direction"):
        higher_is_better("ppr")
    with pytest.raises(KeyError, match="unknown metric 'brier'"):
        higher_is_better("brier")


def test_families_and_their_reliability_names():
    assert metric_family("auroc_macro") == "auroc" and metric_family("ece_top_label") == "ece" and metric_family("f1_macro") == "f1"
    assert metric_family_names("auroc") == ("auroc", "auroc_macro")
    forms = {f: (reliability_name(f, 2), reliability_name(f, 4)) for f in ("auroc", "auprc", "accuracy", "f1", "ece")}
    assert forms == {"auroc": ("auroc", "auroc_macro"), "auprc": ("auprc", "auprc_macro"),
                     "accuracy": ("accuracy", "accuracy"), "f1": ("f1", "f1_macro"), "ece": ("ece", "ece_top_label")}
    assert threshold_free() == {"auroc", "auprc", "ece", "auroc_macro", "auprc_macro", "ece_top_label"}
    assert display_name("kappa") == "Cohen's kappa" and not metric("kappa").percent


def test_a_record_refuses_an_unknown_aggregation():
    with pytest.raises(ValueError, match="aggregation 'median'"):
        Metric("x", "X", "x", True, "median", "labels")


def test_no_module_hard_codes_metric_directions_or_name_forms():
    """Directions and families are read from the table (issue 24), not declared again or derived from suffixes."""
    pattern = re.compile(r"HIGHER_IS_BETTER\s*=|LOWER_IS_BETTER\s*=|removesuffix\([\"']_(macro|top_label)[\"']\)"
                         r"|f\"\{metric\}_macro\"|PAIRED_VARIANTS\s*=")
    offenders = [f"{p.relative_to(PACKAGE)}:{i}" for p in PACKAGE.rglob("*.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders, offenders

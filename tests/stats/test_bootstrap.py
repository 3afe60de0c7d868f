"""Patient-clustered bootstrap: weighted kernels = scikit-learn, patients stay intact, p-values, BH vs scipy."""
import numpy as np
import pandas as pd
import pytest
from scipy.stats import false_discovery_control
from sklearn import metrics as skm

from retinabench.metrics.calibration import binary_ece, top_label_ece
from retinabench.stats.bootstrap import (benjamini_hochberg, bootstrap_p_value, cluster_resample_indices,
                                         cluster_weights, hierarchical_mean_replicates, make_rng,
                                         one_stage_mean_replicates, percentile_ci, weighted_metrics)


def _binary(n=120, seed=0, ties=True):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = np.clip(0.3 * y + rng.uniform(0, 0.7, n), 0, 1)
    if ties:
        p = np.round(p, 1)  # many ties: the rank kernels must count them as sklearn does
    proba = np.c_[1 - p, p]
    return y, proba, (p >= 0.5).astype(int)


def _multi(n=150, k=3, seed=1):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k)) + 1.5 * np.eye(k)[y]
    proba = np.round(np.exp(logits) / np.exp(logits).sum(1, keepdims=True), 2)
    proba = proba / proba.sum(1, keepdims=True)
    return y, proba, proba.argmax(1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binary_kernels_equal_sklearn_on_rows_repeated_by_weight(seed):
    y, proba, pred = _binary(seed=seed)
    w = np.random.default_rng(seed + 10).integers(0, 4, len(y))  # resample-like counts, including zeros
    r = np.repeat(np.arange(len(y)), w)
    got = weighted_metrics(["auroc", "auprc", "accuracy", "f1", "ece", "ppr", "tpr", "fpr"], y, proba, pred,
                           w[None, :].astype(float))
    yr, pr, predr = y[r], proba[r, 1], pred[r]
    cm = skm.confusion_matrix(yr, predr)
    want = {"auroc": skm.roc_auc_score(yr, pr), "auprc": skm.average_precision_score(yr, pr),
            "accuracy": skm.accuracy_score(yr, predr), "f1": skm.f1_score(yr, predr), "ece": binary_ece(yr, pr),
            "ppr": predr.mean(), "tpr": cm[1, 1] / cm[1].sum(), "fpr": cm[0, 1] / cm[0].sum()}
    for k, v in want.items():
        assert got[k][0] == pytest.approx(v, abs=1e-12), k


def test_multiclass_kernels_equal_sklearn_on_rows_repeated_by_weight():
    y, proba, pred = _multi()
    w = np.random.default_rng(5).integers(0, 3, len(y))
    r = np.repeat(np.arange(len(y)), w)
    got = weighted_metrics(["auroc_macro", "auprc_macro", "accuracy", "f1_macro", "ece_top_label", "tpr_macro",
                            "fpr_macro"], y, proba, pred, w.astype(float))
    yr, pr, predr = y[r], proba[r], pred[r]
    onehot = np.eye(3)[yr]
    cm = skm.confusion_matrix(yr, predr)
    fpr = [(cm[:, c].sum() - cm[c, c]) / (cm.sum() - cm[c].sum()) for c in range(3)]
    want = {"auroc_macro": skm.roc_auc_score(onehot, pr, average="macro"),
            "auprc_macro": skm.average_precision_score(onehot, pr, average="macro"),
            "accuracy": skm.accuracy_score(yr, predr), "f1_macro": skm.f1_score(yr, predr, average="macro"),
            "ece_top_label": top_label_ece(yr, pr),
            "tpr_macro": skm.recall_score(yr, predr, average="macro"), "fpr_macro": np.mean(fpr)}
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-12), k


def test_undefined_replicates_are_nan_not_errors():
    y, proba, pred = _binary(n=20)
    W = np.zeros((2, 20))
    W[0, y == 1] = 1  # resample 0 drew positives only: AUROC and FPR undefined
    out = weighted_metrics(["auroc", "fpr", "tpr"], y, proba, pred, W)
    assert np.isnan(out["auroc"]).all() and np.isnan(out["fpr"]).all()
    assert np.isfinite(out["tpr"][0]) and np.isnan(out["tpr"][1])
    with pytest.raises(KeyError, match="not defined for binary"):
        weighted_metrics(["auroc_macro"], y, proba, pred, W)


def _patients(n_patients=40, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([[f"p{i}"] * int(rng.integers(1, 5)) for i in range(n_patients)])


def test_cluster_bootstrap_keeps_patients_intact():
    clusters = _patients()
    rows_of = pd.Series(np.arange(len(clusters))).groupby(clusters).apply(list).to_dict()
    for idx in cluster_resample_indices(clusters, 200, make_rng(0, "t")):
        counts = np.bincount(idx, minlength=len(clusters))
        for pid, rows in rows_of.items():
            # every image of a patient appears exactly as often as the patient was drawn
            assert len(set(counts[rows])) == 1, pid
        assert len(pd.unique(clusters[idx])) <= len(rows_of)
        assert counts.sum() == len(idx)
    W = cluster_weights(clusters, 200, make_rng(0, "t"))
    idx = cluster_resample_indices(clusters, 200, make_rng(0, "t"))
    for b in range(200):  # same draws: the weight form is the index form's multiplicities
        assert np.array_equal(W[b], np.bincount(idx[b], minlength=len(clusters)))
    assert (W.sum(1) > 0).all()
    # the number of patients drawn per resample equals the number of patients (with replacement)
    per_patient = pd.DataFrame(W.T).groupby(clusters).first()
    assert (per_patient.sum(axis=0) == len(rows_of)).all()


def test_weighted_resample_equals_metric_on_resampled_rows():
    y, proba, pred = _binary(n=60)
    clusters = np.repeat(np.arange(30), 2)
    W = cluster_weights(clusters, 20, make_rng(3))
    idx = cluster_resample_indices(clusters, 20, make_rng(3))
    auc = weighted_metrics(["auroc"], y, proba, pred, W)["auroc"]
    for b in range(20):
        if len(np.unique(y[idx[b]])) == 2:
            assert auc[b] == pytest.approx(skm.roc_auc_score(y[idx[b]], proba[idx[b], 1]))


def test_cluster_bootstrap_rejects_missing_patient_ids():
    with pytest.raises(ValueError, match="no cluster"):
        cluster_weights(np.array(["a", None, "b"], dtype=object), 10, make_rng(0))


def test_rng_is_keyed_and_deterministic():
    a = make_rng(0, "x", 1).integers(0, 10**9, 5)
    assert np.array_equal(a, make_rng(0, "x", 1).integers(0, 10**9, 5))
    assert not np.array_equal(a, make_rng(0, "x", 2).integers(0, 10**9, 5))
    assert not np.array_equal(a, make_rng(1, "x", 1).integers(0, 10**9, 5))


def test_percentile_ci_and_p_value_hand_cases():
    reps = np.arange(1, 1001, dtype=float)  # 1..1000
    lo, hi, n = percentile_ci(np.r_[reps, np.nan], 0.95)
    assert n == 1000 and lo == pytest.approx(np.quantile(reps, 0.025)) and hi == pytest.approx(np.quantile(reps, 0.975))
    # all replicates above 0: p = 2 (1 + 0) / (B + 1)
    assert bootstrap_p_value(reps) == pytest.approx(2 / 1001)
    # symmetric around 0: no evidence
    assert bootstrap_p_value(np.r_[-reps, reps]) == pytest.approx(1.0)
    # 30 of 1000 at or below 0: p = 2 * 31 / 1001
    assert bootstrap_p_value(np.r_[-np.ones(30), np.ones(970)]) == pytest.approx(2 * 31 / 1001)
    assert np.isnan(bootstrap_p_value([np.nan]))


def test_benjamini_hochberg_hand_case_and_scipy():
    p = np.array([0.01, 0.04, 0.03, 0.5])
    # sorted 0.01, 0.03, 0.04, 0.5 -> p*m/rank 0.04, 0.06, 0.0533, 0.5 -> step-up minima 0.04, 0.0533, 0.0533, 0.5
    assert benjamini_hochberg(p) == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.5])
    rng = np.random.default_rng(0)
    q = rng.uniform(0, 0.2, 50)
    assert benjamini_hochberg(q) == pytest.approx(false_discovery_control(q, method="bh"))
    with_nan = benjamini_hochberg(np.r_[p, np.nan])
    assert np.isnan(with_nan[-1]) and with_nan[:4] == pytest.approx(benjamini_hochberg(p))


def test_hierarchical_mean_resamples_comparisons():
    same = [np.arange(100.0)] * 3
    assert hierarchical_mean_replicates(same, make_rng(0)) == pytest.approx(np.arange(100.0))
    spread = [np.zeros(2000), np.ones(2000)]
    r = hierarchical_mean_replicates(spread, make_rng(0))
    assert set(np.unique(r)) == {0.0, 0.5, 1.0}  # both, one or the other comparison drawn twice
    assert 0.4 < r.mean() < 0.6


def test_one_stage_resamples_the_point_deltas_as_focus_does():
    """FOCUS's summarize_deltas: NaN deltas dropped, then n_boot means of rng.choice(deltas, k, replace=True)."""
    deltas = np.array([0.0, 1.0, np.nan])
    r = one_stage_mean_replicates(deltas, make_rng(3), 1000)
    assert r.shape == (1000,) and set(np.unique(r)) <= {0.0, 0.5, 1.0}  # k = 2 finite deltas
    # by hand: replicate b is the mean of the two deltas at rng.integers(0, 2, 2) of that replicate's call
    rng = make_rng(3)
    by_hand = np.array([np.array([0.0, 1.0])[rng.integers(0, 2, size=2)].mean() for _ in range(1000)])
    np.testing.assert_array_equal(r, by_hand)
    assert 0.45 < np.mean(r == 0.5) < 0.55  # P(one of each) = 1/2
    lo, hi, _ = percentile_ci(r)
    assert (lo, hi) == (0.0, 1.0)
    # identical deltas: a zero-width interval (each comparison's own uncertainty is ignored)
    assert np.all(one_stage_mean_replicates([0.2, 0.2, 0.2], make_rng(0), 1000) == pytest.approx(0.2))
    with pytest.raises(ValueError, match="no finite comparison delta"):
        one_stage_mean_replicates([np.nan], make_rng(0), 1000)

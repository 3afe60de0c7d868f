"""Threshold rules on hand cases; point metrics vs scikit-learn on random data."""
import numpy as np
import pytest
from sklearn import metrics as skm

from retinabench.metrics.calibration import binary_ece, top_label_ece
from retinabench.metrics.thresholds import choose_threshold, point_metrics, predict

Y = np.array([0, 0, 1, 1])
P = np.array([0.1, 0.4, 0.35, 0.8])


def test_youden_hand_case_prefers_the_highest_of_tied_thresholds():
    # thresholds 0.8: J = .5 - 0; 0.4: .5 - .5; 0.35: 1 - .5 = .5 -> tie, highest (0.8) wins
    assert choose_threshold(Y, P, "youden") == (0.8, "")


def test_max_f1_hand_case():
    # >= .1: F1 2/3; >= .35: P 2/3 R 1 -> .8; >= .4: .5; >= .8: 2/3
    assert choose_threshold(Y, P, "f1") == (0.35, "")


def test_threshold_falls_back_with_a_reason():
    t, note = choose_threshold(np.array([1, 1, 1]), np.array([0.2, 0.6, 0.9]), "youden")
    assert t == 0.5 and "one class" in note
    t, note = choose_threshold(np.array([1, 0]), np.array([0.2, 0.9]), "youden")  # perfectly inverted scores
    assert t == 0.5 and "Youden J > 0" in note
    with pytest.raises(ValueError, match="unknown threshold rule"):
        choose_threshold(Y, P, "median")


def test_predict_rules():
    proba = np.c_[1 - P, P]
    assert predict(proba, "youden", 0.4).tolist() == [0, 1, 0, 1]
    assert predict(proba, "argmax").tolist() == [0, 0, 0, 1]
    with pytest.raises(ValueError, match="binary"):
        predict(np.full((2, 3), 1 / 3), "youden", 0.5)


@pytest.mark.parametrize("seed", [0, 1])
def test_binary_point_metrics_equal_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 300)
    p = np.clip(0.35 * y + rng.uniform(0, 0.65, 300), 0, 1)
    proba, pred = np.c_[1 - p, p], (p >= 0.45).astype(int)
    got = point_metrics(["auroc", "auprc", "accuracy", "f1", "ece", "ppr", "tpr", "fpr"], y, proba, pred)
    assert got["auroc"] == pytest.approx(skm.roc_auc_score(y, p))
    assert got["auprc"] == pytest.approx(skm.average_precision_score(y, p))
    assert got["accuracy"] == pytest.approx(skm.accuracy_score(y, pred))
    assert got["f1"] == pytest.approx(skm.f1_score(y, pred))
    assert got["ece"] == pytest.approx(binary_ece(y, p))
    assert got["ppr"] == pytest.approx(pred.mean())
    assert got["tpr"] == pytest.approx(skm.recall_score(y, pred))
    assert got["fpr"] == pytest.approx(1 - skm.recall_score(y, pred, pos_label=0))


def test_multiclass_point_metrics_equal_sklearn():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 400)
    proba = rng.dirichlet(np.ones(4), 400) + 0.6 * np.eye(4)[y]
    proba /= proba.sum(1, keepdims=True)
    pred = proba.argmax(1)
    got = point_metrics(["auroc_macro", "auprc_macro", "accuracy", "f1_macro", "ece_top_label", "tpr_macro"],
                        y, proba, pred)
    onehot = np.eye(4)[y]
    assert got["auroc_macro"] == pytest.approx(skm.roc_auc_score(y, proba, multi_class="ovr", average="macro"))
    assert got["auprc_macro"] == pytest.approx(skm.average_precision_score(onehot, proba, average="macro"))
    assert got["accuracy"] == pytest.approx(skm.accuracy_score(y, pred))
    assert got["f1_macro"] == pytest.approx(skm.f1_score(y, pred, average="macro"))
    assert got["ece_top_label"] == pytest.approx(top_label_ece(y, proba))
    assert got["tpr_macro"] == pytest.approx(skm.recall_score(y, pred, average="macro"))


def test_undefined_point_metrics_are_nan_and_unknown_names_fail():
    y = np.zeros(5, int)
    proba = np.c_[np.full(5, 0.7), np.full(5, 0.3)]
    got = point_metrics(["auroc", "tpr", "fpr"], y, proba, proba.argmax(1))
    assert np.isnan(got["auroc"]) and np.isnan(got["tpr"]) and got["fpr"] == 0.0
    with pytest.raises(KeyError, match="not defined"):
        point_metrics(["f1_macro"], y, proba, proba.argmax(1))

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from retinabench.metrics.classification import classification_metrics, expected_calibration_error, metrics_table


def test_ece_hand_computed():
    # Confidences 0.9 (correct), 0.9 (wrong) -> bin 9: acc 0.5 conf 0.9 -> 0.4 × 2/4;
    # 0.6 (correct), 0.6 (correct) -> bin 5: acc 1.0, conf 0.6 -> 0.4 × 2/4. ECE = 0.4.
    proba = np.array([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6], [0.6, 0.4]])
    y = np.array([0, 1, 1, 0])
    assert expected_calibration_error(y, proba) == pytest.approx(0.4)
    # A perfectly calibrated, perfectly confident classifier has ECE 0.
    assert expected_calibration_error(np.array([0, 1]), np.array([[1.0, 0.0], [0.0, 1.0]])) == 0.0


def test_metrics_match_sklearn_on_random_multiclass():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    proba = rng.dirichlet(np.ones(3), 300)
    m = classification_metrics(y, proba, ordinal=True)
    pred = proba.argmax(1)
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, pred))
    assert m["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, pred))
    assert m["auroc"] == pytest.approx(skm.roc_auc_score(y, proba, multi_class="ovr", average="macro"))
    assert m["kappa"] == pytest.approx(skm.cohen_kappa_score(y, pred, weights="quadratic"))
    assert m["f1_macro"] == pytest.approx(skm.f1_score(y, pred, average="macro"))
    ap = np.mean([skm.average_precision_score(y == k, proba[:, k]) for k in range(3)])
    assert m["auprc"] == pytest.approx(ap)
    assert classification_metrics(y, proba, ordinal=False)["kappa"] == pytest.approx(skm.cohen_kappa_score(y, pred))


def test_binary_uses_positive_class():
    y = np.array([0, 0, 1, 1])
    p1 = np.array([0.1, 0.4, 0.35, 0.8])
    m = classification_metrics(y, np.c_[1 - p1, p1], ordinal=False)
    assert m["auroc"] == pytest.approx(0.75)
    assert m["auprc"] == pytest.approx(skm.average_precision_score(y, p1))


def test_metrics_table_is_tidy():
    rng = np.random.default_rng(1)
    n = 40
    proba = rng.dirichlet(np.ones(2), n)
    df = pd.DataFrame({"image_id": [f"i{k}" for k in range(n)], "dataset": "d", "task": "t", "encoder": "e",
                       "protocol": "knn", "seed": 0, "regime": "u-u", "split": "test",
                       "y_true": rng.integers(0, 2, n), "y_pred": proba.argmax(1), "p_no": proba[:, 0],
                       "p_yes": proba[:, 1]})
    table = metrics_table(df, {"t": {"classes": ["no", "yes"], "ordinal": False}})
    assert len(table) == 7 and set(table["n"]) == {n}
    assert set(table["metric"]) == {"accuracy", "balanced_accuracy", "auroc", "auprc", "f1_macro", "kappa", "ece"}

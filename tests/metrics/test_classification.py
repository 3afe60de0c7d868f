import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from retinabench.metrics.calibration import top_label_ece
from retinabench.metrics.classification import classification_metrics, metrics_table


def test_ece_hand_computed():
    # Confidences 0.9 (correct), 0.9 (wrong) -> bin 9: acc 0.5 conf 0.9 -> 0.4 × 2/4;
    # 0.6 (correct), 0.6 (correct) -> bin 5: acc 1.0, conf 0.6 -> 0.4 × 2/4. ECE = 0.4.
    proba = np.array([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6], [0.6, 0.4]])
    y = np.array([0, 1, 1, 0])
    assert top_label_ece(y, proba) == pytest.approx(0.4)
    # A perfectly calibrated, perfectly confident classifier has ECE 0.
    assert top_label_ece(np.array([0, 1]), np.array([[1.0, 0.0], [0.0, 1.0]])) == 0.0


def test_metrics_match_sklearn_on_random_multiclass():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    proba = rng.dirichlet(np.ones(3), 300)
    pred = proba.argmax(1)
    m = classification_metrics(y, proba, pred, ordinal=True)
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, pred))
    assert m["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, pred))
    assert m["auroc"] == pytest.approx(skm.roc_auc_score(y, proba, multi_class="ovr", average="macro"))
    assert m["kappa"] == pytest.approx(skm.cohen_kappa_score(y, pred, weights="quadratic"))
    assert m["f1_macro"] == pytest.approx(skm.f1_score(y, pred, average="macro"))
    ap = np.mean([skm.average_precision_score(y == k, proba[:, k]) for k in range(3)])
    assert m["auprc"] == pytest.approx(ap)
    assert classification_metrics(y, proba, pred, ordinal=False)["kappa"] == pytest.approx(skm.cohen_kappa_score(y, pred))


def test_binary_uses_positive_class():
    y = np.array([0, 0, 1, 1])
    p1 = np.array([0.1, 0.4, 0.35, 0.8])
    m = classification_metrics(y, np.c_[1 - p1, p1], (p1 > 0.5).astype(int), ordinal=False)
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
    assert len(table) == 8 and set(table["n"]) == {n}
    assert set(table["metric"]) == {"accuracy", "balanced_accuracy", "auroc", "auprc", "f1_macro", "kappa", "ece",
                                    "ece_top_label"}


def _predictions(y, proba, y_pred, classes):
    n = len(y)
    df = pd.DataFrame({"image_id": [f"i{k}" for k in range(n)], "dataset": "d", "task": "t", "encoder": "e",
                       "protocol": "mllm", "seed": 0, "regime": "u-u", "split": "test", "y_true": y,
                       "y_pred": y_pred})
    for k, c in enumerate(classes):
        df[f"p_{c}"] = proba[:, k]
    return df


def test_hard_predictions_are_read_from_y_pred_not_recomputed():
    # A protocol whose decision is not the argmax (a parsed MLLM answer, a validation-chosen threshold): the
    # threshold metrics are those of y_pred as written; the ranking / calibration metrics use the probabilities.
    y = np.array([0, 0, 0, 1, 1, 1, 1, 0])
    p1 = np.array([0.1, 0.2, 0.6, 0.4, 0.45, 0.7, 0.9, 0.3])
    proba = np.c_[1 - p1, p1]
    y_pred = np.array([0, 0, 1, 1, 1, 1, 1, 1])  # a threshold of 0.3: differs from argmax in rows 3, 4, 7
    assert (y_pred != proba.argmax(1)).sum() == 3
    table = metrics_table(_predictions(y, proba, y_pred, ["no", "yes"]),
                          {"t": {"classes": ["no", "yes"], "ordinal": False}}).set_index("metric")["value"]
    assert table["accuracy"] == pytest.approx(skm.accuracy_score(y, y_pred)) == pytest.approx(6 / 8)
    assert table["accuracy"] != pytest.approx(skm.accuracy_score(y, proba.argmax(1)))
    assert table["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, y_pred))
    assert table["f1_macro"] == pytest.approx(skm.f1_score(y, y_pred, average="macro"))
    assert table["kappa"] == pytest.approx(skm.cohen_kappa_score(y, y_pred))
    assert table["auroc"] == pytest.approx(skm.roc_auc_score(y, p1))


def test_y_pred_outside_the_classes_is_an_error_naming_the_group():
    y = np.array([0, 1, 1, 0])
    proba = np.array([[0.8, 0.2], [0.3, 0.7], [0.4, 0.6], [0.6, 0.4]])
    with pytest.raises(ValueError, match=r"task 't'.*y_pred values \[2\]"):
        metrics_table(_predictions(y, proba, np.array([0, 1, 2, 0]), ["no", "yes"]),
                      {"t": {"classes": ["no", "yes"], "ordinal": False}})


def test_ece_vocabulary_binary_positive_class_and_top_label():
    # Binary: `ece` is the positive-class ECE (FOCUS), `ece_top_label` the top-label ECE; they differ.
    y = np.array([1, 0, 1, 0])
    p1 = np.array([0.8, 0.8, 0.3, 0.3])
    # positive class: bin (0.7,0.8] holds p=.8,.8 with outcome mean .5 -> .3 x 1/2; bin (0.2,0.3]: .3 vs .5 -> .2 x 1/2
    # top label: confidences .8,.8,.7,.7 correct 1,0,0,1 -> bins .8: |.5-.8| x 1/2, .7: |.5-.7| x 1/2
    m = classification_metrics(y, np.c_[1 - p1, p1], (p1 > 0.5).astype(int), ordinal=False)
    assert m["ece"] == pytest.approx(0.5 * 0.3 + 0.5 * 0.2)
    assert m["ece_top_label"] == pytest.approx(0.5 * 0.3 + 0.5 * 0.2)
    y2 = np.array([0, 0, 1, 1])
    p2 = np.array([0.8, 0.2, 0.9, 0.6])
    # positive class: bins .8 (0 vs .8), .2 (0 vs .2), .9 (1 vs .9), .6 (1 vs .6): (.8 + .2 + .1 + .4) / 4
    # top label: confidences .8 (wrong), .8 (right), .9, .6 (right): (2 x |.5 - .8| + .1 + .4) / 4
    m2 = classification_metrics(y2, np.c_[1 - p2, p2], (p2 > 0.5).astype(int), ordinal=False)
    assert m2["ece"] == pytest.approx((0.8 + 0.2 + 0.1 + 0.4) / 4)
    assert m2["ece_top_label"] == pytest.approx((0.6 + 0.1 + 0.4) / 4)


def test_multiclass_reports_top_label_ece_only():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 3, 60)
    proba = rng.dirichlet(np.ones(3), 60)
    m = classification_metrics(y, proba, proba.argmax(1), ordinal=False)
    assert "ece" not in m and m["ece_top_label"] == pytest.approx(top_label_ece(y, proba))

import numpy as np
import pandas as pd
import pytest
import torch

from retinabench.protocols.common import class_weights, warmup_cosine
from retinabench.protocols.frozen import run_frozen
from retinabench.protocols.knn import knn_predict_proba
from retinabench.protocols.linear import train_linear_probe
from retinabench.settings import LinearSettings

TASK = {"name": "t", "dataset": "d", "classes": ["a", "b"], "ordinal": False}


def blobs(n=300, dim=16, seed=0, shift=3.0):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(int)
    x = rng.normal(size=(n, dim)) + shift * y[:, None] * np.eye(dim)[0]
    return x.astype(np.float32), y


def test_class_weights_formula():
    w = class_weights(np.array([0] * 9 + [1] * 3), 2)
    expect = np.array([1 / np.log(10), 1 / np.log(4)])
    np.testing.assert_allclose(w, expect / expect.sum())
    with pytest.raises(ValueError, match="no training samples"):
        class_weights(np.array([0, 0]), 2)


def test_schedule_shape():
    f = warmup_cosine(1000, 0.1)
    assert f(0) == pytest.approx(0.01) and f(99) == pytest.approx(1.0)
    assert f(100) == pytest.approx(1.0) and f(550) == pytest.approx(0.5, abs=1e-3)
    assert f(999) < 1e-4
    assert all(f(i) <= f(i - 1) + 1e-12 for i in range(101, 1000))


def test_knn_probabilities_and_hand_case():
    train = np.array([[1, 0], [0.9, 0.1], [0, 1]], dtype=np.float32)
    y = np.array([0, 0, 1])
    p = knn_predict_proba(train, y, np.array([[1, 0.05]], dtype=np.float32), 2, k=2, temperature=0.1)
    assert p.shape == (1, 2) and p[0, 0] == pytest.approx(1.0)  # both nearest neighbours are class 0
    p = knn_predict_proba(train, y, np.array([[1, 1]], dtype=np.float32), 2, k=3, temperature=1e9)
    np.testing.assert_allclose(p, [[2 / 3, 1 / 3]], atol=1e-6)  # T -> inf: plain majority vote


def test_linear_probe_learns_selects_best_val_and_is_deterministic():
    x, y = blobs()
    cfg = LinearSettings(epochs=20, steps_per_epoch=10, lr=1e-2)
    h1, log1 = train_linear_probe(x[:200], y[:200], x[200:], y[200:], 2, seed=0, weighted=True, cfg=cfg)
    h2, log2 = train_linear_probe(x[:200], y[:200], x[200:], y[200:], 2, seed=0, weighted=True, cfg=cfg)
    assert torch.equal(h1.weight, h2.weight) and log1 == log2
    acc = (h1(torch.from_numpy(x[200:])).argmax(1).numpy() == y[200:]).mean()
    assert acc > 0.8
    best_epoch = min(log1, key=lambda r: r["val_loss"])["epoch"]
    # The returned head reproduces the best epoch's validation loss (standardisation folded in).
    weight = torch.tensor(class_weights(y[:200], 2), dtype=torch.float32)
    loss = torch.nn.functional.cross_entropy(h1(torch.from_numpy(x[200:])), torch.from_numpy(y[200:]), weight=weight)
    assert loss.item() == pytest.approx(log1[best_epoch]["val_loss"], rel=1e-4)
    h3, _ = train_linear_probe(x[:200], y[:200], x[200:], y[200:], 2, seed=1, weighted=True, cfg=cfg)
    assert not torch.equal(h1.weight, h3.weight)


def test_run_frozen_writes_every_protocol_seed_regime():
    x, y = blobs(n=400)
    rng = np.random.default_rng(0)
    split_name = rng.choice(["train", "val", "test"], size=len(y), p=[0.7, 0.15, 0.15])
    split = pd.DataFrame({"image_id": [f"i{k}" for k in range(len(y))], "y": y, "split": split_name})
    split["balanced"] = False
    for part in ("train", "val", "test"):
        idx = split.index[split["split"] == part]
        n_min = split.loc[idx, "y"].value_counts().min()
        for c in (0, 1):
            split.loc[split.loc[idx][split.loc[idx, "y"] == c].index[:n_min], "balanced"] = True
    cfg = {"linear": {"epochs": 10, "steps_per_epoch": 10, "lr": 1e-2}, "knn": {"k": 5}}
    preds, log = run_frozen(pd.Index(split["image_id"]), x, split, TASK, "enc", protocols=["knn", "linear", "logreg"],
                            seeds=[0, 1], regimes=["u-u", "u-b", "b-b", "b-u"], cfg=cfg)
    combos = preds.groupby(["protocol", "seed", "regime", "split"]).size()
    assert len(combos) == (1 + 2 + 1) * 4 * 2
    n_test_bal = int((split["balanced"] & (split["split"] == "test")).sum())
    assert combos[("knn", 0, "u-b", "test")] == n_test_bal
    assert combos[("knn", 0, "u-u", "test")] == int((split["split"] == "test").sum())
    np.testing.assert_allclose(preds[["p_a", "p_b"]].sum(axis=1), 1.0)
    assert set(log["train_regime"]) == {"u", "b"} and set(log["seed"]) == {0, 1}
    for protocol in ("knn", "linear", "logreg"):  # noqa: B007 (read by the query string)
        acc = preds.query("protocol == @protocol and split == 'test' and regime == 'u-u'")
        assert (acc["y_true"] == acc["y_pred"]).mean() > 0.75


def test_feature_constant_on_train_does_not_blow_up_validation():
    """A dead-ReLU-like feature (0 on every training image, large elsewhere) must not dominate the probe."""
    x, y = blobs(n=300)
    x = np.c_[x, np.zeros(len(x), dtype=np.float32)]
    x[200:, -1] = 50.0 * np.random.default_rng(1).random(100)
    cfg = LinearSettings(epochs=20, steps_per_epoch=10, lr=1e-2)
    head, log = train_linear_probe(x[:200], y[:200], x[200:], y[200:], 2, seed=0, weighted=True, cfg=cfg)
    assert min(r["val_loss"] for r in log) < 0.5
    assert (head(torch.from_numpy(x[200:])).argmax(1).numpy() == y[200:]).mean() > 0.8


def test_knn_k_larger_than_the_training_set_is_an_error_and_auto_is_resolved():
    from retinabench.protocols.knn import resolve_k
    train = np.eye(3, dtype=np.float32)
    with pytest.raises(ValueError, match="k = 4 but the training set has 3 images"):
        knn_predict_proba(train, np.array([0, 1, 1]), train[:1], 2, k=4, temperature=0.07)
    assert resolve_k("auto", 3) == 3 and resolve_k("auto", 500) == 20 and resolve_k(7, 500) == 7
    assert knn_predict_proba(train, np.array([0, 1, 1]), train[:1], 2, k="auto", temperature=0.07).shape == (1, 2)

"""Transfer protocol: probes trained on one dataset, evaluated on every dataset of the harmonised group."""
import numpy as np
import pandas as pd
import pytest

from retinabench.data.splits import make_split
from retinabench.protocols.frozen import run_frozen
from retinabench.protocols.transfer import run_transfer

CFG = {"linear": {"epochs": 5, "steps_per_epoch": 5, "batch_size": 32}, "logreg": {"C": 1.0, "max_iter": 500},
       "knn": {"k": 5}}


def _dataset(name, n_patients, shift, seed):
    rng = np.random.default_rng(seed)
    rows, feats = [], []
    for p in range(n_patients):
        y = int(rng.random() < 0.4)
        for k in range(int(rng.integers(1, 3))):
            rows.append({"image_id": f"P{p:03d}_{k}", "patient_id": f"P{p:03d}", "modality": "cfp",
                         "lab": ["no", "yes"][y]})
            feats.append(rng.normal(0, 1, 8) + 1.5 * y * np.eye(8)[0] + shift)
    task = {"name": f"{name}_any", "dataset": name, "label": "lab", "classes": ["no", "yes"], "modality": "cfp",
            "ordinal": False, "harmonised": "any_dr"}
    m = pd.DataFrame(rows)
    return task, (pd.Index(m["image_id"]), np.asarray(feats, dtype=np.float32)), make_split(m, task, seed=0)



@pytest.fixture(scope="module")
def two_sites():
    a = _dataset("A", 120, 0.0, 0)
    b = _dataset("B", 100, 2.0, 1)  # same image ids on purpose: rows are keyed by (dataset, image_id)
    return [a[0], b[0]], {"A": a[1], "B": b[1]}, {a[0]["name"]: a[2], b[0]["name"]: b[2]}


def test_every_source_is_evaluated_on_every_target(two_sites):
    tasks, feats, splits = two_sites
    preds = run_transfer(tasks, feats, splits, "enc", protocols=["logreg", "linear"], seeds=[0, 1],
                         regimes=["u-u", "b-u"], cfg=CFG)
    assert set(preds["regime"]) == {"u-u", "b-u"}
    pairs = preds[preds["split"] == "test"].groupby(["train_task", "task"]).size()
    assert set(pairs.index) == {(s, t) for s in ("A_any", "B_any") for t in ("A_any", "B_any")}
    val = preds[preds["split"] == "val"]
    assert (val["train_task"] == val["task"]).all()  # thresholds/temperatures come from the source only
    test = preds[preds["split"] == "test"]
    for (src, tgt, regime, protocol, seed), g in test.groupby(["train_task", "task", "regime", "protocol", "seed"]):
        split = splits[tgt]
        want = split[split["split"] == "test"]
        assert sorted(g["image_id"]) == sorted(want["image_id"]), (src, tgt, regime, protocol, seed)
    assert set(preds.loc[preds["protocol"] == "linear", "seed"]) == {0, 1}
    assert set(preds.loc[preds["protocol"] == "logreg", "seed"]) == {0}
    assert {"train_dataset", "train_task"} <= set(preds.columns)
    assert np.allclose(preds[["p_no", "p_yes"]].sum(axis=1), 1)


def test_in_distribution_rows_match_the_frozen_protocol(two_sites):
    tasks, feats, splits = two_sites
    preds = run_transfer(tasks, feats, splits, "enc", protocols=["logreg"], seeds=[0], regimes=["u-u"], cfg=CFG)
    ids, x = feats["A"]
    frozen, _ = run_frozen(ids, x, splits["A_any"], tasks[0], "enc", protocols=["logreg"], seeds=[0],
                           regimes=["u-u"], cfg=CFG)
    idd = preds[(preds["train_task"] == "A_any") & (preds["task"] == "A_any")]
    key = ["split", "image_id"]
    merged = idd.merge(frozen, on=key, suffixes=("", "_f"))
    assert len(merged) == len(frozen) and np.allclose(merged["p_yes"], merged["p_yes_f"])


def test_shifted_target_is_harder_out_of_distribution(two_sites):
    from sklearn.metrics import roc_auc_score
    tasks, feats, splits = two_sites
    preds = run_transfer(tasks, feats, splits, "enc", protocols=["knn"], seeds=[0], regimes=["u-u"], cfg=CFG)
    t = preds[(preds["split"] == "test") & (preds["task"] == "B_any")]
    auc = {src: roc_auc_score(g["y_true"], g["p_yes"]) for src, g in t.groupby("train_task")}
    assert auc["B_any"] > auc["A_any"]  # kNN neighbours of a shifted site come from the wrong cluster


def test_transfer_refuses_mismatched_groups(two_sites):
    tasks, feats, splits = two_sites
    with pytest.raises(ValueError, match="share classes"):
        run_transfer([tasks[0], {**tasks[1], "classes": ["a", "b"]}], feats, splits, "enc", protocols=["logreg"],
                     seeds=[0], regimes=["u-u"], cfg=CFG)
    with pytest.raises(KeyError, match="no features for 'B'"):
        run_transfer(tasks, {"A": feats["A"]}, splits, "enc", protocols=["logreg"], seeds=[0], regimes=["u-u"],
                     cfg=CFG)
    with pytest.raises(ValueError, match="at least two"):
        run_transfer(tasks[:1], feats, splits, "enc", protocols=["logreg"], seeds=[0], regimes=["u-u"], cfg=CFG)

"""Protocol sensitivity: each convention's two values on the same rows, with a known answer on small synthetic cases."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from retinabench.reliability.sensitivity import COLUMNS, Variant, add_calls, paired_variant_rows
from retinabench.reliability.sensitivity_run import (SensitivityInputs, bootstrap_rows, l2_normalised,
                                                     protocol_sensitivity)
from retinabench.settings import ReliabilitySettings

TASK = {"name": "t", "dataset": "d", "modality": "cfp", "classes": ["no", "yes"], "harmonised": None}
BOOT = {"n_boot": 1000, "level": 0.95, "seed": 0, "n_bins": 10}
KEYS = {"source": "frozen", "encoder": "e", "protocol": "logreg", "task": "t", "dataset": "d"}


def settings(**sens):
    return ReliabilitySettings.from_config({"reliability": {"protocol_sensitivity": {"enabled": True, **sens}}})


def manifest(n_patients, per_patient=1, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_patients):
        age, sex = float(rng.integers(30, 90)), ("female", "male")[(p // 2) % 2]
        rows += [{"dataset": "d", "image_id": f"P{p}_{k}", "patient_id": f"P{p}", "age": age, "sex": sex,
                  "quality": "good", "site": "s"} for k in range(per_patient)]
    return pd.DataFrame(rows)


def test_ece_bin_edges_known_answer():
    """y = [1, 0], p = [0.5, 0.45]: right-closed bins hold both in (0.4, 0.5] (ECE |0.475 - 0.5| = 0.025); FOCUS's
    left-closed bins split them (0.5 in [0.5, 0.6): ECE (0.5 + 0.45) / 2 = 0.475)."""
    y, p = np.array([1, 0]), np.array([0.5, 0.45])
    proba, pred = np.c_[1 - p, p], (p >= 0.5).astype(int)
    rows = paired_variant_rows("reliability.ece_bin_edges", ("right_closed", "focus"), Variant(proba, pred),
                               Variant(proba, pred, edges="focus"), y, np.array(["a", "b"]), ["ece"], 2,
                               keys=KEYS, **BOOT)
    (r,) = rows
    assert (r["value_a"], r["value_b"], r["delta"]) == pytest.approx((0.025, 0.475, 0.45))


def test_invalid_answers_keep_vs_drop_known_answer():
    """Six answers, two invalid: kept as wrong, accuracy 3/6; dropped, 3/4 on the four valid ones; AUROC of p_yes
    over all rows vs over the valid ones (sklearn)."""
    y = np.array([1, 1, 0, 0, 1, 0])
    pred = np.array([1, -1, 0, -1, 0, 0])
    p = np.array([0.9, 0.6, 0.2, 0.7, 0.4, 0.3])
    proba = np.c_[1 - p, p]
    keep = pred != -1
    rows = paired_variant_rows("mllm.invalid_answers", ("keep_as_wrong", "drop"), Variant(proba, pred),
                               Variant(proba, pred, keep=keep), y, np.array([f"P{i}" for i in range(6)]),
                               ["accuracy", "auroc"], 2, keys=KEYS, **BOOT)
    by = {r["metric"]: r for r in rows}
    assert (by["accuracy"]["value_a"], by["accuracy"]["value_b"]) == pytest.approx((0.5, 0.75))
    assert by["auroc"]["value_a"] == pytest.approx(roc_auc_score(y, p))
    assert by["auroc"]["value_b"] == pytest.approx(roc_auc_score(y[keep], p[keep]))
    assert (by["accuracy"]["n_a"], by["accuracy"]["n_b"]) == (6, 4)


def test_identical_variants_have_zero_delta_and_a_degenerate_ci():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    p = np.clip(0.3 * y + 0.7 * rng.random(200), 0, 1)
    proba = np.c_[1 - p, p]
    rows = paired_variant_rows("x", ("a", "b"), Variant(proba, proba.argmax(1)), Variant(proba, proba.argmax(1)),
                               y, np.arange(200).astype(str), ["auroc", "ece"], 2, keys=KEYS, **BOOT)
    for r in rows:
        assert r["delta"] == 0 and r["ci_low"] == 0 and r["ci_high"] == 0


def test_rank_flip_and_gap_significance_calls():
    t = pd.DataFrame([
        {"convention": "c", "source": "frozen", "protocol": "logreg", "task": "t", "metric": "auroc", "encoder": "e1",
         "value_a": 0.8, "value_b": 0.7, "skipped": False},
        {"convention": "c", "source": "frozen", "protocol": "logreg", "task": "t", "metric": "auroc", "encoder": "e2",
         "value_a": 0.75, "value_b": 0.78, "skipped": False},
        {"convention": "c", "source": "frozen", "protocol": "logreg", "task": "t", "metric": "ece", "encoder": "e1",
         "value_a": 0.1, "value_b": 0.05, "skipped": False},
        {"convention": "c", "source": "frozen", "protocol": "logreg", "task": "t", "metric": "ece", "encoder": "e2",
         "value_a": 0.2, "value_b": 0.1, "skipped": False},
        {"convention": "c", "source": "frozen", "protocol": "logreg", "task": "t", "metric": "auroc", "encoder": "e1",
         "attribute": "sex", "value_a": 0.1, "value_b": 0.0, "conclusion": "gap significance", "call_a": "+",
         "call_b": "0", "skipped": False},
    ])
    out = add_calls(t)
    assert list(out.columns) == COLUMNS
    assert out["call_a"].tolist()[:4] == ["rank 1 of 2", "rank 2 of 2", "rank 1 of 2", "rank 2 of 2"]
    assert out["call_b"].tolist()[:2] == ["rank 2 of 2", "rank 1 of 2"]   # AUROC order flips
    assert out["conclusion_changes"].tolist() == [True, True, False, False, True]  # ECE: lower is better, kept


def probe_world(n=160, seed=0):
    """Class 1 has the same direction as class 0 but three times its norm: the signal is in the norm only, so the
    L2-normalised (projected_l2) embedding loses it."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    direction = rng.normal(size=(n, 8)) * 0.05 + 1.0
    feats = (direction * np.where(y == 1, 3.0, 1.0)[:, None]).astype(np.float32)
    ids = pd.Index([f"P{i}_0" for i in range(n)])
    split = pd.DataFrame({"image_id": ids, "patient_id": [f"P{i}" for i in range(n)], "dataset": "d", "task": "t",
                          "label": np.where(y == 1, "yes", "no"), "y": y,
                          "split": np.where(np.arange(n) % 2 == 0, "train", "test"), "balanced": True})
    return ids, feats, split, manifest(n)


def test_probe_embedding_projected_l2_derived_loses_a_norm_signal():
    ids, feats, split, man = probe_world()
    inp = SensitivityInputs(settings(conventions=["features.probe_embedding"], metrics=["auroc"]), {"t": TASK}, man)
    features = {("features.probe_embedding", "e", "t"): {"pre_projection": (ids, feats),
                                                          "projected_l2": (ids, l2_normalised(feats))}}
    out = protocol_sensitivity(inp, preds=pd.DataFrame(), features=features, splits={"t": split},
                               logreg={"variant": "ours", "C": 1.0, "max_iter": "auto"},
                               configured={"features.probe_embedding": "pre_projection"}, encoder_order=["e"])
    overall = out[out["attribute"] == ""].iloc[0]
    assert overall["value_a"] == pytest.approx(1.0)
    assert overall["value_b"] < 0.75 and overall["ci_high"] < 0
    assert set(out["attribute"]) == {"", "age_median", "sex"}
    assert np.allclose(np.linalg.norm(l2_normalised(feats), axis=1), 1.0)


def test_logreg_variant_refits_both_variants_on_the_same_features():
    from retinabench.protocols.logreg import make_model
    from retinabench.settings.protocols import LogregSettings
    ids, feats, split, man = probe_world(seed=3)
    feats = feats + np.random.default_rng(1).normal(0, 1.0, feats.shape).astype(np.float32)
    inp = SensitivityInputs(settings(conventions=["logreg.variant"], metrics=["auroc"], attributes=[]),
                            {"t": TASK}, man)
    features = {("logreg.variant", "e", "t"): {"ours": (ids, feats), "focus": (ids, feats)}}
    out = protocol_sensitivity(inp, preds=pd.DataFrame(), features=features, splits={"t": split},
                               logreg={"variant": "focus", "C": 1.0, "max_iter": 50},
                               configured={"logreg.variant": "focus"}, encoder_order=["e"])
    tr, te = split["split"] == "train", split["split"] == "test"
    for side, variant in (("value_a", "ours"), ("value_b", "focus")):
        model = make_model(LogregSettings(variant=variant), 0).fit(feats[tr.to_numpy()], split["y"][tr])
        want = roc_auc_score(split["y"][te], model.predict_proba(feats[te.to_numpy()])[:, 1])
        assert out.iloc[0][side] == pytest.approx(want)


def comparison_world(n_patients=60, per_patient=3, seed=0):
    """Two encoders on one task; a patient's images are identical copies (perfectly correlated)."""
    rng = np.random.default_rng(seed)
    man = manifest(n_patients, per_patient)
    preds = []
    for task in ("t", "u"):
        for p in range(n_patients):
            y, noise = int(rng.random() < 0.4), rng.normal()
            for k in range(per_patient):
                for enc, s in (("weak", 0.5), ("good", 1.5)):
                    q = 1 / (1 + np.exp(-(s * (2 * y - 1) + noise)))
                    preds.append({"image_id": f"P{p}_{k}", "dataset": "d", "task": task, "encoder": enc,
                                  "protocol": "logreg", "seed": 0, "regime": "u-u", "split": "test", "y_true": y,
                                  "y_pred": int(q > 0.5), "p_no": 1 - q, "p_yes": q, "source": "frozen",
                                  "train_task": task, "train_dataset": "d"})
    return pd.DataFrame(preds), man


def test_bootstrap_summary_one_stage_of_one_comparison_has_no_width():
    preds, man = comparison_world()
    tasks = {"t": TASK, "u": {**TASK, "name": "u", "modality": "oct"}}
    inp = SensitivityInputs(settings(metrics=["auroc"]), tasks, man)
    rows = pd.DataFrame(bootstrap_rows(inp, "reliability.bootstrap.summary", preds, ["weak", "good"]))
    one = rows[rows["task"].isin(["modality=cfp", "modality=oct"])]
    assert len(one) == 2 and (one["value_b"] == 0).all() and (one["value_a"] > 0).all()
    assert (rows["delta"] == rows["value_b"] - rows["value_a"]).all()
    assert set(rows["encoder"]) == {"good - weak"}


def test_bootstrap_unit_image_narrower_than_patient_on_copied_images():
    preds, man = comparison_world()
    tasks = {"t": TASK, "u": {**TASK, "name": "u", "modality": "oct"}}
    inp = SensitivityInputs(settings(metrics=["auroc"]), tasks, man)
    rows = pd.DataFrame(bootstrap_rows(inp, "reliability.bootstrap.unit", preds, ["weak", "good"]))
    assert len(rows) == 2 and (rows["value_b"] < rows["value_a"]).all()
    assert set(rows["call_a"]) <= {"+", "-", "0"}


def test_invalid_answers_skipped_when_the_predictions_dropped_them():
    man = manifest(4)
    inp = SensitivityInputs(settings(conventions=["mllm.invalid_answers"]), {"t": TASK}, man)
    out = protocol_sensitivity(inp, preds=pd.DataFrame({"answer": []}), features={}, splits={}, logreg={},
                               configured={"mllm.invalid_answers": "drop"}, encoder_order=[])
    assert out["skipped"].all() and "drop" in out["reason"].iloc[0]


def test_unknown_attribute_is_named():
    with pytest.raises(KeyError, match="nope"):
        SensitivityInputs(settings(attributes=["nope"]), {"t": TASK}, manifest(2))


def test_table_matches_its_schema_and_the_figure_draws_each_compared_convention(tmp_path):
    from retinabench.figures.protocol_sensitivity import forest_plots
    from retinabench.schemas import KINDS, read_table, write_table
    ids, feats, split, man = probe_world()
    inp = SensitivityInputs(settings(conventions=["logreg.variant", "features.probe_embedding",
                                                  "mllm.invalid_answers"]), {"t": TASK}, man)
    features = {("logreg.variant", "e", "t"): {"ours": (ids, feats), "focus": (ids, feats)},
                ("features.probe_embedding", "e", "t"): {"pre_projection": (ids, feats),
                                                         "projected_l2": "not compared: a reason"}}
    out = protocol_sensitivity(inp, preds=pd.DataFrame(), features=features, splits={"t": split},
                               logreg={"variant": "ours", "C": 1.0, "max_iter": "auto"},
                               configured={"mllm.invalid_answers": "keep_as_wrong"}, encoder_order=["e"])
    assert KINDS["protocol_sensitivity"].names == COLUMNS
    write_table(out, tmp_path / "t.parquet", "protocol_sensitivity")
    back = read_table(tmp_path / "t.parquet", "protocol_sensitivity")
    skipped = back[back["skipped"]]
    assert set(skipped["convention"]) == {"features.probe_embedding", "mllm.invalid_answers"}
    assert "no MLLM predictions" in skipped[skipped["convention"] == "mllm.invalid_answers"]["reason"].iloc[0]
    paths = forest_plots(back, tmp_path / "fig")
    assert sorted(Path(p).name for p in paths) == ["logreg_variant.pdf", "logreg_variant.png"]


def test_every_convention_has_its_two_values_and_the_default_compares_all():
    from typing import get_args

    from retinabench.settings.reliability import SENSITIVITY_CONVENTIONS, SensitivityConvention
    assert list(get_args(SensitivityConvention)) == list(SENSITIVITY_CONVENTIONS)
    assert ReliabilitySettings().protocol_sensitivity.conventions == list(SENSITIVITY_CONVENTIONS)
    assert not ReliabilitySettings().protocol_sensitivity.enabled


def test_gaps_of_any_manifest_column_and_unknown_images_are_named():
    ids, feats, split, man = probe_world()
    man = man.assign(eye=np.where(np.arange(len(man)) % 4 < 2, "OD", "OS"))
    s = ReliabilitySettings.from_config({"reliability": {
        "attributes": [{"name": "eye", "column": "eye", "groups": ["OD", "OS"]}],
        "protocol_sensitivity": {"enabled": True, "attributes": ["eye"], "metrics": ["auroc"],
                                 "conventions": ["logreg.variant"]}}})
    inp = SensitivityInputs(s, {"t": TASK}, man)
    rows = inp.attach(split[split["split"] == "test"].assign(dataset="d"))
    assert set(rows["eye"]) == {"OD", "OS"}
    features = {("logreg.variant", "e", "t"): {"ours": (ids, feats), "focus": (ids, feats)}}
    out = protocol_sensitivity(inp, preds=pd.DataFrame(), features=features, splits={"t": split},
                               logreg={"variant": "ours", "C": 1.0, "max_iter": "auto"}, configured={},
                               encoder_order=["e"])
    assert not out["skipped"].any() and set(out["attribute"]) == {"", "eye"}
    with pytest.raises(KeyError, match="not in the manifest"):
        inp.attach(pd.DataFrame({"dataset": ["d"], "image_id": ["nope"]}))

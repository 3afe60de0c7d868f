"""The per-predictions-table evaluation: thresholds carried from validation, calibration, subgroups, coverage."""
import numpy as np
import pandas as pd
import pytest

from retinabench.metrics.thresholds import choose_threshold
from retinabench.reliability import KINDS, evaluate_predictions, summary_scores, table_columns
from retinabench.settings import ConfigError, ReliabilitySettings

TASK = {"name": "d_bin", "dataset": "d", "label": "lab", "classes": ["no", "yes"], "modality": "cfp",
        "ordinal": False}
TASK3 = {"name": "d_tri", "dataset": "d", "label": "g", "classes": ["a", "b", "c"], "modality": "cfp",
         "ordinal": True}


def world(n_patients=160, seed=0, with_attributes=True):
    """Manifest + split + predictions of one overconfident binary model (two seeds, one regime)."""
    rng = np.random.default_rng(seed)
    m, pred_rows = [], []
    for p in range(n_patients):
        part = "val" if p % 2 else "test"
        sex = "female" if rng.random() < 0.5 else "male"
        age = float(rng.integers(40, 86))
        for k in range(int(rng.integers(1, 3))):
            iid = f"P{p}_{k}"
            y = int(rng.random() < 0.4)
            m.append({"image_id": iid, "dataset": "d", "modality": "cfp", "patient_id": f"P{p}",
                      "age": age if with_attributes else np.nan, "sex": sex if with_attributes else None,
                      "quality": ("poor" if rng.random() < 0.2 else "good") if with_attributes else None,
                      "site": "A", "lab": ["no", "yes"][y], "split": part})
            z = 3.0 * ((2 * y - 1) * 0.8 + rng.normal(0, 1.2)) + 1.0  # overconfident and biased upwards
            for seed_ in (0, 1):
                q = 1 / (1 + np.exp(-(z + 0.1 * seed_)))
                pred_rows.append({"image_id": iid, "dataset": "d", "task": "d_bin", "encoder": "e", "protocol": "linear",
                                  "seed": seed_, "regime": "u-u", "split": part, "y_true": y, "y_pred": int(q > 0.5),
                                  "p_no": 1 - q, "p_yes": q})
    manifest = pd.DataFrame(m)
    split = manifest.assign(task="d_bin", label=manifest["lab"], y=(manifest["lab"] == "yes").astype(int),
                            balanced=False)[["image_id", "patient_id", "dataset", "task", "label", "y", "split"]]
    excl = pd.DataFrame([{"dataset": "d", "source": "x", "image_id": "gone", "scope": "image", "reason": "missing file"}])
    return manifest, excl, {"d_bin": split}, pd.DataFrame(pred_rows)


@pytest.fixture(scope="module")
def evaluated():
    manifest, excl, splits, preds = world()
    settings = ReliabilitySettings()
    return manifest, preds, evaluate_predictions(preds, manifest, excl, splits, {"d_bin": TASK}, settings,
                                                 source="frozen")


def test_tables_have_fixed_columns(evaluated):
    _, _, out = evaluated
    assert set(out) == set(KINDS)
    for kind in KINDS:
        if kind != "coverage":
            assert list(out[kind].columns) == table_columns(kind), kind


def test_validation_threshold_is_carried_unchanged_to_test(evaluated):
    _, preds, out = evaluated
    thr = out["thresholds"]
    for seed in (0, 1):
        val = preds[(preds["split"] == "val") & (preds["seed"] == seed)]
        t, _ = choose_threshold(val["y_true"], val["p_yes"], "youden")
        row = thr[(thr["seed"] == seed) & (thr["threshold"] == "youden")]
        assert row["value"].item() == pytest.approx(t)
        test = preds[(preds["split"] == "test") & (preds["seed"] == seed)]
        acc = ((test["p_yes"] >= t).astype(int) == test["y_true"]).mean()
        m = out["metrics"]
        got = m[(m["seed"] == seed) & (m["threshold"] == "youden") & (m["metric"] == "accuracy")]["value"].item()
        assert got == pytest.approx(acc)
    # test probabilities do not move the threshold: change them and re-evaluate
    manifest, excl, splits, preds2 = world()
    preds2.loc[preds2["split"] == "test", "p_yes"] = 0.99
    preds2["p_no"] = 1 - preds2["p_yes"]
    out2 = evaluate_predictions(preds2, manifest, excl, splits, {"d_bin": TASK}, ReliabilitySettings(),
                                source="frozen")
    pd.testing.assert_series_equal(out2["thresholds"]["value"], thr["value"])


def test_temperature_scaling_fitted_on_validation_lowers_test_ece(evaluated):
    _, _, out = evaluated
    cal = out["calibration"]
    assert (cal["temperature"] > 1.5).all()  # the model is overconfident
    assert (cal["ece_after"] < cal["ece_before"]).all() and (cal["nll_after"] < cal["nll_before"]).all()
    # one vocabulary: binary `ece` is the positive-class ECE, `ece_top_label` the top-label ECE (both reported)
    from retinabench.metrics.calibration import binary_ece, top_label_ece
    _, preds, _ = evaluated
    test = preds[(preds["split"] == "test") & (preds["seed"] == 0)]
    row = cal[cal["seed"] == 0].iloc[0]
    assert row["ece_before"] == pytest.approx(binary_ece(test["y_true"], test["p_yes"]))
    assert row["ece_top_label_before"] == pytest.approx(top_label_ece(test["y_true"], test[["p_no", "p_yes"]]))
    assert row["ece_before"] != pytest.approx(row["ece_top_label_before"])
    assert "ece_kind" not in cal.columns and set(out["bins"]["metric"]) == {"ece"}
    bins = out["bins"]
    assert set(bins["calibration"]) == {"before", "after"}
    assert (bins.groupby(["seed", "calibration"])["n"].sum() == cal["n"].iloc[0]).all()


def test_metrics_report_effective_n_and_ci(evaluated):
    _, preds, out = evaluated
    m = out["metrics"]
    n_test = (preds["split"] == "test").sum() // 2
    assert (m["n"] == n_test).all() and (m["n_patients"] == 80).all() and (m["n_boot"] == 1000).all()
    free = m[m["threshold"] == "none"]
    assert set(free["metric"]) == {"auroc", "auprc", "ece", "ece_top_label"}
    assert set(m.loc[m["threshold"] == "y_pred", "metric"]) == {"accuracy", "f1", "ppr", "tpr", "fpr"}
    assert set(m["bootstrap_unit"]) == {"patient"}
    assert ((m["ci_low"] <= m["value"] + 1e-12) & (m["value"] <= m["ci_high"] + 1e-12)).all()


def test_subgroups_gaps_and_coverage(evaluated):
    _, _, out = evaluated
    gaps = out["gaps"]
    assert set(gaps["attribute"]) == {"age_median", "age", "sex", "quality"}
    sex = gaps[(gaps["attribute"] == "sex") & (gaps["threshold"] == "y_pred")]
    assert (~sex["skipped"]).all() and sex["abs_gap_ci_low"].notna().all()
    cov = out["coverage"]
    assert {"test", "split", "images"} <= set(cov["scope"])
    assert cov.loc[cov["scope"] == "images", "reason"].str.contains("missing file").all()
    sub = out["subgroups"]
    assert set(sub.loc[sub["attribute"] == "sex", "group"]) == {"female", "male"}


def test_dataset_without_age_or_sex_is_skipped_with_the_reason_never_silently():
    manifest, excl, splits, preds = world(with_attributes=False)
    out = evaluate_predictions(preds, manifest, excl, splits, {"d_bin": TASK}, ReliabilitySettings(),
                               source="frozen")
    gaps = out["gaps"]
    assert gaps["skipped"].all()
    assert set(gaps.loc[gaps["attribute"] == "sex", "reason"]) == {"no sex values in these rows"}
    cov = out["coverage"]
    skipped = cov[(cov["status"] == "skipped") & cov["scope"].str.startswith("attribute:")]
    assert set(skipped["scope"]) == {"attribute:age_median", "attribute:age", "attribute:sex", "attribute:quality"}
    scores = summary_scores(gaps, out["metrics"], {"d_bin": TASK}, ReliabilitySettings())
    fair = scores[scores["score"] == "fairness"]
    assert fair["value"].isna().all() and fair["reason"].str.contains("no sex values").all()


def test_multiclass_uses_y_pred_only_and_top_label_ece():
    manifest, excl, splits, preds = world(n_patients=80)
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, len(preds))
    p = rng.dirichlet(np.ones(3), len(preds)) + np.eye(3)[y]
    p /= p.sum(1, keepdims=True)
    preds = preds.drop(columns=["p_no", "p_yes"]).assign(task="d_tri", y_true=y, y_pred=p.argmax(1),
                                                         p_a=p[:, 0], p_b=p[:, 1], p_c=p[:, 2])
    out = evaluate_predictions(preds, manifest, excl, {}, {"d_tri": TASK3}, ReliabilitySettings(), source="frozen")
    assert set(out["thresholds"]["threshold"]) == {"y_pred"}
    cal = out["calibration"]
    assert cal["ece_before"].isna().all() and cal["ece_top_label_before"].notna().all()  # no positive class
    assert set(out["bins"]["metric"]) == {"ece_top_label"}
    assert {"auroc_macro", "ece_top_label", "f1_macro"} <= set(out["metrics"]["metric"])
    assert "ece" not in set(out["metrics"]["metric"])
    ppr = out["gaps"][out["gaps"]["metric"] == "ppr"]
    assert ppr["skipped"].all() and ppr["reason"].str.contains("binary tasks only").all()
    cov = out["coverage"]
    assert cov.loc[cov["scope"] == "threshold", "reason"].str.contains("y_pred only").all()


def test_missing_columns_and_unknown_images_fail_by_name():
    manifest, excl, splits, preds = world(n_patients=20)
    with pytest.raises(KeyError, match=r"lack columns \['regime'\]"):
        evaluate_predictions(preds.drop(columns="regime"), manifest, excl, splits, {"d_bin": TASK},
                             ReliabilitySettings(), source="frozen")
    with pytest.raises(KeyError, match=r"lack probability columns \['p_yes'\]"):
        evaluate_predictions(preds.drop(columns="p_yes"), manifest, excl, splits, {"d_bin": TASK},
                             ReliabilitySettings(), source="frozen")
    with pytest.raises(KeyError, match="not in the manifest"):
        evaluate_predictions(preds, manifest.iloc[1:], excl, splits, {"d_bin": TASK}, ReliabilitySettings(),
                             source="frozen")
    with pytest.raises(ConfigError, match="reliability.bootstrap.n_resamples: unknown key"):
        ReliabilitySettings.from_config({"reliability": {"bootstrap": {"n_resamples": 10}}})
    with pytest.raises(ConfigError, match="reliability.bootstrap.n_boot: Input should be greater than or equal to 1000"):
        ReliabilitySettings.from_config({"reliability": {"bootstrap": {"n_boot": 100}}})


def test_hard_decisions_are_the_protocols_y_pred_as_written():
    # a protocol whose decision is not the argmax (a parsed MLLM answer, its own threshold): rule `y_pred` scores it
    manifest, excl, splits, preds = world(n_patients=60)
    preds["y_pred"] = (preds["p_yes"] >= 0.8).astype(int)
    assert (preds["y_pred"] != preds[["p_no", "p_yes"]].to_numpy().argmax(1)).any()
    out = evaluate_predictions(preds, manifest, excl, splits, {"d_bin": TASK}, ReliabilitySettings(),
                               source="frozen")
    m = out["metrics"]
    for seed in (0, 1):
        test = preds[(preds["split"] == "test") & (preds["seed"] == seed)]
        got = m[(m["seed"] == seed) & (m["threshold"] == "y_pred") & (m["metric"] == "accuracy")]["value"].item()
        assert got == pytest.approx((test["y_pred"] == test["y_true"]).mean())
    val = preds[(preds["split"] == "val") & (preds["seed"] == 0)]
    thr = out["thresholds"]
    row = thr[(thr["seed"] == 0) & (thr["threshold"] == "y_pred")].iloc[0]
    assert pd.isna(row["value"]) and row["val_accuracy"] == pytest.approx((val["y_pred"] == val["y_true"]).mean())


def test_bootstrap_unit_is_a_setting_recorded_in_the_tables():
    manifest, excl, splits, preds = world(n_patients=60)
    per = {}
    for unit in ("patient", "image"):
        settings = ReliabilitySettings.from_config({"reliability": {"bootstrap": {"unit": unit}}})
        out = evaluate_predictions(preds, manifest, excl, splits, {"d_bin": TASK}, settings, source="frozen")
        for kind in ("metrics", "gaps", "subgroups"):
            assert set(out[kind]["bootstrap_unit"]) == {unit}, kind
        per[unit] = out["metrics"].set_index(["seed", "threshold", "metric"])
    # same point estimates, other resampling: the intervals differ (patients have 1-2 images)
    pd.testing.assert_series_equal(per["patient"]["value"], per["image"]["value"])
    assert not np.allclose(per["patient"]["ci_low"], per["image"]["ci_low"])
    with pytest.raises(ConfigError, match="reliability.bootstrap.unit: Input should be 'patient' or 'image'"):
        ReliabilitySettings.from_config({"reliability": {"bootstrap": {"unit": "eye"}}})


def test_focus_ece_conventions_reach_every_ece_table():
    """reliability.ece_bin_edges and ece_one_class_strata: the metrics, calibration and bins tables bin as set;
    a quality stratum holding one class gets an ECE gap by default and none, with the reason, under focus."""
    from retinabench.metrics.calibration import binary_ece
    manifest, excl, splits, preds = world(n_patients=80)
    preds = preds.assign(p_yes=np.round(preds["p_yes"] * 20) / 20)  # half on a bin edge: the edges matter
    preds = preds.assign(p_no=1 - preds["p_yes"])
    # the "poor" stratum: positives only
    manifest = manifest.assign(quality=np.where(manifest["lab"] == "yes", manifest["quality"], "good"))
    out = {}
    for edges, one in (("right_closed", "compute"), ("focus", "focus")):
        settings = ReliabilitySettings.from_config({"reliability": {"ece_bin_edges": edges,
                                                                    "ece_one_class_strata": one}})
        out[edges] = evaluate_predictions(preds, manifest, excl, splits, {"d_bin": TASK}, settings, source="frozen")
    test = preds[(preds["split"] == "test") & (preds["seed"] == 0)]
    for edges, o in out.items():
        want = binary_ece(test["y_true"], test["p_yes"], 10, edges)
        m = o["metrics"]
        assert m.loc[(m["seed"] == 0) & (m["metric"] == "ece"), "value"].iloc[0] == pytest.approx(want)
        assert o["calibration"].loc[o["calibration"]["seed"] == 0, "ece_before"].iloc[0] == pytest.approx(want)
        b = o["bins"][(o["bins"]["seed"] == 0) & (o["bins"]["calibration"] == "before")]
        first = (test["p_yes"] <= 0.1) if edges == "right_closed" else (test["p_yes"] < 0.1)  # 0.1: bin 0 or 1
        assert b.loc[b["bin"] == 0, "n"].iloc[0] == first.sum()
    assert (test["p_yes"] == 0.1).any()
    assert binary_ece(test["y_true"], test["p_yes"], 10, "focus") != pytest.approx(
        binary_ece(test["y_true"], test["p_yes"]))
    gaps = {e: o["gaps"][(o["gaps"]["attribute"] == "quality") & (o["gaps"]["metric"] == "ece")]
            for e, o in out.items()}
    assert (~gaps["right_closed"]["skipped"]).all() and gaps["right_closed"]["abs_gap"].notna().all()
    assert gaps["focus"]["skipped"].all()
    assert gaps["focus"]["reason"].str.contains("group 'poor': one class only").all()


def test_temperature_not_fitted_on_a_small_validation_split_with_the_reason():
    manifest, excl, splits, preds = world(n_patients=40)  # ~30 validation images: < 30 of each class
    out = evaluate_predictions(preds, manifest, excl, splits, {"d_bin": TASK}, ReliabilitySettings(), source="frozen")
    cal = out["calibration"]
    assert (~cal["temperature_fitted"]).all() and cal["temperature"].isna().all()
    assert cal["ece_after"].isna().all() and cal["nll_after"].isna().all() and cal["ece_before"].notna().all()
    assert cal["note"].str.contains("not fitted: validation has fewer than 30 rows of a class").all()
    assert set(out["bins"]["calibration"]) == {"before"}  # no scaled variant drawn
    cov = out["coverage"]
    assert cov[(cov["scope"] == "calibration") & (cov["status"] == "skipped")]["reason"].str.startswith(
        "not fitted").all()
    # 1 per class: fitted on the same rows (the old behaviour, by name)
    loose = ReliabilitySettings(temperature_min_per_class=1)
    cal1 = evaluate_predictions(preds, manifest, excl, splits, {"d_bin": TASK}, loose, source="frozen")["calibration"]
    assert cal1["temperature_fitted"].all() and cal1["ece_after"].notna().all()


def test_gap_permutation_p_values_and_bh_within_families(evaluated):
    _, _, out = evaluated
    g = out["gaps"]
    done = g[~g["skipped"]]
    assert done["p_perm"].between(0, 1, inclusive="right").all() and (done["n_perm"] == 1000).all()
    assert set(done["perm_unit"]) == {"patient", "image"}  # sex and age per patient; quality varies per image
    assert (done["p_perm_bh"] >= done["p_perm"] - 1e-12).all()
    from retinabench.stats.bootstrap import benjamini_hochberg
    fam = done[(done["threshold"] == "y_pred") & (done["kind"] == "fairness") & (done["metric"] == "accuracy")]
    assert len(fam) > 2 and np.allclose(fam["p_perm_bh"], benjamini_hochberg(fam["p_perm"].to_numpy()))
    assert g.loc[g["skipped"], "p_perm"].isna().all() and g.loc[g["skipped"], "p_perm_bh"].isna().all()


def test_an_attribute_on_any_manifest_column_groups_the_rows():
    """A configured attribute may group by any manifest column (config/tvhl_sensitivity.yaml compares the eyes):
    the column is attached with the attributes, and a column the manifest lacks is an error naming it."""
    manifest, excl, splits, preds = world()
    manifest["eye"] = np.where(manifest["image_id"].str.endswith("_0"), "OD", "OS")
    settings = ReliabilitySettings.of({"attributes": [{"name": "eye", "column": "eye", "groups": ["OD", "OS"]}],
                                       "fairness_score_attributes": ["eye"]})
    out = evaluate_predictions(preds, manifest, excl, splits, {"d_bin": TASK}, settings, source="frozen")
    sub = out["subgroups"]
    assert set(sub.loc[sub["attribute"] == "eye", "group"]) == {"OD", "OS"}
    with pytest.raises(KeyError, match="eye"):
        evaluate_predictions(preds, manifest.drop(columns="eye"), excl, splits, {"d_bin": TASK}, settings,
                             source="frozen")

"""Subgroups, gap formulas on a hand case, minimum group sizes, planted subgroup differences, summary scores."""
import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from retinabench.metrics.fairness import Attribute, assign_groups, gap_score, shift_scores, subgroup_analysis
from retinabench.metrics.weighted import make_rng

SEX = Attribute(name="sex", column="sex", groups=("female", "male"), min_group_size=10)


def test_assign_groups_cuts_and_exclusions():
    df = pd.DataFrame({"age": [40, 55, 60, 61, 80, np.nan], "sex": ["female", "male", "x", None, "male", "female"]})
    lab, info = assign_groups(df, Attribute(name="age", column="age", cut=60))
    assert lab.tolist()[:5] == ["<60", "<60", ">=60", ">=60", ">=60"] and pd.isna(lab.iloc[5])
    assert info["cut"] == 60 and info["excluded"] == {"age unknown": 1}
    lab, info = assign_groups(df, Attribute(name="age_median", column="age", cut="median"))
    assert info["cut"] == 60 and lab.tolist()[:5] == ["<=median", "<=median", "<=median", ">median", ">median"]
    lab, info = assign_groups(df, SEX)
    assert lab.isna().tolist() == [False, False, True, True, False, False]
    assert info["excluded"] == {"sex unknown": 1, "sex value 'x' not in ['female', 'male']": 1}
    lab, info = assign_groups(df.assign(sex=None), SEX)
    assert info["unavailable"] == "no sex values in these rows" and lab.isna().all()
    with pytest.raises(KeyError, match="column 'site'"):
        assign_groups(df, Attribute(name="site", column="site"))


def _hand_case():
    yA = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    pA = [1, 1, 1, 0, 0, 0, 0, 0, 0, 1]   # TP3 FN1 FP1 TN5: acc .8, TPR .75, FPR 1/6, PPR .4
    yB = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    pB = [1, 1, 0, 0, 0, 1, 1, 0, 0, 0]   # TP2 FN3 FP2 TN3: acc .5, TPR .4, FPR .4, PPR .4
    y = np.array(yA + yB)
    pred = np.array(pA + pB)
    score = 0.25 + 0.5 * pred + np.linspace(0, 0.2, 20)
    proba = np.c_[1 - score, score]
    frame = pd.DataFrame({"sex": ["female"] * 10 + ["male"] * 10})
    patients = np.array([f"p{i // 2}" for i in range(20)])  # two images per patient
    return y, proba, pred, patients, frame


def test_gap_formulas_on_a_hand_case():
    y, proba, pred, patients, frame = _hand_case()
    lab, info = assign_groups(frame, SEX)
    groups, gaps = subgroup_analysis(y, proba, pred, patients, lab, SEX, info, n_boot=1000, rng=make_rng(0))
    g = {r["metric"]: r for r in gaps}
    assert g["accuracy"]["abs_gap"] == pytest.approx(0.3) and g["accuracy"]["gap_b_minus_a"] == pytest.approx(-0.3)
    assert g["tpr"]["abs_gap"] == pytest.approx(0.35)
    assert g["fpr"]["abs_gap"] == pytest.approx(0.4 - 1 / 6)
    assert g["ppr"]["abs_gap"] == pytest.approx(0.0)
    assert g["equalized_odds"]["abs_gap"] == pytest.approx(0.35)  # max(TPR gap, FPR gap)
    auc_a = skm.roc_auc_score(y[:10], proba[:10, 1])
    auc_b = skm.roc_auc_score(y[10:], proba[10:, 1])
    assert g["auroc"]["abs_gap"] == pytest.approx(abs(auc_a - auc_b))
    assert (g["accuracy"]["group_a"], g["accuracy"]["group_b"]) == ("female", "male")
    for r in gaps:
        assert not r["skipped"] and r["abs_gap_ci_low"] <= r["abs_gap"] + 1e-12 and r["n_valid"] > 800  # 10 patients: a few draws lack a class
    per_group = {(r["group"], r["metric"]): r["value"] for r in groups}
    assert per_group[("female", "accuracy")] == pytest.approx(0.8) and per_group[("male", "ppr")] == pytest.approx(0.4)


def test_minimum_group_size_skips_with_the_reason():
    y, proba, pred, patients, frame = _hand_case()
    frame.loc[:6, "sex"] = "male"  # female keeps 3 rows
    lab, info = assign_groups(frame, SEX)
    _, gaps = subgroup_analysis(y, proba, pred, patients, lab, SEX, info, n_boot=1000, rng=make_rng(0))
    assert all(r["skipped"] for r in gaps)
    assert "group 'female' has 3 rows < minimum 10" in gaps[0]["reason"]
    quality = Attribute(name="quality", column="sex", kind="quality", groups=("female", "male"), min_group_size=3)
    _, gaps = subgroup_analysis(y, proba, pred, patients, lab, quality, info, n_boot=1000, rng=make_rng(0))
    assert not any(r["skipped"] for r in gaps if r["metric"] in ("accuracy", "f1"))


def test_metric_needing_positives_is_skipped_per_metric():
    y, proba, pred, patients, frame = _hand_case()
    y = y.copy()
    y[:10] = 0  # no positive women: TPR, AUROC and EO undefined there, accuracy still fine
    lab, info = assign_groups(frame, SEX)
    _, gaps = subgroup_analysis(y, proba, pred, patients, lab, SEX, info, n_boot=1000, rng=make_rng(0))
    g = {r["metric"]: r for r in gaps}
    assert g["tpr"]["skipped"] and "group 'female': no positive rows" in g["tpr"]["reason"]
    assert g["auroc"]["skipped"] and g["equalized_odds"]["skipped"]
    assert not g["accuracy"]["skipped"] and not g["fpr"]["skipped"]


def phantom_like(n_patients=240, effect=0.0, seed=0):
    """Patients with 1-4 images, sex and age per patient, a patient-level random effect; ``effect`` lowers the
    model's signal for men only (the planted subgroup difference)."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_patients):
        sex = "female" if rng.random() < 0.5 else "male"
        age = float(rng.integers(40, 86))
        u = rng.normal(0, 0.6)
        for _k in range(int(rng.integers(1, 5))):
            y = int(rng.random() < 0.4)
            signal = 2.5 - (effect if sex == "male" else 0.0)
            z = signal * (2 * y - 1) + u + rng.normal(0, 1.0)
            rows.append({"patient_id": f"P{p}", "sex": sex, "age": age, "y": y, "p": 1 / (1 + np.exp(-z))})
    return pd.DataFrame(rows)


def _gaps(df, attr):
    proba = np.c_[1 - df["p"], df["p"]]
    lab, info = assign_groups(df, attr)
    _, gaps = subgroup_analysis(df["y"].to_numpy(), proba, proba.argmax(1), df["patient_id"].to_numpy(), lab, attr,
                                info, n_boot=1000, rng=make_rng(7, attr.name))
    return {r["metric"]: r for r in gaps}


def test_planted_subgroup_difference_is_detected():
    g = _gaps(phantom_like(effect=2.0), SEX)
    assert g["accuracy"]["flagged"] and g["accuracy"]["gap_b_minus_a_ci_high"] < 0  # men worse: CI of b - a below 0
    assert g["equalized_odds"]["flagged"] and g["auroc"]["flagged"]
    # age carries no planted difference in the same data
    age = _gaps(phantom_like(effect=2.0), Attribute(name="age_median", column="age", cut="median"))
    assert not age["accuracy"]["flagged"]


def test_no_planted_difference_is_not_flagged():
    g = _gaps(phantom_like(effect=0.0), SEX)
    for metric in ("accuracy", "tpr", "fpr", "auroc", "equalized_odds", "ppr"):
        assert not g[metric]["flagged"], (metric, g[metric])
        if metric != "equalized_odds":
            assert g[metric]["gap_b_minus_a_ci_low"] <= 0 <= g[metric]["gap_b_minus_a_ci_high"]


def test_gap_score_formula_hand_case():
    gaps = pd.DataFrame([
        {"kind": "fairness", "attribute": "sex", "metric": "equalized_odds", "abs_gap": 0.35, "skipped": False, "reason": ""},
        {"kind": "fairness", "attribute": "sex", "metric": "accuracy", "abs_gap": 0.30, "skipped": False, "reason": ""},
        {"kind": "fairness", "attribute": "sex", "metric": "auroc", "abs_gap": 0.10, "skipped": False, "reason": ""},
        {"kind": "fairness", "attribute": "sex", "metric": "tpr", "abs_gap": 0.90, "skipped": False, "reason": ""},
        {"kind": "fairness", "attribute": "age_median", "metric": "equalized_odds", "abs_gap": 0.20, "skipped": False,
         "reason": ""},
        {"kind": "fairness", "attribute": "age_median", "metric": "accuracy", "abs_gap": np.nan, "skipped": True,
         "reason": "small"},
        {"kind": "fairness", "attribute": "age", "metric": "accuracy", "abs_gap": 0.99, "skipped": False, "reason": ""},
        {"kind": "quality", "attribute": "quality", "metric": "accuracy", "abs_gap": 0.1, "skipped": False, "reason": ""},
        {"kind": "quality", "attribute": "quality", "metric": "auroc_macro", "abs_gap": 0.3, "skipped": False,
         "reason": ""},
        {"kind": "quality", "attribute": "quality", "metric": "auprc", "abs_gap": 0.2, "skipped": False, "reason": ""},
        {"kind": "quality", "attribute": "quality", "metric": "f1", "abs_gap": 0.4, "skipped": False, "reason": ""},
        {"kind": "quality", "attribute": "quality", "metric": "ece", "abs_gap": np.nan, "skipped": True, "reason": "x"},
    ])
    fair = gap_score(gaps, ["age_median", "sex"], "fairness")
    assert fair["value"] == pytest.approx(1 - (0.35 + 0.30 + 0.10 + 0.20) / 4) and fair["n_components"] == 4
    assert "age_median:accuracy skipped (small)" in fair["reason"]
    quality = gap_score(gaps, None, "quality")  # the quality gaps: accuracy, AUROC, AUPRC, F1, ECE
    assert quality["value"] == pytest.approx(1 - (0.1 + 0.3 + 0.2 + 0.4) / 4) and quality["n_components"] == 4
    assert "quality:ece skipped (x)" in quality["reason"]
    none = gap_score(gaps[gaps["attribute"] == "nothing"], ["sex"], "fairness")
    assert np.isnan(none["value"]) and none["reason"]


def test_shift_score_hand_case():
    tasks = {"a_any": {"dataset": "A", "modality": "cfp", "classes": ["no", "yes"], "harmonised": "any_dr"},
             "b_any": {"dataset": "B", "modality": "cfp", "classes": ["no", "yes"], "harmonised": "any_dr"},
             "c_gon": {"dataset": "C", "modality": "cfp", "classes": ["no", "yes"], "harmonised": "gon"}}
    m = pd.DataFrame([
        {"encoder": "e", "dataset": "A", "task": "a_any", "metric": "auroc", "value": 0.8},
        {"encoder": "e", "dataset": "A", "task": "a_any", "metric": "auroc", "value": 0.9},
        {"encoder": "e", "dataset": "B", "task": "b_any", "metric": "auroc", "value": 0.7},
        {"encoder": "e", "dataset": "B", "task": "b_any", "metric": "accuracy", "value": 0.1},
        {"encoder": "e", "dataset": "C", "task": "c_gon", "metric": "auroc", "value": 0.7},
    ])
    out = shift_scores(m, tasks, keys=["encoder"]).set_index("group")
    assert out.loc["any_dr_cfp", "value"] == pytest.approx(1 - (0.85 - 0.7))
    assert np.isnan(out.loc["gon_cfp", "value"]) and "needs >= 2 datasets" in out.loc["gon_cfp", "reason"]


def test_age_median_split_puts_ties_with_the_rest_as_focus():
    # FOCUS: ages above the median of the analysed rows form one group, the rest the other
    ages = [50, 55, 60, 60, 60, 60, 65, 70, 70, 80]
    lab, info = assign_groups(pd.DataFrame({"age": ages}), Attribute(name="age_median", column="age", cut="median"))
    assert info["cut"] == 60 and info["groups"] == ["<=median", ">median"]
    assert lab.value_counts().to_dict() == {"<=median": 6, ">median": 4}


QUALITY = Attribute(name="quality", column="quality", kind="quality", groups=("good", "poor"), min_group_size=5)


def test_quality_gaps_are_accuracy_auroc_auprc_f1_and_ece():
    y, proba, pred, patients, frame = _hand_case()
    frame = frame.assign(quality=np.where(frame["sex"] == "female", "good", "poor"))
    lab, info = assign_groups(frame, QUALITY)
    _, gaps = subgroup_analysis(y, proba, pred, patients, lab, QUALITY, info, n_boot=1000, rng=make_rng(0))
    g = {r["metric"]: r for r in gaps}
    assert set(g) == {"accuracy", "auroc", "auprc", "f1", "ece"}
    assert g["accuracy"]["abs_gap"] == pytest.approx(0.3)
    assert g["f1"]["abs_gap"] == pytest.approx(abs(skm.f1_score(y[:10], pred[:10]) - skm.f1_score(y[10:], pred[10:])))
    assert g["auprc"]["abs_gap"] == pytest.approx(abs(skm.average_precision_score(y[:10], proba[:10, 1])
                                                  - skm.average_precision_score(y[10:], proba[10:, 1])))
    from retinabench.metrics.calibration import binary_ece
    assert g["ece"]["abs_gap"] == pytest.approx(abs(binary_ece(y[:10], proba[:10, 1]) - binary_ece(y[10:], proba[10:, 1])))
    # multi-class quality strata: the macro / top-label variants
    rng = np.random.default_rng(0)
    y3 = rng.integers(0, 3, 20)
    p3 = rng.dirichlet(np.ones(3), 20)
    _, gaps3 = subgroup_analysis(y3, p3, p3.argmax(1), patients, lab, QUALITY, info, n_boot=1000, rng=make_rng(0))
    assert {r["metric"] for r in gaps3} == {"accuracy", "auroc_macro", "auprc_macro", "f1_macro", "ece_top_label"}


def test_one_class_quality_stratum_ece_compute_vs_focus():
    y, proba, pred, patients, frame = _hand_case()
    y = y.copy()
    y[:10] = 1  # the "good" stratum holds positives only
    frame = frame.assign(quality=np.where(frame["sex"] == "female", "good", "poor"))
    lab, info = assign_groups(frame, QUALITY)
    from retinabench.metrics.calibration import binary_ece

    def run(**kw):
        groups, gaps = subgroup_analysis(y, proba, pred, patients, lab, QUALITY, info, n_boot=1000,
                                         rng=make_rng(0), **kw)
        return ({(r["group"], r["metric"]): r for r in groups}, {r["metric"]: r for r in gaps})

    groups, g = run()  # default: compute, the one-class stratum's ECE has a value and so has its gap
    assert not g["ece"]["skipped"]
    assert groups[("good", "ece")]["value"] == pytest.approx(binary_ece(y[:10], proba[:10, 1]))
    assert g["ece"]["abs_gap"] == pytest.approx(abs(binary_ece(y[:10], proba[:10, 1]) - binary_ece(y[10:], proba[10:, 1])))
    groups, g = run(one_class_ece="focus")  # FOCUS: no ECE on one class, so no gap; the reason is recorded
    assert g["ece"]["skipped"] and "group 'good': one class only (ece_one_class_strata: focus)" == g["ece"]["reason"]
    assert np.isnan(groups[("good", "ece")]["value"]) and "one class only" in groups[("good", "ece")]["reason"]
    assert groups[("poor", "ece")]["value"] == pytest.approx(binary_ece(y[10:], proba[10:, 1]))
    assert not g["accuracy"]["skipped"] and not g["f1"]["skipped"]  # the rule is about ECE only
    with pytest.raises(ValueError, match="ece_one_class_strata"):
        run(one_class_ece="drop")


def test_quality_ece_uses_the_configured_bins():
    y, proba, pred, patients, frame = _hand_case()
    frame = frame.assign(quality=np.where(frame["sex"] == "female", "good", "poor"))
    lab, info = assign_groups(frame, QUALITY)
    from retinabench.metrics.calibration import binary_ece
    # 5 bins move this case's ECE gap (0.2 with 10 bins, either edges; 0.2295 with 5): the settings reach the gaps
    for edges, n_bins in (("focus", 10), ("right_closed", 5)):
        _, gaps = subgroup_analysis(y, proba, pred, patients, lab, QUALITY, info, n_boot=1000, rng=make_rng(0),
                                    n_bins=n_bins, edges=edges)
        g = {r["metric"]: r for r in gaps}
        assert g["ece"]["abs_gap"] == pytest.approx(abs(binary_ece(y[:10], proba[:10, 1], n_bins, edges)
                                                    - binary_ece(y[10:], proba[10:, 1], n_bins, edges)))
        assert n_bins == 10 or g["ece"]["abs_gap"] == pytest.approx(0.22947368, abs=1e-6)

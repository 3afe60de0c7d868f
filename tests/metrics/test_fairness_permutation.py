"""Signed gaps and the permutation test of "no gap": ~uniform p-values under no gap, small under a planted gap,
patients permuted together, the +1 correction."""
import numpy as np
import pandas as pd
import pytest

from retinabench.metrics.fairness import (Attribute, assign_groups, permutation_p_value, permuted_groups,
                                          subgroup_analysis)
from retinabench.metrics.weighted import make_rng

SEX = Attribute(name="sex", column="sex", groups=("female", "male"))


def cohort(n_patients=60, effect=0.0, seed=0):
    """1-3 images per patient, sex per patient; ``effect`` weakens the model's signal for men only."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_patients):
        sex = "female" if rng.random() < 0.5 else "male"
        for _ in range(int(rng.integers(1, 4))):
            y = int(rng.random() < 0.5)
            z = (2.0 - (effect if sex == "male" else 0.0)) * (2 * y - 1) + rng.normal(0, 1.5)
            rows.append({"patient_id": f"P{p}", "sex": sex, "quality": rng.choice(["good", "poor"]), "y": y,
                         "p": 1 / (1 + np.exp(-z))})
    return pd.DataFrame(rows)


def gaps_of(df, attr=SEX, n_boot=1000, n_perm=999, seed=0):
    proba = np.c_[1 - df["p"], df["p"]]
    lab, info = assign_groups(df, attr)
    _, gaps = subgroup_analysis(df["y"].to_numpy(), proba, proba.argmax(1), df["patient_id"].to_numpy(), lab, attr,
                                info, n_boot=n_boot, rng=make_rng(seed, "boot"), n_perm=n_perm,
                                perm_rng=make_rng(seed, "perm"))
    return {r["metric"]: r for r in gaps}


def test_p_value_counts_the_observed_labelling():
    assert permutation_p_value(0.5, np.array([0.1, 0.2, 0.5, np.nan])) == pytest.approx(2 / 4)  # NaN left out
    assert permutation_p_value(0.9, np.array([0.1, 0.2])) == pytest.approx(1 / 3)  # never 0
    assert np.isnan(permutation_p_value(0.3, np.array([np.nan])))


def test_permutation_moves_patients_together_unless_the_attribute_varies_within_them():
    df = cohort()
    groups = ["female", "male"]
    P, unit = permuted_groups(df["sex"], df["patient_id"], groups, 50, make_rng(0))
    assert unit == "patient" and P.shape == (50, len(df))
    for row in P[:5]:  # every patient's images share one permuted group; the number of patients per group is kept
        per = pd.Series(row).groupby(df["patient_id"].to_numpy()).nunique()
        assert (per == 1).all()
        assert pd.Series(row).groupby(df["patient_id"].to_numpy()).first().sum() == \
            (df.groupby("patient_id")["sex"].first() == "male").sum()
    assert not (P == P[0]).all()  # the permutations differ
    _, unit = permuted_groups(df["quality"], df["patient_id"], ["good", "poor"], 5, make_rng(0))
    assert unit == "image"


def test_signed_and_absolute_gap_columns():
    g = gaps_of(cohort(n_patients=120), n_perm=199)
    acc = g["accuracy"]
    assert acc["group_a"] == "female" and acc["group_b"] == "male"  # the declared order: b - a
    assert acc["gap_b_minus_a"] == pytest.approx(acc["value_b"] - acc["value_a"])
    assert acc["abs_gap"] == pytest.approx(abs(acc["gap_b_minus_a"]))
    assert acc["gap_b_minus_a_ci_low"] <= 0 <= acc["gap_b_minus_a_ci_high"]  # no gap: the signed CI holds 0
    assert acc["abs_gap_ci_low"] >= 0 and acc["perm_unit"] == "patient" and acc["n_perm"] == 199
    eo = g["equalized_odds"]  # a max of two absolute gaps: no signed value, but a permutation test
    assert pd.isna(eo.get("gap_b_minus_a")) and 0 < eo["p_perm"] <= 1


def test_planted_gap_gives_a_small_p_value():
    g = gaps_of(cohort(n_patients=200, effect=2.0))
    for metric in ("accuracy", "tpr", "auroc", "equalized_odds"):
        assert g[metric]["p_perm"] < 0.01, (metric, g[metric]["p_perm"])
    assert g["accuracy"]["gap_b_minus_a_ci_high"] < 0  # men worse


def test_p_values_are_about_uniform_under_no_gap():
    ps = []
    for rep in range(200):
        g = gaps_of(cohort(n_patients=40, seed=rep + 1), n_boot=1000, n_perm=199, seed=rep)
        ps.append(g["auroc"]["p_perm"])
    ps = np.array(ps)
    assert np.isfinite(ps).all()
    frac = float((ps < 0.05).mean())
    assert 0.01 <= frac <= 0.10, frac  # 0.05 +- 2.3 sd over 200 repeats
    assert 0.4 < ps.mean() < 0.6 and 0.15 < float((ps < 0.25).mean()) < 0.35

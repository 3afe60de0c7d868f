"""ECE on hand-computed cases, reliability bins, temperature scaling fitted on validation."""
import numpy as np
import pytest

from retinabench.metrics import calibration as cal


def test_binary_ece_hand_case():
    y = np.array([0, 1, 0, 1])
    p = np.array([0.05, 0.15, 0.15, 0.95])
    # bins: 0.05 -> (0, .1]; 0.15 x2 -> (.1, .2]; 0.95 -> (.9, 1]
    # |0 - .05| * 1/4 + |.5 - .15| * 2/4 + |1 - .95| * 1/4 = .0125 + .175 + .0125
    assert cal.binary_ece(y, p) == pytest.approx(0.2)
    assert cal.ece(y, np.c_[1 - p, p]) == pytest.approx(0.2)


def test_bin_edges_are_right_closed():
    # 0.1 belongs to bin 0 ((0, .1]), 0.100001 to bin 1, 0 to bin 0, 1 to bin 9
    b = cal.reliability_bins(np.array([1, 0, 0, 1]), np.c_[[0.9, 1 - 0.100001, 1.0, 0.0], [0.1, 0.100001, 0.0, 1.0]])
    assert b.loc[0, "n"] == 2 and b.loc[1, "n"] == 1 and b.loc[9, "n"] == 1
    assert b["n"].sum() == 4 and np.isnan(b.loc[5, "mean_prob"])
    assert b.loc[0, "observed"] == pytest.approx(0.5)  # positives among {0.1 (y=1), 0.0 (y=0)}


def test_multiclass_ece_is_top_label_and_matches_classification():
    rng = np.random.default_rng(0)
    proba = rng.dirichlet(np.ones(3), 200)
    y = rng.integers(0, 3, 200)
    assert cal.ece(y, proba) == pytest.approx(cal.top_label_ece(y, proba))
    # hand case: top-label confidences .6 (correct), .7 (wrong) -> bins 5 and 6: (.4 + .7) / 2
    p = np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1]])
    assert cal.ece(np.array([0, 0]), p) == pytest.approx((0.4 + 0.7) / 2)


def _overconfident(n, seed, scale=4.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    true_logit = rng.normal(0, 1.5, n) + (2 * y - 1) * 0.8
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-true_logit))).astype(int)
    z = scale * true_logit  # scores with the right ranking but 4x too confident
    p = 1 / (1 + np.exp(-z))
    return y, np.c_[1 - p, p]


def test_temperature_scaling_lowers_ece_of_an_overconfident_model():
    yv, pv = _overconfident(2000, 0)
    yt, pt = _overconfident(2000, 1)
    t, note = cal.fit_temperature(yv, pv)
    assert note == "" and 3.0 < t < 5.5  # recovers roughly the 4x overconfidence
    after = cal.apply_temperature(pt, t)
    assert cal.ece(yt, after) < 0.5 * cal.ece(yt, pt)
    assert cal.nll(yt, after) < cal.nll(yt, pt)
    assert np.array_equal(after.argmax(1), pt.argmax(1))  # scaling never changes the decision


def test_temperature_below_one_for_an_underconfident_model():
    yv, pv = _overconfident(2000, 2, scale=0.3)
    t, _ = cal.fit_temperature(yv, pv)
    assert t < 0.6


def test_temperature_handles_hard_zeros_and_no_rows():
    p = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # kNN-style hard votes
    scaled = cal.apply_temperature(p, 2.0)
    assert np.isfinite(scaled).all() and np.allclose(scaled.sum(1), 1)
    assert cal.apply_temperature(p, 1.0) == pytest.approx(np.clip(p, 1e-7, 1) / np.clip(p, 1e-7, 1).sum(1, keepdims=True))
    t, why = cal.fit_temperature(np.array([], int), np.empty((0, 2)))
    assert np.isnan(t) and why == "not fitted: no validation rows"


def test_temperature_not_fitted_with_too_few_rows_of_a_class():
    yv, pv = _overconfident(2000, 0)
    keep = np.r_[np.flatnonzero(yv == 0), np.flatnonzero(yv == 1)[:29]]  # 29 positives
    t, why = cal.fit_temperature(yv[keep], pv[keep], min_per_class=30)
    assert np.isnan(t) and "fewer than 30 rows of a class (class 1: 29" in why
    keep = np.r_[np.flatnonzero(yv == 0), np.flatnonzero(yv == 1)[:30]]  # 30: fitted
    t, why = cal.fit_temperature(yv[keep], pv[keep], min_per_class=30)
    assert why == "" and t > 1
    # three classes: the missing class counts as 0 rows
    t, why = cal.fit_temperature(np.zeros(50, int), np.full((50, 3), 1 / 3), min_per_class=30)
    assert np.isnan(t) and "class 1: 0, class 2: 0" in why


def test_issue_case_focus_left_closed_bins_vs_ours():
    # y = [1, 0], p = [0.5, 0.45] with 10 bins (issue 26's case).
    # ours (i/10, (i+1)/10]: 0.5 and 0.45 both in (.4, .5] -> |1/2 - 0.475| = 0.025
    # focus [i/10, (i+1)/10): 0.5 in [.5, .6), 0.45 in [.4, .5) -> 1/2 |1 - .5| + 1/2 |0 - .45| = 0.475
    y, p = np.array([1, 0]), np.array([0.5, 0.45])
    assert cal.binary_ece(y, p) == pytest.approx(0.025)
    assert cal.binary_ece(y, p, edges="right_closed") == pytest.approx(0.025)
    assert cal.binary_ece(y, p, edges="focus") == pytest.approx(0.475)
    assert cal.ece(y, np.c_[1 - p, p], 10, "focus") == pytest.approx(0.475)


def test_focus_edges_on_the_edges_and_at_0_and_1():
    p = np.array([0.0, 0.1, 0.2, 0.5, 0.9, 0.95, 1.0])
    assert cal.ece_bins(p).tolist() == [0, 0, 1, 4, 8, 9, 9]                  # (i/10, (i+1)/10], 0 -> bin 0
    assert cal.ece_bins(p, edges="focus").tolist() == [0, 1, 2, 5, 9, 9, 9]   # [i/10, (i+1)/10), 1 -> bin 9
    # every edge i/10 lands in bin i (focus) or i - 1 (ours); FOCUS clips to [0, 1] before binning
    edges_ = np.arange(1, 10) / 10
    assert cal.ece_bins(edges_, edges="focus").tolist() == list(range(1, 10))
    assert cal.ece_bins(edges_).tolist() == list(range(0, 9))
    assert cal.ece_bins(np.array([-0.2, 1.3]), edges="focus").tolist() == [0, 9]
    # p = 1 and p = 0 are in the end bins under both: a perfect, confident model has ECE 0 either way
    y = np.array([1, 0])
    for edges in cal.BIN_EDGES:
        assert cal.binary_ece(y, np.array([1.0, 0.0]), edges=edges) == 0.0
    # reliability bins follow the same edges: 0.1 counts in bin 0 (ours) or bin 1 (focus)
    proba = np.c_[[0.9, 0.5], [0.1, 0.5]]
    assert cal.reliability_bins([1, 0], proba)["n"].tolist()[:2] == [1, 0]
    assert cal.reliability_bins([1, 0], proba, 10, "focus")["n"].tolist()[:2] == [0, 1]
    with pytest.raises(ValueError, match="ece_bin_edges"):
        cal.ece_bins(p, edges="left")


def test_weighted_and_point_ece_share_the_edges():
    from retinabench.metrics.thresholds import point_metrics
    from retinabench.metrics.weighted import weighted_metrics
    rng = np.random.default_rng(1)
    p = np.round(rng.random(200) * 20) / 20  # half the probabilities exactly on an edge: the edges matter
    y = (rng.random(200) < p).astype(int)
    proba = np.c_[1 - p, p]
    W = np.ones((1, 200))
    for edges in cal.BIN_EDGES:
        point = point_metrics(["ece", "ece_top_label"], y, proba, proba.argmax(1), edges=edges)
        reps = weighted_metrics(["ece", "ece_top_label"], y, proba, proba.argmax(1), W, edges=edges)
        assert point["ece"] == pytest.approx(cal.binary_ece(y, p, edges=edges))
        assert reps["ece"][0] == pytest.approx(point["ece"])
        assert reps["ece_top_label"][0] == pytest.approx(point["ece_top_label"])
    assert cal.binary_ece(y, p, edges="focus") != pytest.approx(cal.binary_ece(y, p))

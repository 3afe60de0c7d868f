"""Majority-class and chance levels beside every headline number (stats.baselines, stats.tables)."""
import numpy as np
import pandas as pd
import pytest

from retinabench.stats.baselines import baselines_table, chance_levels, not_above
from retinabench.stats.tables import appendix_latex, appendix_table, ranking_latex, ranking_table

TASK = {"name": "glaucoma", "dataset": "ds", "classes": ["no", "yes"], "ordinal": False}


def split_table(n_test=30, n_pos_test=1, seed=0):
    """A glaucoma-like split: 29 of 30 test images negative (majority rate 96.7 %), balanced rows marked."""
    rng = np.random.default_rng(seed)
    rows = []
    for part, n, pos in (("train", 140, 10), ("val", 30, 2), ("test", n_test, n_pos_test)):
        y = np.array([1] * pos + [0] * (n - pos))
        bal = np.zeros(n, bool)
        bal[:pos] = True
        bal[pos:2 * pos] = True  # as many negatives as positives
        for i, (yy, b) in enumerate(zip(y, bal)):
            rows.append({"image_id": f"{part}{i}", "patient_id": f"p{part}{i}", "dataset": "ds", "task": "glaucoma",
                         "label": TASK["classes"][yy], "y": int(yy), "split": part, "balanced": bool(b)})
    rng.shuffle(rows)
    return pd.DataFrame(rows)


def test_majority_is_the_no_information_rate_and_chance_is_uniform_guessing():
    b = baselines_table({"glaucoma": split_table()}, {"glaucoma": TASK}, ["u-u", "b-b", "u-b"]).set_index(
        ["regime", "split", "metric"])
    assert b.loc[("u-u", "test", "accuracy"), "majority"] == pytest.approx(29 / 30)
    assert b.loc[("u-u", "test", "accuracy"), "majority_class"] == "no"
    assert b.loc[("u-u", "test", "accuracy"), "chance"] == pytest.approx(0.5)
    assert b.loc[("u-u", "test", "auroc"), "majority"] == 0.5 and b.loc[("u-u", "test", "kappa"), "majority"] == 0
    assert b.loc[("u-u", "test", "balanced_accuracy"), "majority"] == 0.5
    assert b.loc[("u-u", "test", "auprc"), "chance"] == pytest.approx(1 / 30)  # the prevalence
    assert b.loc[("u-u", "test", "accuracy"), "n"] == 30
    assert b.loc[("u-b", "test", "accuracy"), "majority"] == pytest.approx(0.5)  # balanced test rows
    assert b.loc[("u-b", "test", "accuracy"), "n"] == 2
    assert b.loc[("u-u", "val", "accuracy"), "majority"] == pytest.approx(28 / 30)  # the val rows of "u"
    assert np.isnan(b.loc[("u-u", "test", "ece_top_label"), "chance"])
    c = chance_levels(np.array([0.5, 0.3, 0.2]))
    assert c["accuracy"] == pytest.approx(1 / 3) and c["auprc"] == pytest.approx(1 / 3)
    assert c["f1_macro"] == pytest.approx(np.mean([2 * p / 3 / (p + 1 / 3) for p in (0.5, 0.3, 0.2)]))


def test_a_score_equal_to_the_majority_rate_is_marked_and_not_bold():
    base = baselines_table({"glaucoma": split_table()}, {"glaucoma": TASK}, ["u-u"])
    metrics = pd.DataFrame([{"dataset": "ds", "task": "glaucoma", "encoder": e, "protocol": "linear", "seed": s,
                             "regime": "u-u", "split": "test", "metric": "accuracy", "value": v, "n": 30}
                            for e, v in (("enc_a", 29 / 30), ("enc_b", 29 / 30), ("enc_c", 0.9)) for s in (0, 1)])
    app = appendix_table(metrics, baselines=base).set_index("encoder")
    assert app["majority"].tolist() == pytest.approx([29 / 30] * 3)
    assert app["not_above_majority"].tolist() == [True, True, True]  # 96.7 % = the majority rate
    tex = appendix_latex(app.reset_index(), regime="u-u", encoder_order=["enc_a", "enc_b", "enc_c"])
    assert r"\textbf" not in tex  # the best score is not above the majority level: nothing in bold
    assert tex.count(r"$^\dagger$") == 3 + 1  # three cells and the caption's note
    assert r"\textit{majority class} & 96.7" in tex and r"\textit{chance} & 50.0" in tex
    better = metrics.assign(value=np.where(metrics["encoder"] == "enc_c", 1.0, metrics["value"]))
    tex = appendix_latex(appendix_table(better, baselines=base), regime="u-u", encoder_order=["enc_c"])
    assert r"\textbf{100.0" in tex


def test_the_ranking_table_counts_tasks_not_above_the_majority():
    from retinabench.stats.ranks import rank_summaries, rank_tables
    base = baselines_table({"glaucoma": split_table(), "g2": split_table(seed=1).assign(task="g2")},
                           {"glaucoma": TASK, "g2": {**TASK, "name": "g2"}}, ["u-u"])
    rows = []
    for task in ("glaucoma", "g2"):
        for e, v in (("enc_a", 29 / 30), ("enc_b", 1.0)):
            rows.append({"dataset": "ds", "task": task, "encoder": e, "protocol": "linear", "seed": 0,
                         "regime": "u-u", "split": "test", "metric": "accuracy", "value": v, "n": 30})
    ranks = rank_tables(pd.DataFrame(rows), ["accuracy"])
    r = ranking_table(rank_summaries(ranks), regime="u-u", ranks=ranks, baselines=base).set_index("encoder")
    assert r.loc["enc_a", "n_tasks_not_above_majority"] == 2 and r.loc["enc_b", "n_tasks_not_above_majority"] == 0
    assert r.loc["enc_a", "mean_majority"] == pytest.approx(29 / 30)
    tex = ranking_latex(r.reset_index(), encoder_order=["enc_b", "enc_a"])
    assert "Majority-class predictor: 96.7\\%" in tex and "; 96.7 [2]" in tex


def test_not_above_tolerates_half_an_image():
    assert not_above([0.9667, 0.99, 0.95], [29 / 30] * 3, [30] * 3).tolist() == [True, False, True]

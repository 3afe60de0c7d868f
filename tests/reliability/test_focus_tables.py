"""FOCUS Tables 3, 4, 10 and the figure data on small reliability tables with known numbers."""
import numpy as np
import pandas as pd
import pytest

from retinabench.reliability import focus_tables as ft
from retinabench.testing.focus import ENCODERS, TASKS, focus_comparisons as _comparisons, focus_tables as _tables

@pytest.fixture(scope="module")
def rows():
    m, g = _tables()
    r = ft.focus_rows(m, g, TASKS, regime="u-u", fairness_attributes=["sex", "age_median"])
    return ft.with_groups(r, ft.model_groups(ENCODERS))


def test_model_groups_from_registry_fields():
    g = ft.model_groups(ENCODERS).set_index("encoder")
    assert g.loc["gen_vm", "model_type"] == "general VM" and g.loc["oph_vm", "model_type"] == "ophthalmic VM"
    assert g.loc["clip", "family"] == "VLM" and g.loc["medg", "model_type"] == "medical MLLM"
    assert g.loc["medg", "params_b"] == pytest.approx(4.3)
    with pytest.raises(KeyError, match="domain"):
        ft.model_groups({"x": {"domain": "moon"}})


def test_focus_rows_known_numbers(rows):
    r = rows.set_index(["encoder", "protocol", "dataset"])
    assert len(rows) == 9  # transfer row ignored
    assert r.loc[("gen_vm", "logreg", "d1"), "auroc"] == pytest.approx(0.81)  # mean over seeds
    assert r.loc[("gen_vm", "logreg", "d1"), "accuracy"] == pytest.approx(0.70)  # y_pred, not youden
    assert r.loc[("gen_vm", "logreg", "d1"), "ece"] == pytest.approx(0.10)  # positive-class ECE preferred
    fair = [c for c in rows.columns if c.startswith("fairness:")]
    assert sorted(fair) == ["fairness:age_median:accuracy", "fairness:sex:accuracy", "fairness:sex:auroc",
                            "fairness:sex:equalized_odds"]
    assert (rows["task_group"] == "any_dr").all()


def test_table3_scores(rows):
    t3 = ft.table3(rows)
    row = t3[(t3["task_group"] == "any_dr") & (t3["family"] == "VM") & (t3["domain_group"] == "general")].iloc[0]
    assert row["auroc"] == pytest.approx((0.81 + 0.71) / 2)
    assert row["fairness"] == pytest.approx(1 - np.mean([0.05, 0.1, 0.2, 0.3]))
    assert row["quality"] == pytest.approx(1 - 0.06)
    assert row["shift"] == pytest.approx(1 - (0.81 - 0.71))
    mllm = t3[(t3["family"] == "MLLM") & (t3["task_group"] == "overall")].iloc[0]
    assert np.isnan(mllm["shift"]) and mllm["n_datasets"] == 1   # one dataset: no Shift (FOCUS: 1.0)
    assert np.isnan(mllm["quality"]) and mllm["n_quality_gaps"] == 0  # no quality gaps: NaN (FOCUS: median fill)
    assert set(t3["task_group"]) == {"any_dr", "overall"}
    tex = ft.table3_latex(t3)
    assert "\\textbf{0.060}" in tex  # best (lowest) ECE of a block in bold: ophthalmic VM, (0.05 + 0.07) / 2
    assert "--" in tex and tex.count("\\multicolumn") == 2


def test_table4_general_vs_ophthalmic(rows):
    t4 = ft.table4(rows).set_index(["dataset", "family", "metric"])
    r = t4.loc[("d1", "VM", "auroc")]
    assert r["general"] == pytest.approx(0.81) and r["ophthalmic"] == pytest.approx(0.91)
    assert r["ophthalmic_minus_general"] == pytest.approx(0.10)
    assert r["n_general"] == 1 and r["n_ophthalmic"] == 1
    assert np.isnan(t4.loc[("d1", "VLM", "auroc"), "ophthalmic"])


def test_table10_and_sft_deltas():
    t10 = ft.table10(_comparisons()).set_index(["model", "domain"])
    assert t10.loc[("m1", "out-of-domain"), "auroc_delta"] == pytest.approx(-0.01)
    assert t10.loc[("m1", "out-of-domain"), "auroc_sft"] == pytest.approx(0.69)
    assert t10.loc[("m1", "out-of-domain"), "n_comparisons"] == 2
    assert t10.loc[("all", "in-domain"), "auroc_delta"] == pytest.approx(0.08)
    d = ft.sft_deltas(_comparisons())
    allrow = d[(d["by"] == "domain") & (d["domain"] == "in-domain") & (d["metric_family"] == "auroc")].iloc[0]
    assert allrow["level"] == "all" and allrow["delta"] == pytest.approx(0.08) and allrow["n_comparisons"] == 2
    assert set(d["by"]) == {"domain", "model", "train_task"}


def test_figure_data(rows):
    spider = ft.figure_data("spiders", rows)
    assert {"fairness", "quality", "auroc"} <= set(spider.columns) and len(spider) == 5
    size = ft.figure_data("mllm_size", rows)
    assert list(size["params_b"]) == [pytest.approx(4.3)]
    pz = ft.figure_data("probe_vs_zeroshot", rows)
    assert set(pz["protocol"]) == {"logreg", "zeroshot"}
    heat = ft.figure_data("dataset_heatmap", rows)
    assert len(heat) == 9
    bins = pd.DataFrame([{"source": "frozen", "encoder": "gen_vm", "protocol": "logreg", "train_task": t, "task": t,
                          "regime": "u-u", "calibration": "before", "bin": 3, "n": n, "mean_prob": p, "observed": o}
                         for t, n, p, o in (("d1_dr", 10, 0.30, 0.2), ("d2_dr", 30, 0.34, 0.4))])
    cal = ft.figure_data("calibration_curves", rows, bins=bins)
    assert cal.iloc[0]["mean_prob"] == pytest.approx(0.33) and cal.iloc[0]["observed"] == pytest.approx(0.35)
    with pytest.raises(KeyError, match="unknown"):
        ft.figure_data("nope", rows)

"""Appendix/ranking tables, the FT−LP gap, learning-rate sensitivity and subgroup pairs on hand tables."""
import math

import pandas as pd
import pytest

from retinabench.schemas import METRICS
from retinabench.stats.fairness import subgroup_pairs
from retinabench.stats.protocols import ft_lp_gap
from retinabench.stats.ranks import rank_summaries, rank_tables
from retinabench.stats.sensitivity import choices_from_sweep, lr_choices, lr_mean_ranks, lr_sensitivity
from retinabench.stats.tables import appendix_latex, appendix_table, latex_escape, ranking_latex, ranking_table


def table(rows, **fixed):
    base = {"dataset": "ds", "protocol": "linear", "regime": "u-u", "split": "test", "metric": "accuracy",
            "seed": 0, "n": 10} | fixed
    return pd.DataFrame([base | r for r in rows])


def test_appendix_table_mean_sd_and_latex():
    m = table([{"task": "t_1", "encoder": "enc_a", "seed": 0, "value": 0.80},
               {"task": "t_1", "encoder": "enc_a", "seed": 1, "value": 0.90},
               {"task": "t_1", "encoder": "enc_b", "seed": 0, "value": 0.70}])[METRICS.names]
    app = appendix_table(m).set_index("encoder")
    assert app.loc["enc_a", "mean"] == pytest.approx(0.85)
    assert app.loc["enc_a", "sd"] == pytest.approx(math.sqrt(0.005))      # sample sd of 0.8, 0.9
    assert app.loc["enc_a", "cell"] == "85.0 ± 7.1" and app.loc["enc_b", "cell"] == "70.0"  # one seed: no sd
    tex = appendix_latex(appendix_table(m), regime="u-u", encoder_order=["enc_b", "enc_a"])
    assert r"\textbf{85.0 $\pm$ 7.1}" in tex and "enc\\_b & 70.0" in tex and "t\\_1" in tex
    assert tex.index("enc\\_b &") < tex.index("enc\\_a &")  # the given encoder order
    assert latex_escape("a_b&c%") == r"a\_b\&c\%"


def test_ranking_table_and_latex():
    m = table([{"task": t, "encoder": e, "value": v} for t, vals in {"t1": (0.9, 0.8), "t2": (0.7, 0.8)}.items()
               for e, v in zip(("a", "b"), vals)])[METRICS.names]
    r = ranking_table(rank_summaries(rank_tables(m, ["accuracy"])), regime="u-u")
    assert r["mean_rank"].tolist() == [1.5, 1.5] and r["position"].tolist() == [1.5, 1.5]
    tex = ranking_latex(r, encoder_order=["b", "a"])
    assert "b & 1.50 $\\pm$ 0.71" in tex and tex.index("b &") < tex.index("a &")
    with pytest.raises(ValueError, match="regime 'b-b'"):
        ranking_table(rank_summaries(rank_tables(m, ["accuracy"])), regime="b-b")


def test_ft_lp_gap_by_hand():
    rows = []
    for task, (ft, lp) in {"t1": (0.90, 0.80), "t2": (0.70, 0.75)}.items():
        rows += [{"task": task, "encoder": "a", "protocol": "finetune", "value": ft},
                 {"task": task, "encoder": "a", "protocol": "linear", "value": lp},
                 {"task": task, "encoder": "a", "protocol": "knn", "value": 0.5}]
    out = ft_lp_gap(table(rows)[METRICS.names], {"a": {"params_m": 86.6}}).set_index("encoder")
    assert out.loc["a", "gap"] == pytest.approx((0.10 - 0.05) / 2)
    assert out.loc["a", "sd"] == pytest.approx(pd.Series([0.10, -0.05]).std())
    assert out.loc["a", "params_m"] == 86.6 and out.loc["a", "n_tasks"] == 2
    with pytest.raises(ValueError, match=r"protocol\(s\) \['finetune'\]"):
        ft_lp_gap(table([r for r in rows if r["protocol"] != "finetune"])[METRICS.names], {"a": {"params_m": 1}})


def sweep_rows():
    # encoder a peaks at lr 1e-3 on validation; b at 1e-2. Test scores follow.
    val = {("a", 1e-4): 0.70, ("a", 1e-3): 0.80, ("a", 1e-2): 0.60,
           ("b", 1e-4): 0.65, ("b", 1e-3): 0.70, ("b", 1e-2): 0.75}
    rows = []
    for (enc, lr), v in val.items():
        rows.append({"task": "t1", "encoder": enc, "lr": lr, "split": "val", "value": v})
        rows.append({"task": "t1", "encoder": enc, "lr": lr, "split": "test", "value": v - 0.05})
    return table(rows)


def test_lr_choices_and_sensitivity():
    ch = lr_choices(sweep_rows(), protocol="linear", regime="u-u").set_index("encoder")
    assert ch.loc["a", "lr_optimal"] == 1e-3 and ch.loc["a", "lr_suboptimal"] == 1e-2
    assert ch.loc["a", "drop"] == pytest.approx(0.20) and ch.loc["b", "drop"] == pytest.approx(0.10)
    ref = lr_choices(sweep_rows(), protocol="linear", regime="u-u", reference_lr=1e-3).set_index("encoder")
    assert ref.loc["a", "drop"] == pytest.approx(0.0) and ref.loc["b", "drop"] == pytest.approx(0.05)
    sens = lr_sensitivity(ch.reset_index()).set_index("encoder")
    assert sens.loc["a", "mean_drop"] == pytest.approx(0.20)
    r_opt, r_sub = lr_mean_ranks(ch.reset_index())
    assert r_opt.to_dict() == {"a": 1.0, "b": 2.0} and r_sub.to_dict() == {"a": 2.0, "b": 1.0}  # test 0.55 vs 0.60
    with pytest.raises(ValueError, match="reference lr 0.5 not swept"):
        lr_choices(sweep_rows(), protocol="linear", regime="u-u", reference_lr=0.5)
    with pytest.raises(KeyError, match=r"lacks column\(s\) \['lr'\]"):
        lr_choices(sweep_rows().drop(columns="lr"), protocol="linear", regime="u-u")


def test_subgroup_pairs():
    rows = [{"task": t, "encoder": "a", "attribute": "age", "group": g, "value": v}
            for t, g, v in (("t1", "<60", 0.8), ("t1", ">=60", 0.7), ("t2", "<60", 0.9), ("t2", ">=60", 0.6))]
    out = subgroup_pairs(table(rows), {"age": ["<60", ">=60"]}, protocol="linear", regime="u-u")
    assert out.loc[0, "value_a"] == pytest.approx(0.85) and out.loc[0, "value_b"] == pytest.approx(0.65)
    assert out.loc[0, "difference"] == pytest.approx(-0.20) and out.loc[0, "n_tasks"] == 2
    # an attribute without one of its groups keeps a row that says why (never dropped silently, never fatal)
    missing = subgroup_pairs(table([r | {"attribute": "sex", "group": "female"} for r in rows]),
                             {"sex": ["female", "male"]}, protocol="linear", regime="u-u")
    assert len(missing) == 1 and "group(s) ['male']" in missing.loc[0, "reason"] and pd.isna(missing.loc[0, "encoder"])


def test_subgroup_points_are_per_encoder_and_dataset_mean_over_seeds():
    # OcularBench Figs. 10-11: one point per encoder and dataset, the mean over its seeds
    rows = []
    for ds, task, base in (("dsA", "tA", 0.8), ("dsB", "tB", 0.6)):
        for seed, noise in ((0, 0.0), (1, 0.02), (2, -0.02)):
            rows += [{"dataset": ds, "task": task, "encoder": "a", "seed": seed, "attribute": "age", "group": "<60",
                      "value": base + noise},
                     {"dataset": ds, "task": task, "encoder": "a", "seed": seed, "attribute": "age", "group": ">=60",
                      "value": base - 0.1 + 2 * noise}]
    out = subgroup_pairs(table(rows), {"age": ["<60", ">=60"]}, protocol="linear", regime="u-u").set_index("dataset")
    assert sorted(out.index) == ["dsA", "dsB"] and (out["n_seeds"] == 3).all() and (out["n_tasks"] == 1).all()
    assert out.loc["dsA", "value_a"] == pytest.approx(0.8) and out.loc["dsB", "value_b"] == pytest.approx(0.5)
    assert (out["reason"] == "").all()


def test_the_sweeps_own_sensitivity_table_is_used_as_is():
    rows = [{"encoder": e, "task": "t1", "stage": 2, "protocol": "finetune", "lr_name": "lr_encoder",
             "regime": "u-u", "split": split, "metric": "accuracy", "lr_optimal": 1e-5, "value_optimal": opt,
             "value_suboptimal_mean": sub, "value_suboptimal_sd": 0.01, "n_suboptimal": 4, "n_diverged": 0,
             "drop": opt - sub}
            for e, opt, sub in (("a", 0.8, 0.6), ("b", 0.7, 0.65)) for split in ("val", "test")]
    ch = choices_from_sweep(pd.DataFrame(rows), regime="u-u").set_index("encoder")
    assert ch.loc["a", "drop"] == pytest.approx(0.2) and ch.loc["b", "drop"] == pytest.approx(0.05)
    assert len(ch) == 2 and (ch["protocol"] == "finetune").all()  # test rows only
    r_opt, r_sub = lr_mean_ranks(ch.reset_index())
    assert r_opt.to_dict() == {"a": 1.0, "b": 2.0} and r_sub.to_dict() == {"a": 2.0, "b": 1.0}
    with pytest.raises(ValueError, match="lr_reference"):
        choices_from_sweep(pd.DataFrame(rows), regime="u-u", reference_lr=1e-3)
    metrics_format = choices_from_sweep(sweep_rows(), regime="u-u")  # METRICS + lr: chosen on validation
    assert set(metrics_format["protocol"]) == {"linear"} and len(metrics_format) == 2


def sensitivity_rows():
    # the sweep task t1 and the transfer-check task t2; a is lr-sensitive on t1 only
    rows = []
    for task, drops in (("t1", {"a": 0.3, "b": 0.05}), ("t2", {"a": 0.0, "b": 0.2})):
        for e, drop in drops.items():
            for split in ("val", "test"):
                rows.append({"encoder": e, "task": task, "stage": 2, "protocol": "finetune", "lr_name": "lr_encoder",
                             "regime": "u-u", "split": split, "metric": "accuracy",
                             "lr_optimal": 1e-5 if (e, task) != ("b", "t2") else 1e-4, "value_optimal": 0.8,
                             "value_suboptimal_mean": 0.8 - drop, "value_suboptimal_sd": 0.01, "n_suboptimal": 2,
                             "n_diverged": 0, "drop": drop})
    return pd.DataFrame(rows)


def test_sensitivity_is_computed_on_the_sweep_task_alone():
    ch = choices_from_sweep(sensitivity_rows(), regime="u-u", tasks=["t1"])
    assert set(ch["task"]) == {"t1"}
    sens = lr_sensitivity(ch).set_index("encoder")
    assert sens.loc["a", "mean_drop"] == pytest.approx(0.3) and sens.loc["a", "n_tasks"] == 1
    assert sens.loc["a", "tasks"] == "t1"
    both = lr_sensitivity(choices_from_sweep(sensitivity_rows(), regime="u-u")).set_index("encoder")
    assert both.loc["a", "mean_drop"] == pytest.approx(0.15)  # what mixing in the check task would have given
    with pytest.raises(ValueError, match=r"task\(s\) \['t9'\]"):
        choices_from_sweep(sensitivity_rows(), regime="u-u", tasks=["t9"])


def test_lr_transfer_table_over_the_grid_on_both_tasks():
    from retinabench.stats.sensitivity import lr_transfer_table
    grid = []
    for task in ("t1", "t2"):
        for e in ("a", "b"):
            for lr, v in ((1e-5, 0.8), (1e-4, 0.7 if (e, task) != ("b", "t2") else 0.9)):
                for seed, noise in ((0, 0.01), (1, -0.01)):
                    grid.append({"dataset": "ds", "task": task, "encoder": e, "protocol": "finetune", "seed": seed,
                                 "regime": "u-u", "split": "val", "metric": "accuracy", "value": v + noise, "n": 10,
                                 "lr": lr, "lr_name": "lr_encoder", "stage": 2})
    grid = pd.DataFrame(grid)
    t = lr_transfer_table(grid, sensitivity_rows(), metric="accuracy", regime="u-u", sweep_task="t1",
                          check_task="t2")
    assert set(t["role"]) == {"sweep task", "transfer check"} and len(t) == 2 * 2 * 2
    assert t["value"].tolist()[:2] == pytest.approx([0.8, 0.7]) and (t["n_seeds"] == 2).all()
    assert (t["lr_chosen"] == 1e-5).all()
    transfers = t.groupby("encoder")["transfers"].first().to_dict()
    assert transfers == {"a": True, "b": False}  # b's optimum on the check task is 1e-4, not the chosen 1e-5


def test_lr_transfer_checks_only_the_encoders_swept_on_the_check_task_in_its_own_regime():
    """OcularBench: every encoder swept on the sweep task (u-u), three of them again on EyePACS balanced (b-b)."""
    from retinabench.stats.sensitivity import lr_transfer_table
    grid, sens = [], []
    swept = {("t1", "u-u"): ("a", "b", "c"), ("t2", "b-b"): ("b",)}
    for (task, regime), encs in swept.items():
        for e in encs:
            for lr, v in ((1e-5, 0.8), (1e-4, 0.9 if task == "t2" else 0.7)):
                grid.append({"dataset": "ds", "task": task, "encoder": e, "protocol": "finetune", "seed": 0,
                             "regime": regime, "split": "val", "metric": "accuracy", "value": v, "n": 10, "lr": lr,
                             "lr_name": "lr_encoder", "stage": 2})
            sens.append({"encoder": e, "task": task, "stage": 2, "protocol": "finetune", "regime": regime,
                         "split": "val", "metric": "accuracy", "lr_optimal": 1e-4 if task == "t2" else 1e-5,
                         "value_optimal": 0.9, "value_suboptimal_mean": 0.8})
    grid, sens = pd.DataFrame(grid), pd.DataFrame(sens)
    t = lr_transfer_table(grid, sens, metric="accuracy", regime="u-u", sweep_task="t1", check_task="t2",
                          check_regime="b-b")
    assert set(t["encoder"]) == {"b"} and len(t) == 2 * 2  # a and c were not swept on t2: not compared
    assert t.set_index("role")["regime"].to_dict() == {"sweep task": "u-u", "transfer check": "b-b"}
    assert not t["transfers"].any() and (t["lr_chosen"] == 1e-5).all()
    # the check task read in the sweep task's regime has no rows: a clear error naming task and regime
    with pytest.raises(ValueError, match=r"t2 \(regime u-u\)"):
        lr_transfer_table(grid, sens, metric="accuracy", regime="u-u", sweep_task="t1", check_task="t2")

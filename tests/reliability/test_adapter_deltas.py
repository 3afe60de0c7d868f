"""Adapter − base paired deltas on planted predictions: pairing (ID/OOD, identical ids, compatible tasks,
unpaired recorded), deltas and their sign for ECE, invalid answers (invalid = wrong vs valid-both, counts,
invalid-rate change), patient vs image unit, BH within each metric family, domain summaries and Table 5."""
import numpy as np
import pandas as pd
import pytest

from retinabench.reliability.adapter_deltas import adapter_deltas, pair_results, table5

TASKS = {t: {"name": t, "dataset": d, "classes": ["no", "yes"], "harmonised": "gon"}
         for t, d in (("a_gon", "a"), ("b_gon", "b"), ("c_gon", "c"))}


def world(n_patients=120, seed=0, invalid_base=0.0, invalid_adapter=0.0):
    """Base (weak) and an adapter trained on dataset a: strong on a (in-domain), as weak as the base on b and c."""
    rng = np.random.default_rng(seed)
    man, base, adapted = [], [], []
    for task, t in TASKS.items():
        ds = t["dataset"]
        for p in range(n_patients):
            for k in range(int(rng.integers(1, 3))):
                iid = f"{ds}_P{p}_{k}"
                y = int(rng.random() < 0.4)
                man.append({"dataset": ds, "image_id": iid, "patient_id": f"{ds}P{p}"})
                noise = rng.normal(0, 1)
                for side, strength, inv in (("base", 0.3, invalid_base),
                                            ("adapter", 2.5 if ds == "a" else 0.3, invalid_adapter)):
                    q = 1 / (1 + np.exp(-(strength * (2 * y - 1) + noise)))
                    pred = int(q > 0.5) if rng.random() >= inv else -1
                    row = {"image_id": iid, "dataset": ds, "task": task, "encoder": "m", "protocol": "mllm",
                           "seed": 0, "regime": "u-u", "split": "test", "y_true": y, "y_pred": pred,
                           "p_no": 1 - q, "p_yes": q, "answer": "yes" if pred == 1 else "no" if pred == 0 else "?"}
                    if side == "adapter":
                        adapted.append({**row, "train_dataset": "a", "train_task": "a_gon", "adapter": "f" * 64})
                    else:
                        base.append(row)
    return pd.DataFrame(base), pd.DataFrame(adapted), pd.DataFrame(man)


@pytest.fixture(scope="module")
def planted():
    base, adapted, man = world(invalid_adapter=0.1)
    return base, adapted, man, adapter_deltas(base, adapted, man, TASKS)


def test_pairs_are_formed_by_family_task_test_set_and_domain(planted):
    pairs = planted[3]["pairs"]
    assert dict(zip(pairs["dataset"], pairs["domain"])) == {"a": "in-domain", "b": "out-of-domain",
                                                           "c": "out-of-domain"}
    assert (pairs["train_dataset"] == "a").all()


def test_non_identical_test_images_and_incompatible_tasks_are_errors(planted):
    base, adapted, man, _ = planted
    with pytest.raises(ValueError, match="not run on the same test images .*1 only in the base"):
        pair_results(base, adapted.iloc[1:], TASKS)
    other = {**TASKS, "b_gon": {**TASKS["b_gon"], "harmonised": "any_dr"}}
    with pytest.raises(ValueError, match="neither the test task nor shares its harmonised id"):
        pair_results(base, adapted, other)
    with pytest.raises(ValueError, match="need .*train_dataset"):
        pair_results(base, adapted.drop(columns="adapter"), TASKS)


def test_an_adapter_result_without_its_base_is_recorded_unpaired(planted, capsys):
    base, adapted, _, _ = planted
    pairs, unpaired = pair_results(base[base["dataset"] != "c"], adapted, TASKS)
    assert list(unpaired["dataset"]) == ["c"] and "no base-model result" in unpaired["reason"].iloc[0]
    assert "unpaired" in capsys.readouterr().out and len(pairs) == 2


def test_in_domain_gain_is_significant_and_out_of_domain_is_not(planted):
    comp = planted[3]["comparisons"]
    prim = comp[comp["variant"] == "invalid_wrong"].set_index(["dataset", "metric"])
    assert prim.loc[("a", "auroc"), "delta"] > 0.2 and prim.loc[("a", "auroc"), "ci_low"] > 0
    assert prim.loc[("a", "auroc"), "p_bh"] < 0.01
    for ds in ("b", "c"):  # identical scores: delta exactly 0
        assert prim.loc[(ds, "auroc"), "delta"] == 0 and prim.loc[(ds, "auroc"), "p_value"] == 1
    assert not prim.loc[("a", "ece"), "higher_is_better"] and prim.loc[("a", "auroc"), "higher_is_better"]
    # the value columns are the metrics on the aligned rows (AUROC from sklearn)
    from sklearn.metrics import roc_auc_score
    adapted = planted[1]
    a = adapted[adapted["dataset"] == "a"].sort_values("image_id")
    assert prim.loc[("a", "auroc"), "value_adapter"] == pytest.approx(roc_auc_score(a["y_true"], a["p_yes"]))


def test_invalid_answers_count_as_wrong_and_valid_both_drops_them_with_counts(planted):
    base, adapted, _, res = planted
    comp = res["comparisons"]
    b = comp[comp["dataset"] == "b"].set_index(["variant", "metric"])
    a_b = adapted[adapted["dataset"] == "b"]
    n_inv = int((a_b["y_pred"] == -1).sum())
    assert n_inv > 0 and b.loc[("invalid_wrong", "accuracy"), "n_invalid_adapter"] == n_inv
    assert b.loc[("invalid_wrong", "accuracy"), "n_rows"] == len(a_b)
    assert b.loc[("valid_both", "accuracy"), "n_rows"] == len(a_b) - n_inv
    # same scores, so the accuracy loss under invalid=wrong is exactly the invalid answers that were right
    base_b = base[base["dataset"] == "b"].set_index("image_id")
    inv = a_b.set_index("image_id")["y_pred"] == -1
    lost = (base_b.loc[inv[inv].index, "y_pred"] == base_b.loc[inv[inv].index, "y_true"]).sum()
    assert b.loc[("invalid_wrong", "accuracy"), "delta"] == pytest.approx(-lost / len(a_b))
    assert b.loc[("valid_both", "accuracy"), "delta"] == pytest.approx(0.0)
    rate = b.loc[("all_rows", "invalid_rate")]
    assert rate["delta"] == pytest.approx(n_inv / len(a_b)) and rate["ci_low"] > 0


def test_bh_is_within_each_metric_family(planted):
    from scipy.stats import false_discovery_control
    comp = planted[3]["comparisons"]
    fam = comp[(comp["variant"] == "invalid_wrong") & (comp["metric_family"] == "auprc")]
    np.testing.assert_allclose(fam["p_bh"], false_discovery_control(fam["p_value"], method="bh"))


def test_unit_image_resamples_images_and_patient_is_default(planted):
    base, adapted, man, res = planted
    img = adapter_deltas(base, adapted, man, TASKS, unit="image")["comparisons"]
    pat = res["comparisons"]
    assert (pat["unit"] == "patient").all() and (img["unit"] == "image").all()
    assert (img["n_clusters"] == img["n_images"]).all() and (pat["n_clusters"] < pat["n_images"]).all()
    np.testing.assert_allclose(img["delta"], pat["delta"])  # point estimates do not depend on the unit
    with pytest.raises(ValueError, match="unit must be"):
        adapter_deltas(base, adapted, man, TASKS, unit="eye")


def test_domain_rows_bootstrap_comparison_deltas_and_table5_shape(planted):
    dom = planted[3]["domains"]
    d = dom[(dom["variant"] == "invalid_wrong") & (dom["metric_family"] == "auroc")].set_index(["encoder", "domain"])
    assert d.loc[("m", "in-domain"), "n_comparisons"] == 1 and d.loc[("m", "out-of-domain"), "n_comparisons"] == 2
    assert d.loc[("m", "out-of-domain"), "delta"] == 0
    assert d.loc[("all", "in-domain"), "delta"] == pytest.approx(d.loc[("m", "in-domain"), "delta"])
    tab = table5(dom)
    assert list(zip(tab["model"], tab["domain"], tab["n"])) == [
        ("m", "in-domain", 1), ("m", "out-of-domain", 2), ("all", "in-domain", 1), ("all", "out-of-domain", 2)]
    # 1000 replicates: the smallest two-sided p is 2/1001, so q < 0.01 (**) is the most a row can show here
    assert tab.loc[0, "ΔAUROC"].startswith("+") and tab.loc[0, "ΔAUROC"].endswith("]**")
    assert tab.loc[1, "ΔAUROC"] == "+0.000 [+0.000, +0.000]"
    assert "ΔECE (lower better)" in tab.columns and "ΔInvalid rate" in tab.columns


def test_the_same_comparison_gets_the_same_intervals_whatever_the_adapter_digest(planted):
    """The bootstrap draws are keyed by the comparison (model, scoring, test set, source), not by the adapter's
    digest: a retrained adapter with other bytes but the same predictions gives the same intervals."""
    base, adapted, man, res = planted
    again = adapter_deltas(base, adapted.assign(adapter="e" * 64), man, TASKS)
    cols = ["delta", "ci_low", "ci_high", "p_value", "p_bh"]
    pd.testing.assert_frame_equal(res["comparisons"][cols], again["comparisons"][cols])


def test_ece_deltas_bin_with_the_configured_edges():
    from retinabench.metrics.calibration import binary_ece
    base, adapted, man = world(n_patients=40, seed=2)
    base = base.assign(p_yes=np.round(base["p_yes"] * 20) / 20)  # half on a bin edge: the edges matter
    base = base.assign(p_no=1 - base["p_yes"])
    for edges in ("right_closed", "focus"):
        comp = adapter_deltas(base, adapted, man, TASKS, metrics=["ece"], n_boot=1000, edges=edges)["comparisons"]
        row = comp[(comp["dataset"] == "a") & (comp["variant"] == "invalid_wrong")].iloc[0]
        b = base[base["dataset"] == "a"].sort_values("image_id")
        assert row["value_base"] == pytest.approx(binary_ece(b["y_true"], b["p_yes"], 10, edges))
    b = base[base["dataset"] == "a"]
    assert binary_ece(b["y_true"], b["p_yes"], 10, "focus") != pytest.approx(binary_ece(b["y_true"], b["p_yes"]))

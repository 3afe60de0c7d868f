"""Paired model-vs-model bootstrap: alignment by image id, patient resampling, p-values, BH per metric family."""
import numpy as np
import pandas as pd
import pytest
from scipy.stats import false_discovery_control

from retinabench.reliability import comparison_pairs, paired_comparisons
from retinabench.settings import ConfigError, ReliabilitySettings

TASKS = {t: {"name": t, "dataset": "d", "modality": m, "classes": ["no", "yes"], "harmonised": None}
         for t, m in (("t_cfp", "cfp"), ("t_oct", "oct"))}


def world(n_patients=150, seed=0):
    rng = np.random.default_rng(seed)
    man, preds = [], []
    for task in TASKS:
        for p in range(n_patients):
            for k in range(int(rng.integers(1, 4))):
                iid = f"{task}_P{p}_{k}"
                y = int(rng.random() < 0.4)
                man.append({"dataset": "d", "image_id": iid, "patient_id": f"P{p}"})
                noise = rng.normal(0, 1)
                # 'good' separates the classes well, 'weak' poorly; 'twin' predicts exactly like 'weak'
                for enc, strength in (("weak", 0.5), ("good", 2.0), ("twin", 0.5)):
                    for seed_ in ((0,) if enc != "good" else (0, 1)):
                        z = strength * (2 * y - 1) + noise + 0.05 * seed_
                        q = 1 / (1 + np.exp(-z))
                        preds.append({"image_id": iid, "dataset": "d", "task": task, "encoder": enc,
                                      "protocol": "logreg", "seed": seed_, "regime": "u-u", "split": "test",
                                      "y_true": y, "y_pred": int(q > 0.5), "p_no": 1 - q, "p_yes": q,
                                      "source": "frozen", "train_task": task, "train_dataset": "d"})
    return pd.DataFrame(preds), pd.DataFrame(man)


@pytest.fixture(scope="module")
def compared():
    preds, man = world()
    comp, dom = paired_comparisons(preds, man, TASKS, ReliabilitySettings(), ["weak", "good", "twin"])
    return preds, comp, dom


def test_default_pairs_are_all_encoder_pairs_within_a_protocol(compared):
    preds, comp, _ = compared
    pairs = {(r["encoder_a"], r["encoder_b"]) for r in comp.to_dict("records")}
    assert pairs == {("weak", "good"), ("weak", "twin"), ("good", "twin")}
    explicit = ReliabilitySettings.from_config({"reliability": {"paired": {"pairs": [
        {"a": {"encoder": "weak", "protocol": "logreg"}, "b": {"encoder": "good", "protocol": "logreg"}}]}}})
    assert len(comparison_pairs(preds, explicit, [])) == 1
    with pytest.raises(ConfigError, match=r"reliability.paired.pairs\[0\].a.protocol: Field required"):
        ReliabilitySettings.from_config({"reliability": {"paired": {"pairs": [{"a": {"encoder": "weak"}, "b": {}}]}}})


def test_planted_improvement_is_significant_and_identical_models_are_not(compared):
    _, comp, _ = compared
    better = comp[(comp["encoder_a"] == "weak") & (comp["encoder_b"] == "good") & (comp["metric"] == "auroc")]
    assert (better["delta"] > 0.1).all() and (better["ci_low"] > 0).all() and (better["p_value"] < 0.01).all()
    assert (better["n_seeds_b"] == 2).all() and (better["n_boot"] == 1000).all()
    same = comp[(comp["encoder_a"] == "weak") & (comp["encoder_b"] == "twin")]
    assert (same["delta"] == 0).all() and (same["ci_low"] == 0).all() and (same["p_value"] == 1).all()


def test_bh_within_each_metric_family(compared):
    _, comp, _ = compared
    for _fam, g in comp.groupby("metric_family"):
        assert len(g) == 6  # 3 pairs x 2 tasks
        assert g["p_bh"].to_numpy() == pytest.approx(false_discovery_control(g["p_value"].to_numpy(), method="bh"))


def test_domain_level_summaries(compared):
    _, comp, dom = compared
    auroc = dom[(dom["encoder_a"] == "weak") & (dom["encoder_b"] == "good") & (dom["metric_family"] == "auroc")]
    assert set(auroc["domain_field"]) == {"modality", "shift"}  # the defaults: by modality and by ID vs OOD
    assert set(auroc.loc[auroc["domain_field"] == "shift", "domain"]) == {"in-domain", "all"}
    auroc = auroc[auroc["domain_field"] == "modality"]
    assert set(auroc["domain"]) == {"cfp", "oct", "all"}
    row = auroc[auroc["domain"] == "all"].iloc[0]
    per = comp[(comp["encoder_a"] == "weak") & (comp["encoder_b"] == "good") & (comp["metric"] == "auroc")]
    assert row["delta"] == pytest.approx(per["delta"].mean()) and row["n_comparisons"] == 2
    assert row["ci_low"] > 0 and dom["p_bh"].notna().all()


def test_alignment_by_image_id_counts_unaligned_rows():
    preds, man = world(n_patients=40)
    drop = preds[(preds["encoder"] == "good") & (preds["task"] == "t_cfp") & (preds["seed"] == 0)].index[:5]
    comp, _ = paired_comparisons(preds.drop(index=drop), man, TASKS, ReliabilitySettings(), ["weak", "good"])
    row = comp[(comp["encoder_a"] == "weak") & (comp["encoder_b"] == "good") & (comp["task"] == "t_cfp")].iloc[0]
    n_all = (preds["task"] == "t_cfp").sum() // 4
    assert row["n_unaligned"] == 5 and row["n_images"] == n_all - 5
    bad = preds.copy()
    bad.loc[(bad["encoder"] == "twin"), "y_true"] = 1 - bad.loc[(bad["encoder"] == "twin"), "y_true"]
    with pytest.raises(ValueError, match="y_true disagree"):
        paired_comparisons(bad, man, TASKS, ReliabilitySettings(), ["weak", "twin"])


def transfer_world(n_patients=120, seed=1):
    """Probes trained on dataset A, tested on A (in-domain) and on B (out-of-domain), as the transfer rule writes
    them; 'good' separates the classes on both, 'weak' poorly."""
    rng = np.random.default_rng(seed)
    man, preds = [], []
    for ds in ("A", "B"):
        for p in range(n_patients):
            iid = f"{ds}_P{p}"
            y = int(rng.random() < 0.4)
            man.append({"dataset": ds, "image_id": iid, "patient_id": f"{ds}{p}"})
            noise = rng.normal(0, 1)
            for enc, strength in (("weak", 0.4), ("good", 2.0)):
                z = strength * (2 * y - 1) + noise
                q = 1 / (1 + np.exp(-z))
                preds.append({"image_id": iid, "dataset": ds, "task": f"{ds}_any", "encoder": enc, "protocol": "logreg",
                              "seed": 0, "regime": "u-u", "split": "test", "y_true": y, "y_pred": int(q > 0.5),
                              "p_no": 1 - q, "p_yes": q, "source": "transfer", "train_task": "A_any",
                              "train_dataset": "A"})
    return pd.DataFrame(preds), pd.DataFrame(man)


TRANSFER_TASKS = {t: {"name": t, "dataset": d, "modality": "cfp", "classes": ["no", "yes"], "harmonised": "any_dr"}
                  for t, d in (("A_any", "A"), ("B_any", "B"))}


def test_out_of_domain_comparisons_and_id_vs_ood_summaries():
    preds, man = transfer_world()
    settings = ReliabilitySettings.from_config({"reliability": {"paired": {"sources": ["transfer"], "domain": ["shift"]}}})
    comp, dom = paired_comparisons(preds, man, TRANSFER_TASKS, settings, ["weak", "good"])
    ood = comp[comp["setting"] == "out-of-domain"]
    assert set(ood["task"]) == {"B_any"} and set(ood["train_dataset"]) == {"A"} and set(ood["dataset"]) == {"B"}
    assert (ood.loc[ood["metric"] == "auroc", "delta"] > 0.1).all()
    # the transfer source's own in-domain rows repeat the frozen probes: only its out-of-domain rows are compared
    assert set(comp["setting"]) == {"out-of-domain"}
    auroc = dom[dom["metric_family"] == "auroc"]
    assert set(auroc["domain_field"]) == {"shift"} and set(auroc["domain"]) == {"out-of-domain", "all"}


def test_id_and_ood_settings_side_by_side_and_bootstrap_unit():
    preds, man = transfer_world()
    frozen = preds[preds["dataset"] == "A"].assign(source="frozen")
    both = pd.concat([frozen, preds], ignore_index=True)
    settings = ReliabilitySettings.from_config({"reliability": {"paired": {"sources": ["frozen", "transfer"],
                                                                "domain": ["modality", "shift"]},
                                                     "bootstrap": {"unit": "image"}}})
    comp, dom = paired_comparisons(both, man, TRANSFER_TASKS, settings, ["weak", "good"])
    assert set(comp["setting"]) == {"in-domain", "out-of-domain"} and set(comp["bootstrap_unit"]) == {"image"}
    shift = dom[(dom["domain_field"] == "shift") & (dom["metric_family"] == "auroc")]
    assert set(shift["domain"]) == {"in-domain", "out-of-domain", "all"}
    assert set(dom["domain_field"]) == {"modality", "shift"}


def test_paired_hard_decisions_are_y_pred_as_written():
    preds, man = world(n_patients=60)
    preds.loc[preds["encoder"] == "twin", "y_pred"] = 1  # twin: same probabilities as weak, other decisions
    comp, _ = paired_comparisons(preds, man, TASKS, ReliabilitySettings(), ["weak", "twin"])
    acc = comp[(comp["metric"] == "accuracy") & (comp["task"] == "t_cfp")].iloc[0]
    t = preds[(preds["task"] == "t_cfp") & (preds["encoder"] == "twin")]
    assert acc["value_b"] == pytest.approx((t["y_true"] == 1).mean())
    auroc = comp[(comp["metric"] == "auroc") & (comp["task"] == "t_cfp")].iloc[0]
    assert auroc["delta"] == 0  # probabilities are the same


def test_paired_ece_replicates_use_the_configured_bin_edges():
    from retinabench.metrics.calibration import binary_ece
    from retinabench.reliability.paired import paired_metric_replicates
    ids = [f"i{k}" for k in range(40)]
    rng = np.random.default_rng(3)
    y = (rng.random(40) < 0.5).astype(int)
    per_seed = {}
    for side in ("a", "b"):
        q = np.round(rng.random(40) * 20) / 20  # half on a bin edge
        per_seed[side] = {0: pd.DataFrame({"p_no": 1 - q, "p_yes": q, "y_pred": (q > 0.5).astype(int)}, index=ids)}
    W = np.ones((1, 40))
    for edges in ("right_closed", "focus"):
        values, reps = paired_metric_replicates(per_seed, ids, y, ["p_no", "p_yes"], ["ece"], W, edges=edges)
        for side in ("a", "b"):
            want = binary_ece(y, per_seed[side][0]["p_yes"].to_numpy(), 10, edges)
            assert values[side]["ece"] == pytest.approx(want) and reps[side]["ece"][0] == pytest.approx(want)
    q = per_seed["a"][0]["p_yes"].to_numpy()
    assert binary_ece(y, q, 10, "focus") != pytest.approx(binary_ece(y, q))
    # the key is typed: an unknown value fails naming it
    settings = ReliabilitySettings.from_config({"reliability": {"ece_bin_edges": "focus"}})
    assert settings.ece_bin_edges == "focus"
    with pytest.raises(ConfigError, match="ece_bin_edges"):
        ReliabilitySettings.from_config({"reliability": {"ece_bin_edges": "left_closed"}})


def test_domain_summary_one_stage_resamples_deltas_two_stage_also_images():
    """reliability.bootstrap.summary: one_stage (FOCUS) resamples the comparisons' point deltas, so two
    comparisons with equal deltas get a zero-width CI whatever their image-level spread; two_stage keeps it."""
    from retinabench.reliability.paired import summarise_comparisons
    from retinabench.stats.bootstrap import one_stage_mean_replicates, make_rng, percentile_ci
    rng = np.random.default_rng(0)
    done = pd.DataFrame({"g": ["x", "x", "y", "y"], "task": ["a", "b", "a", "b"], "delta": [0.1, 0.1, 0.0, 0.4]})
    reps_of = {i: d + rng.normal(0, 0.05, 1000) for i, d in enumerate(done["delta"])}
    boot = {"n_boot": 1000, "seed": 0, "level": 0.95}
    two = summarise_comparisons(done, reps_of, ["g"], boot).set_index("g")
    one = summarise_comparisons(done, reps_of, ["g"], {**boot, "summary": "one_stage"}).set_index("g")
    assert (one["delta"] == two["delta"]).all() and one.loc["x", "delta"] == pytest.approx(0.1)
    assert one.loc["x", "ci_low"] == one.loc["x", "ci_high"] == pytest.approx(0.1)  # equal deltas: no width
    assert two.loc["x", "ci_high"] - two.loc["x", "ci_low"] > 0.05  # the images' uncertainty stays
    # deltas 0.0 and 0.4: one stage draws {0, 0.2, 0.4}; the percentile CI is [0, 0.4], computed by hand
    r = one_stage_mean_replicates(np.array([0.0, 0.4]), make_rng(0, "domain", "y"), 1000)
    assert (one.loc["y", "ci_low"], one.loc["y", "ci_high"]) == pytest.approx(percentile_ci(r)[:2])
    assert (one.loc["y", "ci_low"], one.loc["y", "ci_high"]) == pytest.approx((0.0, 0.4))
    with pytest.raises(ValueError, match="two_stage or one_stage"):
        summarise_comparisons(done, reps_of, ["g"], {**boot, "summary": "three"})


def test_bootstrap_summary_setting_reaches_the_domain_table():
    preds, man = world(n_patients=40)
    s1 = ReliabilitySettings.from_config({"reliability": {"bootstrap": {"summary": "one_stage"}}})
    assert ReliabilitySettings().bootstrap.summary == "two_stage"
    _, d1 = paired_comparisons(preds, man, TASKS, s1, ["weak", "good", "twin"])
    _, d2 = paired_comparisons(preds, man, TASKS, ReliabilitySettings(), ["weak", "good", "twin"])
    assert (d1["delta"].to_numpy() == pytest.approx(d2["delta"].to_numpy()))
    width = [(d["ci_high"] - d["ci_low"]).to_numpy() for d in (d1, d2)]
    assert not np.allclose(width[0], width[1])
    with pytest.raises(ConfigError, match="summary"):
        ReliabilitySettings.from_config({"reliability": {"bootstrap": {"summary": "hierarchical"}}})

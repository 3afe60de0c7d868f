"""Both new interfaces end to end on tiny random models, through the job functions the pipeline calls
(retinabench.protocols.interfaces.INTERFACES -> zeroshot.run / mllm.run): their prediction tables follow the
shared schema and feed the metrics code and the reliability evaluation unchanged (metrics, calibration, subgroup /
fairness rows) for all four protocols and a paraphrase set, invalid answers included; the prompt-variant table and
the zero-shot ECE difference come from the same tables."""
import numpy as np
import pandas as pd
import pytest

from retinabench.metrics.classification import metrics_table
from retinabench.analysis.prompts import prompt_sensitivity
from retinabench.prompts import load_prompts
from retinabench.plan.interface_jobs import selected_entries
from retinabench.protocols.interfaces import INTERFACES, MLLMSettings, TaskInput, ZeroShotSettings, interface_of
from retinabench.protocols.mllm import answer_counts
from retinabench.protocols.zeroshot import ece_difference
from retinabench.schemas import read_table, write_table
from retinabench.reliability import evaluate_predictions
from retinabench.settings import ReliabilitySettings
from retinabench.models.tiny import build_tiny_siglip

from tests.conftest import REPO

TASK = {"name": "d_anydr", "dataset": "d", "label": "dr3", "classes": ["no", "yes"], "ordinal": False,
        "harmonised": "any_dr", "modality": "cfp", "derive": {"no": ["none"], "yes": ["npdr", "pdr"]}}
SETS = ("focus", "plain")


def world(n=48, seed=0):
    rng = np.random.default_rng(seed)
    ids = [f"im{k}" for k in range(n)]
    y = rng.integers(0, 2, n)
    manifest = pd.DataFrame({"image_id": ids, "dataset": "d", "modality": "cfp", "patient_id": [f"p{k}" for k in range(n)],
                             "age": rng.integers(30, 90, n).astype(float), "sex": rng.choice(["female", "male"], n),
                             "quality": rng.choice(["good", "poor"], n, p=[0.8, 0.2]), "site": "A",
                             "dr3": np.where(y == 1, "npdr", "none")})
    split = pd.DataFrame({"image_id": ids, "patient_id": manifest["patient_id"], "dataset": "d", "task": TASK["name"],
                          "label": np.where(y == 1, "yes", "no"), "y": y, "split": np.where(np.arange(n) % 2, "test", "val"),
                          "balanced": True})
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    excl = pd.DataFrame(columns=["dataset", "source", "image_id", "scope", "reason"])
    return ids, images, manifest, split, excl


@pytest.fixture(scope="module")
def tables(tmp_path_factory, tiny_mllms):
    ids, images, manifest, split, excl = world()
    prompts = load_prompts(REPO / "config/prompts.yaml")
    inputs = [TaskInput(TASK, split, ids, images, manifest)]
    folder = tmp_path_factory.mktemp("sig")
    sig = build_tiny_siglip(folder)
    logs = {"zeroshot": [], "mllm": []}
    zs = INTERFACES["zeroshot"].run(sig, inputs, prompts, {"prompt_sets": list(SETS), "device": "cpu"},
                                    weights=folder, log=logs["zeroshot"].append)
    entry, mfolder = tiny_mllms["tiny_qwen2_vl"]
    ml = INTERFACES["mllm"].run(entry, inputs, prompts, MLLMSettings(prompt_sets=SETS, max_new_tokens=3,
                                                                     batch_size=8, device="cpu"),
                                weights=mfolder, log=logs["mllm"].append)
    return {"zeroshot": zs, "mllm": ml}, manifest, split, excl, logs


@pytest.mark.parametrize("interface", ["zeroshot", "mllm"])
def test_job_predictions_follow_the_shared_schema_with_the_interface_extras(tables, interface, tmp_path):
    preds = tables[0][interface]
    spec = INTERFACES[interface]
    want = {p if s == "focus" else f"{p}@{s}" for p in spec.protocols for s in SETS}
    assert set(preds["protocol"]) == want and {interface_of(p).name for p in want} == {interface}
    assert set(spec.extras) <= set(preds.columns)
    back = read_table(write_table(preds, tmp_path / "p.parquet", "predictions"), "predictions")
    assert len(back) == len(preds) and set(spec.extras) <= set(back.columns)
    # every split row is predicted by every protocol: nothing dropped
    per = preds.groupby(["protocol", "split"]).size()
    assert (per == per.iloc[0]).all() and per.loc[(spec.protocols[0], "test")] == 24


@pytest.mark.parametrize("interface", ["zeroshot", "mllm"])
def test_metrics_and_reliability_tables_for_both_interfaces(tables, interface):
    preds_by, manifest, split, excl, _ = tables
    preds = preds_by[interface]
    m = metrics_table(preds, {TASK["name"]: TASK})
    assert set(m["protocol"]) == set(preds["protocol"])
    for proto, g in m.groupby("protocol"):
        assert {"accuracy", "auroc", "ece", "ece_top_label"} <= set(g["metric"]), proto
        assert g[g["metric"] == "auroc"]["value"].notna().all(), proto
    if interface == "mllm":
        for proto in ("mllm", "mllm_renorm", "mllm@plain"):
            test = preds[(preds["split"] == "test") & (preds["protocol"] == proto)]
            got = m[(m["split"] == "test") & (m["protocol"] == proto)].set_index("metric")
            assert got.loc["invalid_rate", "value"] == pytest.approx((test["y_pred"] == -1).mean())
            assert got.loc["invalid_rate", "n"] == len(test)
            # invalid answers counted wrong; valid-only accuracy beside it with its own n
            assert got.loc["accuracy", "value"] == pytest.approx((test["y_pred"] == test["y_true"]).mean())
            valid = test[test["y_pred"] != -1]
            assert got.loc["accuracy_valid", "n"] == len(valid)
        # same hard predictions, different scores
        raw, ren = (preds[preds["protocol"] == p].sort_values(["split", "image_id"]) for p in ("mllm", "mllm_renorm"))
        assert (raw["y_pred"].to_numpy() == ren["y_pred"].to_numpy()).all()
        assert not np.allclose(raw["p_yes"], ren["p_yes"])
    else:
        assert "invalid_rate" not in set(m["metric"])
    out = evaluate_predictions(preds, manifest, excl, {TASK["name"]: split}, {TASK["name"]: TASK},
                               ReliabilitySettings(), source=interface)
    assert set(out["metrics"]["protocol"]) == set(preds["protocol"])
    assert len(out["calibration"]) == preds["protocol"].nunique()
    sub = out["subgroups"]
    assert {"sex", "age_median"} <= set(sub["attribute"]) and set(sub["protocol"]) == set(preds["protocol"])
    assert len(out["gaps"]) and set(out["gaps"]["protocol"]) == set(preds["protocol"])  # fairness rows per protocol


def test_mllm_job_counts_and_prints_invalid_answers(tables):
    preds, logs = tables[0]["mllm"], tables[4]["mllm"]
    counts = answer_counts(preds)
    assert 0 < (preds["y_pred"] == -1).sum() < len(preds)  # the seeded tiny model gives both kinds of answer
    assert counts["n"].sum() == len(preds)
    assert counts["n_invalid"].sum() == int((preds["y_pred"] == -1).sum())
    lines = [line for line in logs if "answers invalid" in line]
    assert len(lines) == len(SETS) * 2  # per prompt set's raw protocol, val and test
    first = counts[(counts["protocol"] == "mllm") & (counts["split"] == "test")].iloc[0]
    assert any(f"{first.n_invalid} of {first.n} answers invalid" in line and " mllm u-u test" in line for line in lines)


def test_prompt_variant_spread_and_ece_difference_from_the_job_tables(tables):
    preds_by = tables[0]
    both = pd.concat([preds_by["zeroshot"], preds_by["mllm"]], ignore_index=True)
    m = metrics_table(both, {TASK["name"]: TASK})
    spread = prompt_sensitivity(m)
    test = spread[spread["split"] == "test"].set_index("base_protocol")
    assert set(test.index) == {"zeroshot", "zeroshot_focus", "mllm", "mllm_renorm"}
    assert (test["n_prompt_sets"] == 2).all()
    au = m[(m["metric"] == "auroc") & (m["split"] == "test")].set_index("protocol")["value"]
    assert test.loc["mllm", "range"] == pytest.approx(abs(au["mllm"] - au["mllm@plain"]))
    diff = ece_difference(preds_by["zeroshot"], {TASK["name"]: TASK})
    assert set(diff["prompt_set"]) == set(SETS) and (diff["n"] == diff["n"].iloc[0]).all()
    ece = m[(m["metric"] == "ece")].set_index(["protocol", "split"])["value"]
    row = diff[(diff["prompt_set"] == "focus") & (diff["split"] == "test")].iloc[0]
    assert row["ece_focus"] == pytest.approx(ece[("zeroshot_focus", "test")])
    assert row["ece_native"] == pytest.approx(ece[("zeroshot", "test")])
    assert row["ece_diff"] == pytest.approx(row["ece_focus"] - row["ece_native"])


def test_settings_and_entry_selection_are_checked():
    from retinabench.settings import ConfigError, MLLMSection
    assert ZeroShotSettings.of(None, "zeroshot") == ZeroShotSettings()
    assert MLLMSettings.of({"regimes": ["u-u", "b-b"]}, "mllm").regimes == ["u-u", "b-b"]
    assert MLLMSection.of({"enabled": True, "batch_size": 2}).job() == MLLMSettings(batch_size=2)
    with pytest.raises(ConfigError, match="mllm.max_tokens: unknown key; did you mean 'mllm.max_new_tokens'"):
        MLLMSettings.of({"max_tokens": 4}, "mllm")
    with pytest.raises(ConfigError, match=r"zeroshot.regimes\[0\]: Input should be 'u-u'"):
        ZeroShotSettings.of({"regimes": ["x-y"]}, "zeroshot")
    encoders = {"a": {"interfaces": ["features", "zeroshot"]}, "b": {"interfaces": ["mllm"]},
                "c": {"zeroshot_note": "needs its own code"}}
    assert selected_entries(encoders, "zeroshot") == ["a"] and selected_entries(encoders, "mllm") == ["b"]
    with pytest.raises(KeyError, match="needs its own code"):
        selected_entries(encoders, "zeroshot", ["a", "c"])


def test_the_mllm_job_refuses_a_leaking_row_before_the_model_generates(tiny_mllms, tmp_path, monkeypatch):
    """The leakage guard at render time inside the job: one manifest row whose 'safe' free text repeats the label
    value stops the whole job, naming the image, before any generate() call."""
    import yaml

    from retinabench.prompts import PromptLeakError
    ids, images, manifest, split, _ = world(n=8)
    task = dict(TASK, prompt_metadata=["history"])
    manifest = manifest.assign(history="none reported")
    manifest.loc[5, "dr3"] = "pdr"
    manifest.loc[5, "history"] = "graded pdr last year"
    data = {"defaults": {"mllm": "m"}, "mllm": {"m": {
        "description": "history in the question", "metadata": {"history": {"missing": "no history"}},
        "tasks": {"any_dr": {"yes_class": "yes", "question": "History: {history}. Any diabetic retinopathy?"}}}}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    entry, folder = tiny_mllms["tiny_llava"]
    import transformers
    calls = []
    monkeypatch.setattr(transformers.GenerationMixin, "generate", lambda *a, **k: calls.append(1))
    with pytest.raises(PromptLeakError, match=r"image 'im5'.*\['pdr'\]"):
        INTERFACES["mllm"].run(entry, [TaskInput(task, split, ids, images, manifest)], load_prompts(tmp_path / "p.yaml"),
                               {"device": "cpu", "max_new_tokens": 2}, weights=folder, log=lambda _: None)
    assert calls == []

"""Both new interfaces end to end on tiny random models: their prediction tables feed the metrics code and the
reliability evaluation unchanged (metrics, calibration, subgroup / fairness rows), invalid answers included."""
import numpy as np
import pandas as pd
import pytest

from retinabench.metrics.classification import metrics_table
from retinabench.prompts import load_prompts
from retinabench.protocols.mllm import load_mllm, run_mllm
from retinabench.protocols.zeroshot import load_dual_encoder, run_zeroshot
from retinabench.stages_reliability import evaluate_predictions, reliability_settings
from retinabench.testing.tiny_models import build_tiny_siglip

from tests.conftest import REPO

TASK = {"name": "d_anydr", "dataset": "d", "label": "dr3", "classes": ["no", "yes"], "ordinal": False,
        "harmonised": "any_dr", "modality": "cfp", "derive": {"no": ["none"], "yes": ["npdr", "pdr"]}}


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
    folder = tmp_path_factory.mktemp("sig")
    dual = load_dual_encoder(build_tiny_siglip(folder), weights=folder)
    zs = run_zeroshot(dual, images, ids, split, TASK, prompts, prompt_sets=["focus"], device="cpu")
    entry, mfolder = tiny_mllms["tiny_qwen2_vl"]
    mllm = load_mllm(entry, weights=mfolder, device="cpu")
    ml = run_mllm(mllm, images, ids, manifest, split, TASK, prompts, prompt_sets=["focus"], max_new_tokens=3,
                  batch_size=8)
    return {"zeroshot": zs, "mllm": ml}, manifest, split, excl


@pytest.mark.parametrize("interface", ["zeroshot", "mllm"])
def test_metrics_and_reliability_tables_for_both_interfaces(tables, interface):
    preds_by, manifest, split, excl = tables
    preds = preds_by[interface]
    m = metrics_table(preds, {TASK["name"]: TASK})
    assert {"accuracy", "auroc", "ece"} <= set(m["metric"]) and m["value"].notna().any()
    if interface == "mllm":
        inv = m[m["metric"] == "invalid_rate"]
        test = preds[(preds["split"] == "test") & (preds["protocol"] == "mllm")]
        got = inv[(inv["split"] == "test") & (inv["protocol"] == "mllm")]["value"].item()
        assert got == pytest.approx((test["y_pred"] == -1).mean())
        acc = m[(m["metric"] == "accuracy") & (m["split"] == "test") & (m["protocol"] == "mllm")]["value"].item()
        assert acc == pytest.approx((test["y_pred"] == test["y_true"]).mean())  # invalid answers counted wrong
    out = evaluate_predictions(preds, manifest, excl, {TASK["name"]: split}, {TASK["name"]: TASK},
                               reliability_settings({}), source=interface)
    assert len(out["metrics"]) and set(out["metrics"]["protocol"]) == set(preds["protocol"])
    assert len(out["calibration"]) == preds["protocol"].nunique()
    sub = out["subgroups"]
    assert {"sex", "age_median"} <= set(sub["attribute"]) and len(out["gaps"])  # fairness rows

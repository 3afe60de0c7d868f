"""CLIP-like zero-shot: the two scorings on fixed embeddings, the text ensemble, the dual-encoder loaders on tiny
random models (open_clip with its bundled BPE tokenizer, transformers SigLIP and CLIP) and the predictions."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from retinabench.prompts import load_prompts
from retinabench.models import load_dual_encoder
from retinabench.protocols.zeroshot import (class_embedding, ece_difference, focus_proba, native_proba,
                                            run_zeroshot)
from retinabench.schemas import conform
from retinabench.models.tiny import build_tiny_hf_clip, build_tiny_open_clip, build_tiny_siglip

from tests.conftest import REPO

CLASSES = np.eye(3)[:2]  # two unit class embeddings e1, e2


def _image_with_cosines(c1, c2):
    """A unit vector whose cosines with e1 and e2 are exactly (c1, c2)."""
    return np.array([[c1, c2, math.sqrt(1 - c1 ** 2 - c2 ** 2)]])


def test_focus_scoring_is_softmax_of_100_times_cosine():
    p = focus_proba(_image_with_cosines(0.30, 0.32), CLASSES)
    assert p[0, 1] == pytest.approx(1 / (1 + math.exp(-100 * 0.02)), rel=1e-12)  # 0.8808
    assert p.sum() == pytest.approx(1.0)
    # the scale of the image embedding does not matter (both sides L2-normalised)
    np.testing.assert_allclose(focus_proba(7.5 * _image_with_cosines(0.30, 0.32), 3 * CLASSES), p)


def test_native_scoring_uses_the_learned_scale_and_sigmoid_bias():
    img = _image_with_cosines(0.30, 0.32)
    clip = native_proba(img, CLASSES, logit_scale=50.0)
    assert clip[0, 1] == pytest.approx(1 / (1 + math.exp(-50 * 0.02)), rel=1e-12)  # 0.7311
    sig = native_proba(img, CLASSES, logit_scale=10.0, logit_bias=-3.0)
    s1, s2 = 1 / (1 + math.exp(-(3.0 - 3.0))), 1 / (1 + math.exp(-(3.2 - 3.0)))
    assert sig[0, 1] == pytest.approx(s2 / (s1 + s2), rel=1e-12)  # 0.5237
    # exact in log space where both sigmoids underflow a float64
    tiny = native_proba(img, CLASSES, logit_scale=10.0, logit_bias=-2000.0)
    assert tiny[0, 1] == pytest.approx(math.exp(0.2) / (1 + math.exp(0.2)), rel=1e-9)  # ratio of two tiny sigmoids
    # with OpenAI CLIP's learned scale (exactly 100) the two scorings coincide
    np.testing.assert_allclose(native_proba(img, CLASSES, logit_scale=100.0), focus_proba(img, CLASSES))


def test_class_embedding_averages_normalised_texts_then_renormalises():
    emb = class_embedding(np.array([[1.0, 0.0], [0.0, 2.0]]))
    np.testing.assert_allclose(emb, [2 ** -0.5, 2 ** -0.5])  # not [1, 2] / |[1, 2]|: each text weighs the same
    with pytest.raises(ValueError, match="zero-norm"):
        class_embedding(np.zeros((1, 2)))


@pytest.fixture(scope="module")
def tiny_duals(tmp_path_factory):
    root = tmp_path_factory.mktemp("duals")
    oc = build_tiny_open_clip(root / "oc")
    sig = build_tiny_siglip(root / "sig")
    hfc = build_tiny_hf_clip(root / "hfc")
    return {"open_clip": (oc, root / "oc" / oc["weights_file"]), "siglip": (sig, root / "sig"),
            "hf_clip": (hfc, root / "hfc")}


def test_open_clip_dual_encoder_has_its_text_tower_tokenizer_and_scale(tiny_duals):
    import open_clip
    entry, path = tiny_duals["open_clip"]
    dual = load_dual_encoder(entry, weights=path)
    assert dual.family == "clip" and dual.logit_bias is None
    assert dual.logit_scale == pytest.approx(1 / 0.07, rel=1e-5)  # a random open_clip model's initial scale
    tok = open_clip.get_tokenizer(entry["architecture"])  # the bundled BPE tokenizer, offline
    with torch.inference_mode():
        assert torch.equal(dual.encode_text(["a fundus photograph"]), dual.module.encode_text(tok(["a fundus photograph"])))
    assert dual.weights["dropped"]["count"] == 0  # the whole model, text tower included, loaded strictly


@pytest.mark.parametrize("kind", ["siglip", "hf_clip"])
def test_transformers_native_scoring_equals_the_models_own_head(tiny_duals, kind):
    """zeroshot (one text per class) = the model's own logits_per_image turned into class probabilities."""
    entry, folder = tiny_duals[kind]
    dual = load_dual_encoder(entry, weights=folder)
    assert dual.family == ("siglip" if kind == "siglip" else "clip")
    model = dual.module
    assert dual.logit_scale == pytest.approx(float(model.logit_scale.detach().exp()))
    texts = ["a healthy retina", "diabetic retinopathy"]
    x = torch.randn(3, 3, entry["input_size"], entry["input_size"])
    with torch.inference_mode():
        img = dual.encode_image(x).numpy()
        txt = dual.encode_text(texts).numpy()
    ours = native_proba(img, txt, dual.logit_scale, dual.logit_bias)
    pad = {"padding": "max_length", "max_length": 16} if kind == "siglip" else {"padding": True}
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)(texts, return_tensors="pt", **pad)
    kwargs = {"input_ids": tok["input_ids"]} if kind == "siglip" else dict(tok)
    with torch.inference_mode():
        logits = model(pixel_values=x, **kwargs).logits_per_image.double()
    want = (torch.sigmoid(logits) / torch.sigmoid(logits).sum(1, keepdim=True) if kind == "siglip"
            else torch.softmax(logits, 1)).numpy()
    np.testing.assert_allclose(ours, want, atol=1e-5)
    if kind == "siglip":
        assert dual.logit_bias == pytest.approx(float(model.logit_bias.detach()))


def test_an_entry_without_the_zeroshot_interface_is_refused(tiny_duals):
    from retinabench.models import WeightsError
    entry, path = tiny_duals["open_clip"]
    with pytest.raises(WeightsError, match="does not declare the zeroshot interface"):
        load_dual_encoder(dict(entry, interfaces=["features"], zeroshot_note="needs its own code"), weights=path)


def _split(n=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = [f"img{k}" for k in range(n)]
    y = rng.integers(0, 2, n)
    y[:4] = [0, 1, 0, 1]
    part = np.array(["train", "val", "test", "test"] * (n // 4))
    split = pd.DataFrame({"image_id": ids, "patient_id": [f"p{k}" for k in range(n)], "dataset": "d", "task": "t",
                          "label": np.where(y == 1, "yes", "no"), "y": y, "split": part,
                          "balanced": np.arange(n) % 8 < 6})
    images = rng.integers(0, 256, (n, 40, 40, 3), dtype=np.uint8)
    return ids, images, split


TASK = {"name": "t", "dataset": "d", "label": "dr5", "classes": ["no", "yes"], "ordinal": False,
        "harmonised": "any_dr", "modality": "cfp"}


@pytest.fixture(scope="module")
def zs_predictions(tiny_duals):
    entry, folder = tiny_duals["siglip"]
    dual = load_dual_encoder(entry, weights=folder)
    ids, images, split = _split()
    prompts = load_prompts(REPO / "config/prompts.yaml")
    return run_zeroshot(dual, images, ids, split, TASK, prompts, regimes=["u-u", "b-b"], device="cpu"), split


def test_zeroshot_predictions_follow_the_schema_for_every_prompt_set_and_regime(zs_predictions):
    preds, split = zs_predictions
    conform(preds, "predictions")  # the shared schema (+ prompt_set): every downstream metric applies
    assert set(preds["protocol"]) == {"zeroshot", "zeroshot_focus", "zeroshot@ensemble", "zeroshot_focus@ensemble",
                                      "zeroshot@plain", "zeroshot_focus@plain"}
    assert set(preds.loc[preds["protocol"] == "zeroshot", "prompt_set"]) == {"focus"}  # the default set
    for (regime, part), g in preds[preds["protocol"] == "zeroshot"].groupby(["regime", "split"]):
        rows = split[split["split"] == part]
        if regime == "b-b":
            rows = rows[rows["balanced"]]
        assert sorted(g["image_id"]) == sorted(rows["image_id"])  # no row dropped, none added
    np.testing.assert_allclose(preds[["p_no", "p_yes"]].sum(axis=1), 1.0)
    assert (preds["seed"] == 0).all() and set(preds["split"]) == {"val", "test"}


def test_ece_difference_is_focus_minus_native(zs_predictions):
    from retinabench.metrics.calibration import ece
    preds, _ = zs_predictions
    diff = ece_difference(preds, {"t": TASK})
    assert len(diff) == 3 * 2 * 2  # prompt sets x regimes x splits
    row = diff[(diff["prompt_set"] == "focus") & (diff["regime"] == "u-u") & (diff["split"] == "test")].iloc[0]
    sel = preds[(preds["regime"] == "u-u") & (preds["split"] == "test")]
    f, n = sel[sel["protocol"] == "zeroshot_focus"], sel[sel["protocol"] == "zeroshot"]
    assert row["ece_focus"] == pytest.approx(ece(f["y_true"].to_numpy(), f[["p_no", "p_yes"]].to_numpy()))
    assert row["ece_native"] == pytest.approx(ece(n["y_true"].to_numpy(), n[["p_no", "p_yes"]].to_numpy()))
    assert row["ece_diff"] == pytest.approx(row["ece_focus"] - row["ece_native"])


@pytest.mark.parametrize("kind", ["open_clip", "siglip"])
def test_check_encoder_verifies_the_text_tower_of_a_zero_shot_entry(tiny_duals, kind, tmp_path):
    """check-encoder on a zeroshot entry: the image tower as for any encoder, then both towers, the tokenizer and
    the head the zeroshot protocol uses; a text tower that does not load fails the check."""
    from retinabench.models.check import check_encoder
    entry, weights = tiny_duals[kind]
    ok, lines = check_encoder(entry, weights=weights)
    text = "\n".join(lines)
    assert ok, text
    assert "zero-shot (both towers, tokenizer)" in text and "shared embedding dimension" in text
    assert ("sigmoid(logit_scale" in text) == (kind == "siglip")
    if kind == "siglip":  # without its tokenizer files the image tower still loads, zero-shot does not
        import shutil
        shutil.copytree(weights, tmp_path / "w")
        for f in (tmp_path / "w").glob("tokenizer*"):
            f.unlink()
        ok, lines = check_encoder(entry, weights=tmp_path / "w")
        text = "\n".join(lines)
        assert not ok and "embedding dimension" in text and "zero-shot (both towers, tokenizer):\n    FAILED" in text


def test_a_siglip_with_a_sentencepiece_tokenizer_loads_as_published(tmp_path):
    """google/siglip-* and MedSigLIP publish spiece.model + tokenizer_config.json (no tokenizer.json): the dual
    encoder loads it through the same loader (needs sentencepiece and protobuf), and texts are tokenised by it."""
    import os
    entry = build_tiny_siglip(tmp_path, tokenizer="sentencepiece")
    assert "spiece.model" in os.listdir(tmp_path) and "tokenizer.json" not in os.listdir(tmp_path)
    dual = load_dual_encoder(entry, weights=tmp_path)
    assert "spiece.model" in dual.weights["files"]
    import torch
    with torch.inference_mode():
        emb = dual.encode_text(["a fundus photograph of diabetic retinopathy", "a healthy eye"]).numpy()
    assert emb.shape == (2, 32) and not np.allclose(emb[0], emb[1])


def test_siglip_text_padding_focus_tokenises_the_classes_together_padded_to_the_longest(tiny_duals):
    """zeroshot.siglip_text_padding: focus = FOCUS's HFSiglipModel.get_text_embeddings (processor(text=texts,
    padding=True, truncation=True), every output passed on) over a task's class prompts in one batch."""
    from transformers import AutoTokenizer

    from retinabench.prompts import ZeroShotPrompts
    from retinabench.protocols.zeroshot import class_embeddings
    entry, folder = tiny_duals["siglip"]
    dual = load_dual_encoder(entry, weights=folder)
    prompts = ZeroShotPrompts("s", "t", ("no", "yes"), (("a healthy retina",),
                                                        ("a fundus photograph with diabetic retinopathy lesions",)))
    texts = [t for ts in prompts.texts for t in ts]
    tok = AutoTokenizer.from_pretrained(folder)(texts, return_tensors="pt", padding=True, truncation=True)
    assert tok["input_ids"].shape[1] < dual.module.config.text_config.max_position_embeddings  # shorter: it differs
    with torch.inference_mode():
        want = dual.module.get_text_features(**{k: v for k, v in tok.items()
                                                if k in ("input_ids", "attention_mask")})
        want = getattr(want, "pooler_output", want).numpy()
    focus = class_embeddings(dual, prompts, "focus")
    np.testing.assert_allclose(focus, np.stack([class_embedding(w[None]) for w in want]), atol=1e-5)
    ours = class_embeddings(dual, prompts)  # max_length: each text padded to the tower's length
    assert not np.allclose(ours, focus, atol=1e-4)
    # a CLIP model pads to the longest already: the option changes nothing there
    clip_entry, clip_folder = tiny_duals["hf_clip"]
    clip = load_dual_encoder(clip_entry, weights=clip_folder)
    np.testing.assert_array_equal(class_embeddings(clip, prompts, "focus"), class_embeddings(clip, prompts))
    with pytest.raises(ValueError, match="siglip_text_padding"):
        class_embeddings(dual, prompts, "longest")


def test_focus_config_plans_ret_clip_and_flair_zero_shot_with_focus_padding(registries):
    """config/focus.yaml lists RET-CLIP and FLAIR as encoders: with their text towers they are now zero-shot jobs
    (one per task set over FOCUS's 18 tasks), their prompts batched as FOCUS's (siglip_text_padding: focus)."""
    import yaml

    from retinabench.plan import WorkflowPlan
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config.update(yaml.safe_load((REPO / "config/focus.yaml").read_text()))
    p = WorkflowPlan(config)
    jobs = {(i, e): j for (i, e, _), j in p.interfaces.jobs.items()}
    for name in ("ret_clip", "flair"):
        assert name in config["encoders"] and len(jobs[("zeroshot", name)].tasks) == 18
        assert registries.encoder(name)["text_tower"]["kind"] == name
    assert p.interfaces.settings["zeroshot"].siglip_text_padding == "focus"

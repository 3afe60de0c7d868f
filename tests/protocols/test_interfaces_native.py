"""Model-native inputs (``zeroshot.inputs`` / ``mllm.inputs``: native): the original file, decoded by the one
decoder, through the model's own processor — a tiny Qwen2-VL sees another pixel grid than from the 224 image cache,
tiny SigLIP / CLIP / open_clip zero-shot equals a hand run of their processors on the decoded original, the inputs
key follows the processor's configuration, and the two modes never mix."""
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from retinabench.data.image_cache import load_image
from retinabench.data.readers import decode_image
from retinabench.prompts import load_prompts
from retinabench.protocols.interfaces import INTERFACES, TaskInput
from retinabench.protocols.native_inputs import (OriginalImages, check_images, image_processor_config, inputs_key,
                                                 original_images)

from tests.conftest import REPO

TASK = {"name": "t", "dataset": "d", "label": "dr5", "classes": ["no", "yes"], "ordinal": False,
        "harmonised": "any_dr", "modality": "cfp"}


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """Six non-square originals (112 x 56 and 60 x 90 px), one a grey 16-bit PNG (the decoder scales it), one an
    RGB JPEG rotated by its EXIF orientation: a manifest, a split and the 224 squash cache of the same files."""
    root = tmp_path_factory.mktemp("orig")
    rng = np.random.default_rng(0)
    rel = []
    for k in range(6):
        h, w = (56, 112) if k % 2 == 0 else (90, 60)
        if k == 1:
            Image.fromarray(rng.integers(0, 65535, (h, w), dtype=np.uint16)).save(root / f"i{k}.png")
        elif k == 3:
            im = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
            exif = im.getexif()
            exif[0x0112] = 6  # rotate 90 degrees when shown
            im.save(root / f"i{k}.jpg", exif=exif, quality=95)
        else:
            Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / f"i{k}.png")
        rel.append(f"i{k}.jpg" if k == 3 else f"i{k}.png")
    ids = [f"img{k}" for k in range(6)]
    manifest = pd.DataFrame({"dataset": "d", "image_id": ids, "path": rel, "patient_id": ids})
    split = pd.DataFrame({"image_id": ids, "y": [0, 1, 0, 1, 0, 1], "split": ["val", "val", "test", "test", "test",
                                                                           "test"], "balanced": True})
    cache = np.stack([load_image(root / p, 224, "squash") for p in rel])
    return root, manifest, split, ids, cache


def _decoded(root, manifest):
    return [decode_image(root / p).image for p in manifest["path"]]


def test_original_images_decode_with_the_one_decoder_in_manifest_order(originals):
    root, manifest, _, ids, _ = originals
    got_ids, images = original_images(manifest, "d", root)
    assert got_ids == ids and len(images) == 6
    want = _decoded(root, manifest)
    assert images[3].size == (90, 60)  # EXIF orientation applied: the stored 60 x 90 (w x h) JPEG is shown rotated
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(images[np.array([0, 1, 3])],
                                                                             [want[0], want[1], want[3]]))
    assert images[1].mode == "RGB" and len(images[1:4]) == 3
    with pytest.raises(FileNotFoundError, match="not under"):
        original_images(manifest.assign(path=manifest["path"] + ".gone"), "d", root)


def test_tiny_qwen2_vl_sees_another_pixel_grid_from_the_original_than_from_the_224_cache(originals, tiny_mllms):
    from retinabench.models import load_mllm
    from retinabench.models.mllm import chat_texts
    from retinabench.protocols.mllm import _batch_inputs
    root, manifest, _, _, cache = originals
    entry, folder = tiny_mllms["tiny_qwen2_vl"]
    m = load_mllm(entry, weights=folder, device="cpu")
    prompt = load_prompts(REPO / "config/prompts.yaml").mllm("plain", TASK)
    _, native = original_images(manifest, "d", root)
    a = _batch_inputs(m, chat_texts(m.processor, prompt, ["q"]), native[[0]])
    b = _batch_inputs(m, chat_texts(m.processor, prompt, ["q"]), cache[[0]])
    # 112 x 56 original: smart resize within max_pixels 56*56 keeps its aspect (28 x 56 px: a 2 x 4 patch grid);
    # the squashed 224 x 224 cache becomes 56 x 56 (4 x 4)
    assert a["image_grid_thw"].tolist() == [[1, 2, 4]] and b["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert a["pixel_values"].shape != b["pixel_values"].shape
    hand = m.processor.image_processor(images=[decode_image(root / manifest["path"][0]).image], return_tensors="pt")
    assert torch.equal(a["pixel_values"], hand["pixel_values"].to(a["pixel_values"].dtype))


def test_inputs_key_follows_the_processor_configuration_and_the_decoder():
    from transformers import Qwen2VLImageProcessor, SiglipImageProcessor
    base = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2)
    same = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2)
    more = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=112 * 112, patch_size=14, merge_size=2)
    key = inputs_key(image_processor_config(base))
    assert key == inputs_key(image_processor_config(same))
    assert key != inputs_key(image_processor_config(more))
    cfg = image_processor_config(base)
    assert inputs_key(dict(reversed(list(cfg.items())))) == key  # key order does not matter
    sig = [SiglipImageProcessor(size={"height": s, "width": s}) for s in (224, 448)]
    assert inputs_key(image_processor_config(sig[0])) != inputs_key(image_processor_config(sig[1]))


def test_inputs_key_changes_with_the_decoder(monkeypatch):
    from retinabench.protocols import native_inputs
    cfg = {"class": "X", "size": 1}
    before = inputs_key(cfg)
    monkeypatch.setattr(native_inputs, "decoder_version", lambda: "another decoder")
    assert inputs_key(cfg) != before


@pytest.fixture(scope="module")
def duals(tmp_path_factory):
    from retinabench.models.tiny import build_tiny_hf_clip, build_tiny_open_clip, build_tiny_siglip
    root = tmp_path_factory.mktemp("duals")
    out = {}
    for name, build in (("siglip", build_tiny_siglip), ("clip", build_tiny_hf_clip), ("oc", build_tiny_open_clip)):
        entry = build(root / name)
        out[name] = (entry, root / name if entry["source"] == "transformers" else root / name / entry["weights_file"])
    return out


def _hand_embeddings(name, entry, weights, images):
    """The model's own processor run by hand on the decoded originals, then the image tower."""
    from retinabench.models.dual_encoder import load_dual_encoder
    dual = load_dual_encoder(entry, weights=weights)
    if entry["source"] == "transformers":
        from transformers import AutoImageProcessor
        pix = AutoImageProcessor.from_pretrained(weights, local_files_only=True)(images=images,
                                                                                 return_tensors="pt")["pixel_values"]
    else:
        import open_clip
        from retinabench.models.preprocess import resolve_normalization
        mean, std = resolve_normalization(entry)
        tf = open_clip.image_transform(dual.module.visual.image_size, is_train=False, mean=mean, std=std)
        pix = torch.stack([tf(im) for im in images])
    with torch.inference_mode():
        return dual, dual.encode_image(pix).float().numpy(), pix


@pytest.mark.parametrize("name", ["siglip", "clip", "oc"])
def test_native_zero_shot_equals_a_hand_run_of_the_processor_on_the_decoded_original(name, duals, originals):
    from retinabench.protocols.native_inputs import dual_processor
    from retinabench.protocols.zeroshot import class_embeddings, embed_images, focus_proba
    root, manifest, split, _, cache = originals
    entry, weights = duals[name]
    prompts = load_prompts(REPO / "config/prompts.yaml")
    ids, native = original_images(manifest, "d", root)
    dual, want_emb, pix = _hand_embeddings(name, entry, weights, _decoded(root, manifest))
    assert pix.shape[-2:] == (entry["input_size"],) * 2
    proc = dual_processor(entry, dual, weights)
    rows = np.arange(6)
    emb = embed_images(dual, native, rows=rows, batch_size=4, device="cpu", prepare=proc)
    np.testing.assert_allclose(emb, want_emb, rtol=1e-5, atol=1e-6)
    from_cache = embed_images(dual, cache, rows=rows, batch_size=4, device="cpu")
    assert not np.allclose(from_cache, want_emb, atol=1e-3)  # the 224 squash, resized again: another input
    # the whole job: the same embeddings reach the predictions
    s = {"device": "cpu", "inputs": "native", "prompt_sets": ["plain"]}
    preds = INTERFACES["zeroshot"].run(entry, [TaskInput(TASK, split, ids, native, manifest)], prompts, s,
                                       weights=weights, log=lambda _: None)
    assert preds.attrs["inputs"]["mode"] == "native" and preds.attrs["inputs"]["key"] == proc.key
    want = focus_proba(want_emb, class_embeddings(dual, prompts.zeroshot("plain", TASK)))
    got = preds[preds["protocol"].str.startswith("zeroshot_focus")].set_index("image_id").loc[ids]
    np.testing.assert_allclose(got[["p_no", "p_yes"]].to_numpy(), want, rtol=1e-5, atol=1e-6)
    cached = INTERFACES["zeroshot"].run(entry, [TaskInput(TASK, split, ids, cache, manifest)], prompts,
                                        {**s, "inputs": "cache"}, weights=weights, log=lambda _: None)
    assert cached.attrs["inputs"] == {"mode": "cache"}


def test_a_job_refuses_images_of_the_other_mode(duals, originals):
    root, manifest, split, ids, cache = originals
    entry, weights = duals["siglip"]
    prompts = load_prompts(REPO / "config/prompts.yaml")
    with pytest.raises(ValueError, match="inputs native needs the original images"):
        INTERFACES["zeroshot"].run(entry, [TaskInput(TASK, split, ids, cache, manifest)], prompts,
                                   {"device": "cpu", "inputs": "native"}, weights=weights, log=lambda _: None)
    with pytest.raises(ValueError, match="inputs cache needs the image cache"):
        check_images("cache", OriginalImages([root / "i0.png"]), "mllm m/t")


def test_native_mllm_job_records_its_processor_key(originals, tiny_mllms):
    root, manifest, split, _, _ = originals
    entry, folder = tiny_mllms["tiny_qwen2_vl"]
    ids, native = original_images(manifest, "d", root)
    prompts = load_prompts(REPO / "config/prompts.yaml")
    s = {"device": "cpu", "inputs": "native", "prompt_sets": ["plain"], "max_new_tokens": 2}
    preds = INTERFACES["mllm"].run(entry, [TaskInput(TASK, split, ids, native, manifest)], prompts, s,
                                   weights=folder, log=lambda _: None)
    rec = preds.attrs["inputs"]
    assert rec["mode"] == "native" and rec["processor"] == "Qwen2VLImageProcessor"
    from retinabench.models import load_mllm
    proc = load_mllm(entry, weights=folder, device="cpu").processor
    assert rec["key"] == inputs_key(image_processor_config(proc))
    assert len(preds) == 2 * int(split["split"].isin(["val", "test"]).sum())  # both protocols, every row


def test_focus_config_runs_native_inputs_and_ours_the_cache():
    import yaml
    from snakemake.utils import update_config

    from retinabench.settings import load
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    ours = load(config).plain()
    update_config(config, yaml.safe_load((REPO / "config/focus.yaml").read_text()))
    focus = load(config).plain()
    for interface in ("zeroshot", "mllm"):
        assert ours[interface]["inputs"] == "cache" and focus[interface]["inputs"] == "native"

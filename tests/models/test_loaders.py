"""Encoder loading: real packaged ImageNet weights, the strict hub path (issue 9 §3), key maps, provenance."""
import copy
import json

import numpy as np
import pytest
import torch

from retinabench.models import WeightsError, build_encoder
from retinabench.models.strict import load_state_dict_strict
from tests.models.conftest import hub_entry, lock_record


def _tiny_vit_file(path, drop=(), extra=None, seed=1, **kwargs):
    """A timm hub-layout file (model.safetensors of a ViT-Tiny) and the source model it came from."""
    import timm
    from safetensors.torch import save_file
    torch.manual_seed(seed)
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **kwargs).eval()
    sd = {k: v.contiguous() for k, v in src.state_dict().items() if k not in drop}
    sd.update(extra or {})
    save_file(sd, str(path))
    return src


VIT_TINY = dict(source="timm", architecture="vit_tiny_patch16_224", weights_file="model.safetensors",
                input_size=224, pooling="cls", embed_dim=192)


def test_packaged_efficientnet_lite0_is_real_imagenet(registries):
    """The key mapping is right only if the packaged weights classify a real photo correctly."""
    from importlib import resources

    from matplotlib import cbook
    from PIL import Image

    entry = registries.encoder("efficientnet_lite0_in1k")
    enc = build_encoder(entry)
    assert enc.embed_dim == 1280 and enc.weights["files"] == {"efficientnet-lite0-57934424.pth": entry["sha256"]}
    assert enc.weights["dropped"] == {"count": 2, "keys": ["_fc.bias", "_fc.weight"]}  # the classifier, recorded
    # Re-attach the packaged classifier to check ImageNet predictions on matplotlib's Grace Hopper photo.
    path = resources.files(entry["package"]).joinpath(entry["weights_file"])
    sd = torch.load(str(path), map_location="cpu", weights_only=True)
    head = torch.nn.Linear(1280, 1000)
    head.load_state_dict({"weight": sd["_fc.weight"], "bias": sd["_fc.bias"]})
    with cbook.get_sample_data("grace_hopper.jpg") as fh:
        img = np.asarray(Image.open(fh).convert("RGB").resize((224, 224)), dtype=np.float32) / 255
    x = (torch.from_numpy(img).permute(2, 0, 1)[None] - 0.5) / 0.5
    with torch.inference_mode():
        top = head(enc.module(x)).softmax(-1)[0]
    assert int(top.argmax()) == 652  # "military uniform"
    assert float(top[652]) > 0.25


def test_random_init_is_deterministic(registries):
    entry = registries.encoder("resnet18_random")
    a, b = build_encoder(entry), build_encoder(entry)
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        assert torch.equal(a.module(x), b.module(x))
    assert a.weights["init"] == "random" and a.weights["files"] == {}


def test_vit_uses_cls_token(registries):
    enc = build_encoder(registries.encoder("vit_tiny_random"))
    assert enc.embed_dim == 192
    assert enc.module.global_pool == "token"


def test_wrong_sha256_is_an_error(registries):
    entry = copy.deepcopy(registries.encoder("efficientnet_lite0_in1k"))
    entry["sha256"] = "0" * 64
    with pytest.raises(WeightsError, match="sha256 mismatch"):
        build_encoder(entry)


def test_missing_and_unexpected_keys_are_errors():
    import timm
    model = timm.create_model("resnet18", pretrained=False, num_classes=0)
    sd = model.state_dict()
    broken = dict(sd)
    broken.pop("layer1.0.conv1.weight")
    broken["extra.weight"] = torch.zeros(1)
    with pytest.raises(WeightsError, match=r"1 missing keys \['layer1.0.conv1.weight'\]; 1 unexpected keys "
                                           r"\['extra.weight'\]") as err:
        load_state_dict_strict(model, broken, "resnet18")
    assert err.value.report.missing == ["layer1.0.conv1.weight"]
    load_state_dict_strict(model, sd, "resnet18")  # exact match loads


# --- issue 9 §3: hub weights load strictly, like packaged ones ------------------------------------------------
def test_timm_hub_file_reproduces_the_source_model_bit_for_bit(tmp_path, fake_hub):
    path = tmp_path / "model.safetensors"
    src = _tiny_vit_file(path)
    entry = hub_entry(fake_hub, "vit_tiny_hub", "org/vit-tiny", {"model.safetensors": path}, **VIT_TINY)
    enc = build_encoder(entry)
    assert fake_hub.calls == [("org/vit-tiny", "model.safetensors", "a" * 40)]  # the locked revision
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        assert torch.equal(enc.module(x), src(x))
    assert enc.weights["revision"] == "a" * 40 and enc.weights["hub_id"] == "org/vit-tiny"
    assert enc.weights["files"] == entry["lock"]["files"] and enc.weights["dropped"] == {"count": 0, "keys": []}


def test_timm_hub_missing_key_names_the_key(tmp_path, fake_hub):
    path = tmp_path / "model.safetensors"
    _tiny_vit_file(path, drop=("blocks.3.attn.proj.bias",))
    entry = hub_entry(fake_hub, "vit_tiny_hub", "org/vit-tiny", {"model.safetensors": path}, **VIT_TINY)
    with pytest.raises(WeightsError, match=r"1 missing keys \['blocks.3.attn.proj.bias'\]"):
        build_encoder(entry)


def test_timm_hub_unexpected_key_names_the_key(tmp_path, fake_hub):
    path = tmp_path / "model.safetensors"
    _tiny_vit_file(path, extra={"blocks.12.norm1.weight": torch.ones(192)})
    entry = hub_entry(fake_hub, "vit_tiny_hub", "org/vit-tiny", {"model.safetensors": path}, **VIT_TINY)
    with pytest.raises(WeightsError, match=r"1 unexpected keys \['blocks.12.norm1.weight'\]"):
        build_encoder(entry)


def test_classifier_head_is_dropped_only_when_declared_and_the_drop_is_recorded(tmp_path, fake_hub):
    path = tmp_path / "model.safetensors"
    src = _tiny_vit_file(path, extra={"head.weight": torch.randn(10, 192), "head.bias": torch.zeros(10)})
    entry = hub_entry(fake_hub, "vit_tiny_hub", "org/vit-tiny", {"model.safetensors": path}, **VIT_TINY)
    with pytest.raises(WeightsError, match=r"2 unexpected keys \['head.bias', 'head.weight'\]"):
        build_encoder(entry)
    entry = hub_entry(fake_hub, "vit_tiny_hub", "org/vit-tiny", {"model.safetensors": path}, drop_keys=["head.*"],
                      **VIT_TINY)
    enc = build_encoder(entry)
    assert enc.weights["dropped"] == {"count": 2, "keys": ["head.bias", "head.weight"]}
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        assert torch.equal(enc.module(x), src(x))


def test_shape_mismatch_names_the_key(tmp_path, fake_hub):
    path = tmp_path / "model.safetensors"
    _tiny_vit_file(path, extra={"cls_token": torch.zeros(1, 1, 96)})
    entry = hub_entry(fake_hub, "vit_tiny_hub", "org/vit-tiny", {"model.safetensors": path}, **VIT_TINY)
    with pytest.raises(WeightsError, match=r"shape mismatches .*\('cls_token', \(1, 1, 96\), \(1, 1, 192\)\)"):
        build_encoder(entry)


def test_hub_file_with_another_sha256_than_the_lock_is_refused(tmp_path, fake_hub):
    path = tmp_path / "model.safetensors"
    _tiny_vit_file(path)
    entry = hub_entry(fake_hub, "vit_tiny_hub", "org/vit-tiny", {"model.safetensors": path}, **VIT_TINY)
    _tiny_vit_file(path, seed=2)  # the hub file changed after locking
    with pytest.raises(WeightsError, match="sha256 mismatch"):
        build_encoder(entry)


def test_unlocked_and_stale_hub_entries_say_how_to_lock(tmp_path, fake_hub):
    path = tmp_path / "model.safetensors"
    _tiny_vit_file(path)
    entry = hub_entry(fake_hub, "vit_tiny_hub", "org/vit-tiny", {"model.safetensors": path}, **VIT_TINY)
    stale = dict(entry, hub_id="org/other")
    with pytest.raises(WeightsError, match=r"is stale .*run `retinabench lock-encoders vit_tiny_hub`"):
        build_encoder(stale)
    with pytest.raises(WeightsError, match=r"is not locked .*`retinabench lock-encoders vit_tiny_hub`"):
        build_encoder(dict(entry, lock=None))


def test_pos_embed_is_resampled_from_the_declared_checkpoint_grid_and_recorded(tmp_path, fake_hub):
    """A DINOv2-style file at 518 px loads into the 224 px architecture as timm's own loader would do it."""
    import timm
    from timm.layers import resample_abs_pos_embed
    path = tmp_path / "model.safetensors"
    src = _tiny_vit_file(path, img_size=64)  # pos grid 4x4
    fields = dict(VIT_TINY, input_size=32, checkpoint_img_size=64)
    entry = hub_entry(fake_hub, "vit_tiny_hub", "org/vit-tiny", {"model.safetensors": path}, **fields)
    enc = build_encoder(entry)
    assert enc.weights["transforms"] == ["pos_embed resampled 4x4 -> 2x2 (bicubic, antialias)"]
    want = resample_abs_pos_embed(src.pos_embed.detach(), new_size=[2, 2], old_size=[4, 4], num_prefix_tokens=1,
                                  interpolation="bicubic", antialias=True)
    assert torch.equal(enc.module.pos_embed.detach(), want)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32,
                            pretrained_cfg_overlay={"file": str(path)})
    timm.models.load_checkpoint(ref, str(path), filter_fn=timm.models.vision_transformer.checkpoint_filter_fn)
    assert torch.allclose(enc.module.pos_embed, ref.pos_embed, atol=1e-6)
    with pytest.raises(WeightsError, match="checkpoint_img_size 96 with patch 16 means 37"):
        build_encoder(dict(entry, checkpoint_img_size=96))


def test_registers_are_never_pooled_as_patches():
    from retinabench.models import build_architecture
    base = {"name": "reg", "source": "timm", "architecture": "vit_small_patch14_reg4_dinov2", "input_size": 56,
            "model_kwargs": {"depth": 1}, "init": "random"}
    torch.manual_seed(0)
    mean_pool = build_architecture(dict(base, pooling="patch_mean")).eval()
    with torch.inference_mode():
        x = torch.randn(2, 3, 56, 56)
        tokens = mean_pool.forward_features(x)  # [cls, 4 registers, 16 patches], final norm applied
        assert tokens.shape[1] == 1 + 4 + 16 and mean_pool.num_prefix_tokens == 5
        assert torch.allclose(mean_pool(x), tokens[:, 5:].mean(1), atol=1e-6)
        cls = build_architecture(dict(base, pooling="cls")).eval()
        cls.load_state_dict(mean_pool.state_dict())
        assert torch.equal(cls(x), tokens[:, 0])


# --- key maps ---------------------------------------------------------------------------------------------------
def test_lukemelas_keymap_round_trips_and_rejects_unknown_keys():
    import timm
    from retinabench.models.keymaps import apply_keymap, invert_keymap, lukemelas_efficientnet_lite0
    assert lukemelas_efficientnet_lite0("_blocks.1._expand_conv.weight") == "blocks.1.0.conv_pw.weight"
    assert lukemelas_efficientnet_lite0("_blocks.15._bn2.bias") == "blocks.6.0.bn3.bias"
    with pytest.raises(KeyError):
        lukemelas_efficientnet_lite0("_blocks.16._bn2.bias")
    with pytest.raises(KeyError):
        lukemelas_efficientnet_lite0("_mystery.weight")
    sd = timm.create_model("efficientnet_lite0", pretrained=False).state_dict()
    published = invert_keymap(sd, "lukemelas_efficientnet_lite0")
    assert "_blocks.15._bn2.bias" in published and "_fc.weight" in published
    assert apply_keymap(published, "lukemelas_efficientnet_lite0").keys() == sd.keys()


def test_dinov2_official_keymap_flattens_chunks_and_refuses_what_it_cannot_place():
    from retinabench.models.keymaps import apply_keymap
    sd = {"blocks.0.0.norm1.weight": 1, "blocks.1.6.mlp.fc1.weight": 2, "cls_token": 3}
    assert apply_keymap(sd, "dinov2_official") == {"blocks.0.norm1.weight": 1, "blocks.6.mlp.fc1.weight": 2,
                                                   "cls_token": 3}
    with pytest.raises(KeyError, match="'mask_token'"):
        apply_keymap({"mask_token": 0}, "dinov2_official")
    with pytest.raises(KeyError, match="maps two keys onto 'blocks.0.norm1.weight'"):
        apply_keymap({"blocks.0.0.norm1.weight": 1, "blocks.0.norm1.weight": 2}, "dinov2_official")


def test_retizero_lora_merge_equals_the_adapted_forward():
    """RetiZero's _LoRA_qkv adds B_q(A_q(x)) / B_v(A_v(x)) to the q / v thirds of qkv(x); the merged weight must
    give the same output."""
    from retinabench.models.keymaps import apply_keymap, invert_keymap
    torch.manual_seed(0)
    dim, r = 16, 4
    qkv = torch.nn.Linear(dim, 3 * dim)
    a_q, b_q, a_v, b_v = (torch.nn.Linear(*s, bias=False) for s in ((dim, r), (r, dim), (dim, r), (r, dim)))
    x = torch.randn(2, 5, dim)
    ref = qkv(x)
    ref[..., :dim] += b_q(a_q(x))
    ref[..., -dim:] += b_v(a_v(x))
    published = {"blocks.0.attn.qkv.qkv.weight": qkv.weight.detach(), "blocks.0.attn.qkv.qkv.bias": qkv.bias.detach(),
                 "blocks.0.attn.qkv.linear_a_q.weight": a_q.weight.detach(),
                 "blocks.0.attn.qkv.linear_b_q.weight": b_q.weight.detach(),
                 "blocks.0.attn.qkv.linear_a_v.weight": a_v.weight.detach(),
                 "blocks.0.attn.qkv.linear_b_v.weight": b_v.weight.detach(), "norm.weight": torch.ones(dim)}
    merged = apply_keymap(published, "retizero_lora")
    assert set(merged) == {"blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "norm.weight"}
    out = torch.nn.functional.linear(x, merged["blocks.0.attn.qkv.weight"], merged["blocks.0.attn.qkv.bias"])
    assert torch.allclose(out, ref, atol=1e-6)
    back = apply_keymap(invert_keymap(merged, "retizero_lora", rng=torch.Generator().manual_seed(1)), "retizero_lora")
    assert torch.allclose(back["blocks.0.attn.qkv.weight"], merged["blocks.0.attn.qkv.weight"], atol=1e-6)
    published.pop("blocks.0.attn.qkv.linear_b_v.weight")
    with pytest.raises(KeyError, match="linear_b_v"):
        apply_keymap(published, "retizero_lora")


# --- transformers and open_clip through the same strict rules -------------------------------------------------
def _tiny_dinov2(folder, with_classifier=False, processor=None):
    from transformers import Dinov2Config, Dinov2Model
    torch.manual_seed(0)
    cfg = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       patch_size=14, image_size=28)
    model = Dinov2Model(cfg).eval()
    model.save_pretrained(folder)
    if with_classifier:
        from safetensors.torch import load_file, save_file
        sd = load_file(str(folder / "model.safetensors"))
        sd["classifier.weight"] = torch.zeros(3, 64)
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "preprocessor_config.json").write_text(json.dumps(processor or {
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "crop_size": {"height": 28,
                                                                                                "width": 28}}))
    return model


HF_TINY = dict(source="transformers", architecture="tiny dinov2", input_size=28, pooling="cls", embed_dim=32,
               hf_config={"model_type": "dinov2", "hidden_size": 32, "num_hidden_layers": 2, "patch_size": 14},
               hf_class="Dinov2Model")


def test_transformers_entry_fetches_config_weights_and_processor_at_the_locked_revision(tmp_path, fake_hub):
    src = _tiny_dinov2(tmp_path)
    files = {f: tmp_path / f for f in ("config.json", "model.safetensors", "preprocessor_config.json")}
    entry = hub_entry(fake_hub, "tiny_dino", "org/tiny-dino", files, **HF_TINY)
    enc = build_encoder(entry)
    assert sorted(c[1] for c in fake_hub.calls) == sorted(files) and {c[2] for c in fake_hub.calls} == {"a" * 40}
    x = torch.randn(2, 3, 28, 28)
    with torch.inference_mode():
        assert torch.equal(enc.module(x), src(pixel_values=x).last_hidden_state[:, 0])
    assert enc.weights["pipeline_checked"] == ["preprocessor_config.json"]


def test_transformers_unexpected_key_config_and_processor_mismatches_are_errors(tmp_path, fake_hub):
    _tiny_dinov2(tmp_path, with_classifier=True)
    files = {f: tmp_path / f for f in ("config.json", "model.safetensors", "preprocessor_config.json")}
    entry = hub_entry(fake_hub, "tiny_dino", "org/tiny-dino", files, **HF_TINY)
    with pytest.raises(WeightsError, match=r"1 unexpected keys \['classifier.weight'\]"):
        build_encoder(entry)
    enc = build_encoder(hub_entry(fake_hub, "tiny_dino", "org/tiny-dino", files, drop_keys=["classifier.*"],
                                  **HF_TINY))
    assert enc.weights["dropped"]["keys"] == ["classifier.weight"]
    bad_cfg = dict(HF_TINY, hf_config={"model_type": "dinov2", "hidden_size": 64})
    with pytest.raises(WeightsError, match=r"config.json disagrees .*\('hidden_size', 64, 32\)"):
        build_encoder(hub_entry(fake_hub, "tiny_dino", "org/tiny-dino", files, drop_keys=["classifier.*"], **bad_cfg))
    with pytest.raises(WeightsError, match="preprocessor_config.json normalises with mean"):
        build_encoder(hub_entry(fake_hub, "tiny_dino", "org/tiny-dino", files, drop_keys=["classifier.*"],
                                **dict(HF_TINY, normalization="inception")))


def test_open_clip_image_tower_loads_strictly_and_projects_like_encode_image(tmp_path, fake_hub, tiny_open_clip):
    import open_clip
    from safetensors.torch import save_file
    torch.manual_seed(0)
    model = open_clip.create_model(tiny_open_clip, pretrained=None).eval()
    path = tmp_path / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    fields = dict(source="open_clip", architecture=tiny_open_clip, weights_file="open_clip_model.safetensors",
                  keep_prefix="visual.", input_size=32, embed_dim=32)
    proj = build_encoder(hub_entry(fake_hub, "tiny_clip", "org/clip", {path.name: path}, pooling="projected",
                                   **dict(fields, embed_dim=16)))
    cls = build_encoder(hub_entry(fake_hub, "tiny_clip", "org/clip", {path.name: path}, pooling="cls", **fields))
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        assert torch.equal(proj.module(x), model.encode_image(x))
        assert torch.allclose(cls.module(x) @ model.visual.proj, model.encode_image(x), atol=1e-6)
    assert proj.weights["dropped"]["count"] > 0 and "visual.proj" not in proj.weights["dropped"].get("keys", [])
    # the whole model (text tower + tokenizer) for zero-shot protocols, loaded strictly too
    from retinabench.models import load_open_clip_model
    full, tokenizer, prov = load_open_clip_model(hub_entry(fake_hub, "tiny_clip", "org/clip", {path.name: path},
                                                           pooling="cls", **fields))
    with torch.inference_mode():
        assert torch.equal(full.encode_text(tokenizer(["a fundus photograph"])),
                           model.encode_text(tokenizer(["a fundus photograph"])))
    assert prov["dropped"]["count"] == 0


@pytest.fixture(scope="module")
def tiny_open_clip(tmp_path_factory):
    """A small open_clip model config (registered like any open_clip config; the bundled BPE tokenizer)."""
    import open_clip
    folder = tmp_path_factory.mktemp("oc_cfg")
    cfg = {"embed_dim": 16, "quick_gelu": True,
           "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 16, "head_width": 16},
           "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
    (folder / "rb-tiny-clip.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(folder)
    return "rb-tiny-clip"


def test_lock_record_helper_matches_pins():
    entry = {"name": "x", "source": "timm", "hub_id": "a/b", "weights_file": "m.safetensors"}
    rec = lock_record(entry, {})
    assert rec["pins"] == {"origin": "hub", "hub_id": "a/b", "files": ["m.safetensors"]}


def test_whole_transformers_dual_encoder_loads_strictly_for_zero_shot(tmp_path, fake_hub):
    """The image encoder drops SigLIP's text tower (declared, recorded); the whole-model loader keeps both."""
    from transformers import SiglipConfig, SiglipModel
    from retinabench.models import load_transformers_model
    torch.manual_seed(0)
    cfg = dict(model_type="siglip",
               vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=28, patch_size=14),
               text_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                                vocab_size=50, max_position_embeddings=16))
    src = SiglipModel(SiglipConfig(**{k: v for k, v in cfg.items() if k != "model_type"})).eval()
    src.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "size": {"height": 28, "width": 28}}))
    files = {f: tmp_path / f for f in ("config.json", "model.safetensors", "preprocessor_config.json")}
    fields = dict(source="transformers", architecture="tiny siglip", input_size=28, pooling="pooler", embed_dim=32,
                  normalization="inception", hf_config=cfg, hf_class="SiglipVisionModel",
                  drop_keys=["text_model.*", "logit_scale", "logit_bias"])
    enc = build_encoder(hub_entry(fake_hub, "tiny_siglip", "org/siglip", files, **fields))
    assert enc.weights["dropped"]["count"] > 0 and "logit_scale" in enc.weights["dropped"]["keys"]
    full, prov = load_transformers_model(hub_entry(fake_hub, "tiny_siglip", "org/siglip", files, **fields))
    assert type(full).__name__ == "SiglipModel" and prov["dropped"]["count"] == 0
    x = torch.randn(1, 3, 28, 28)
    with torch.inference_mode():
        assert torch.allclose(enc.module(x), full.vision_model(pixel_values=x).pooler_output, atol=1e-5)
        ids = torch.tensor([[1, 2, 3]])

        def text(m):
            out = m.get_text_features(input_ids=ids)
            return getattr(out, "pooler_output", out)
        # (attention kernels may differ between a loaded and a directly built model: not bit-exact)
        assert torch.allclose(text(full), text(src), atol=1e-5)


def test_a_weights_path_folder_loads_only_when_every_file_matches_its_pin(tmp_path):
    """A local transformers folder (the demo's tiny models): sha256 maps each file; a changed, unpinned or missing
    file is refused, naming it."""
    from retinabench.hashing import sha256_file
    from retinabench.models import load_dual_encoder
    from retinabench.models.tiny import build_tiny_siglip
    folder = tmp_path / "tiny_siglip"
    entry = build_tiny_siglip(folder)
    pins = {f.name: sha256_file(f) for f in sorted(folder.iterdir())}
    entry |= {"weights_path": str(folder), "sha256": pins}
    model = load_dual_encoder(entry)
    assert model.weights["origin"] == "path" and model.weights["files"] == pins
    with pytest.raises(WeightsError, match="sha256 must map"):
        load_dual_encoder(entry | {"sha256": "0" * 64})
    with pytest.raises(WeightsError, match=r"pinned files missing \['extra.json'\]"):
        load_dual_encoder(entry | {"sha256": pins | {"extra.json": "0" * 64}})
    (folder / "stray.txt").write_text("x")
    with pytest.raises(WeightsError, match=r"files without a sha256 \['stray.txt'\]"):
        load_dual_encoder(entry)
    (folder / "stray.txt").unlink()
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    with pytest.raises(WeightsError, match="sha256 mismatch.*config.json"):
        load_dual_encoder(entry)

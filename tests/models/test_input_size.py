"""Config ``input_size``: every encoder at one side (OcularBench: 224), position embeddings interpolated as timm,
open_clip and transformers do it, the native side still a named value (``native``, config/config.yaml's)."""
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from retinabench.hashing import sha256_file
from retinabench.models import build_encoder
from retinabench.registry import Registries
from retinabench.registry.input_size import apply_input_size, at_input_size
from tests.models.conftest import hub_entry

REPO = Path(__file__).resolve().parents[2]
VIT_TINY = dict(source="timm", architecture="vit_tiny_patch16_224", weights_file="model.safetensors",
                pooling="cls", embed_dim=192)


def _loaded(*files):
    from retinabench.cli import _load_config
    return _load_config([str(REPO / f) for f in files])


def _tiny_cache(folder: Path, n: int = 3, side: int = 224):
    """An image cache as rule image_cache writes it: uint8 [N, S, S, 3] and its index."""
    rng = np.random.default_rng(0)
    np.save(folder / "images.npy", rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8))
    pq.write_table(pa.table({"image_id": [f"img{i}" for i in range(n)], "row": list(range(n))}),
                   folder / "images.index.parquet")
    return folder / "images.npy", folder / "images.index.parquet"


def test_a_timm_vit_made_at_384_runs_at_224_with_timms_own_resampling_and_gives_features(tmp_path, fake_hub):
    import timm
    from safetensors.torch import save_file
    from timm.models.vision_transformer import checkpoint_filter_fn

    from retinabench.features.extract import extract_features, load_features
    torch.manual_seed(3)
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=384).eval()
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    entry = hub_entry(fake_hub, "vit384", "org/vit384", {path.name: path}, input_size=384, **VIT_TINY)
    native = build_encoder(entry)
    assert native.input_size == 384 and native.weights["transforms"] == []
    assert torch.equal(native.module.pos_embed, src.pos_embed)

    run = at_input_size(entry, 224)
    assert (run["input_size"], run["native_input_size"]) == (224, 384) and entry["input_size"] == 384
    enc = build_encoder(run)  # a strict load: any missing / unexpected key or shape mismatch raises
    assert enc.input_size == 224 and tuple(enc.module.pos_embed.shape) == (1, 197, 192)
    assert enc.weights["transforms"] == ["pos_embed resampled 24x24 -> 14x14 (bicubic, antialias)"]
    # timm's own path: the model created with img_size=224, the checkpoint filtered by checkpoint_filter_fn
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=224).eval()
    timm.models.load_checkpoint(ref, str(path), filter_fn=checkpoint_filter_fn, strict=True)
    assert torch.allclose(enc.module.pos_embed, ref.pos_embed, atol=1e-6)
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        assert torch.allclose(enc.module(x), ref(x), atol=1e-5)
    array, index = _tiny_cache(tmp_path)
    info = extract_features(enc, array, index, tmp_path / "features.parquet", batch_size=2, device="cpu",
                            progress=False)
    ids, emb = load_features(tmp_path / "features.parquet")
    assert info["input_size"] == 224 and emb.shape == (3, 192) and np.isfinite(emb).all()
    assert list(ids) == ["img0", "img1", "img2"]


def test_a_declared_checkpoint_grid_still_decides_the_source_grid(tmp_path, fake_hub):
    """DINOv2-style entries (checkpoint_img_size 518, input 224) resample from the checkpoint's grid at any side."""
    import timm
    from safetensors.torch import save_file
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=64)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    entry = hub_entry(fake_hub, "vit64", "org/vit64", {path.name: path}, input_size=32, checkpoint_img_size=64,
                      **VIT_TINY)
    enc = build_encoder(at_input_size(entry, 48))
    assert enc.weights["transforms"] == ["pos_embed resampled 4x4 -> 3x3 (bicubic, antialias)"]


def _pinned(entry: dict, folder: Path) -> dict:
    return entry | {"weights_path": str(folder), "sha256": {f.name: sha256_file(f) for f in sorted(folder.iterdir())
                                                            if f.is_file()}}


@pytest.mark.parametrize("builder, cls_name, side", [("build_tiny_siglip", "SiglipModel", 56),
                                                      ("build_tiny_hf_clip", "CLIPModel", 64)])
def test_transformers_towers_run_at_another_side_with_interpolate_pos_encoding(tmp_path, builder, cls_name, side):
    """SigLIP / CLIP built offline at 28 / 32 px, run at 56 / 64: the image tower and the zero-shot image
    embedding equal transformers' own forward with interpolate_pos_encoding=True; the processor check still
    holds the checkpoint's own side."""
    import transformers

    from retinabench.models import load_dual_encoder, tiny
    folder = tmp_path / "m"
    entry = _pinned(getattr(tiny, builder)(folder), folder)
    full = getattr(transformers, cls_name).from_pretrained(folder).eval()
    run = at_input_size(entry, side)
    enc = build_encoder(run)
    assert enc.input_size == side and enc.module.forward_kwargs == {"interpolate_pos_encoding": True}
    assert any("interpolate_pos_encoding=True" in t for t in enc.weights["transforms"])
    assert enc.weights["pipeline_checked"] == ["preprocessor_config.json"]
    x = torch.randn(2, 3, side, side)
    with torch.inference_mode():
        want = full.vision_model(pixel_values=x, interpolate_pos_encoding=True).pooler_output
        assert torch.allclose(enc.module(x), want, atol=1e-5)
        with pytest.raises((ValueError, RuntimeError)):  # the reason: without interpolation the size is refused
            full.vision_model(pixel_values=x)
        dual = load_dual_encoder(run)
        img = full.get_image_features(pixel_values=x, interpolate_pos_encoding=True)
        assert dual.input_size == side
        assert torch.allclose(dual.encode_image(x), getattr(img, "pooler_output", img), atol=1e-5)
    assert build_encoder(entry).module.forward_kwargs == {}  # native: the forward as before


def test_dinov2_interpolates_on_every_forward_so_it_needs_no_flag(tmp_path, fake_hub):
    from transformers import Dinov2Config, Dinov2Model
    torch.manual_seed(0)
    src = Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                   patch_size=14, image_size=56)).eval()
    src.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
        "crop_size": {"height": 56, "width": 56}}))
    files = {f: tmp_path / f for f in ("config.json", "model.safetensors", "preprocessor_config.json")}
    entry = hub_entry(fake_hub, "tiny_dino", "org/tiny-dino", files, source="transformers", architecture="dinov2",
                      input_size=56, pooling="cls", embed_dim=32, hf_class="Dinov2Model",
                      hf_config={"model_type": "dinov2", "hidden_size": 32, "patch_size": 14})
    enc = build_encoder(at_input_size(entry, 28))
    assert enc.module.forward_kwargs == {} and enc.input_size == 28
    x = torch.randn(2, 3, 28, 28)
    with torch.inference_mode():
        assert torch.allclose(enc.module(x), src(pixel_values=x).last_hidden_state[:, 0], atol=1e-6)


def test_open_clip_tower_is_built_at_the_run_side_and_its_checkpoint_resampled_as_open_clip_does(tmp_path):
    import open_clip
    from open_clip.model import resize_pos_embed

    from retinabench.models import load_open_clip_model, tiny
    folder = tmp_path / "oc"
    entry = tiny.build_tiny_open_clip(folder)
    path = folder / entry["weights_file"]
    entry |= {"weights_path": str(path), "sha256": sha256_file(path)}
    enc = build_encoder(at_input_size(entry, 64))
    assert enc.input_size == 64 and enc.weights["transforms"] == [
        "positional_embedding resampled 5 -> 17 tokens (32px -> 64px; open_clip resize_pos_embed, bicubic, "
        "antialias)"]
    from safetensors.torch import load_file
    ref = open_clip.create_model(entry["architecture"], pretrained=None, force_image_size=64).eval()
    sd = load_file(str(path))
    resize_pos_embed(sd, ref)
    ref.load_state_dict(sd, strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        tokens = ref.visual.transformer(ref.visual._embeds(x))
        assert torch.allclose(enc.module(x), ref.visual._pool(tokens)[0], atol=1e-6)
        full, _, prov = load_open_clip_model(at_input_size(entry, 64))
        assert torch.allclose(full.encode_image(x), ref.encode_image(x), atol=1e-6)
    assert prov["transforms"] == enc.weights["transforms"]


def test_ocularbench_runs_every_encoder_at_224_and_config_yaml_keeps_the_native_sides(monkeypatch):
    monkeypatch.chdir(REPO)
    ocular = _loaded("config/config.yaml", "config/ocularbench.yaml")
    assert ocular["input_size"] == 224
    reg = Registries.from_config(ocular)
    native = Registries.from_config(_loaded("config/config.yaml"))
    resized = []
    for name in ocular["encoders"]:
        entry, own = reg.encoder(name), native.encoder(name)
        assert entry["input_size"] == 224, name
        if own["input_size"] != 224:
            assert entry["native_input_size"] == own["input_size"] and "native_input_size" not in own
            resized.append(name)
        else:
            assert entry == own, name  # already at 224: the same entry, so the same jobs and artifacts
    # the paper's encoders at another side natively (config/encoders.yaml): SigLIP / SigLIP2 384, RAD-DINO 518,
    # RETFound-Green 392
    assert sorted(resized) == ["rad_dino", "retfound_green", "siglip2_so400m_patch14_384",
                               "siglip_so400m_patch14_384"]
    assert _loaded("config/config.yaml")["input_size"] == "native"


def test_a_native_and_a_224_run_plan_different_features_params_over_one_image_cache(monkeypatch):
    """The image cache does not depend on the encoder (its side is image_cache.size, resized at the model's
    input): both runs read the same one; the features job's params (the entry) and so its sidecar differ."""
    from retinabench.plan import WorkflowPlan
    monkeypatch.chdir(REPO)
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["encoders"] = ["siglip_so400m_patch14_384", "vit_tiny_random"]
    plans = {size: WorkflowPlan({**config, "input_size": size}) for size in ("native", 224)}
    a, b = (plans[s].reg.encoder("siglip_so400m_patch14_384") for s in ("native", 224))
    assert (a["input_size"], b["input_size"]) == (384, 224) and a != b
    assert plans["native"].reg.encoder("vit_tiny_random") == plans[224].reg.encoder("vit_tiny_random")
    assert plans["native"].cache_files("phantom") == plans[224].cache_files("phantom")
    assert plans["native"].config["input_size"] == "native" and plans[224].config["input_size"] == 224


def test_registry_outside_a_run_and_entries_without_a_side_are_left_as_declared():
    mllm = {"name": "m", "source": "transformers", "interfaces": ["mllm"]}
    vit = {"name": "v", "input_size": 384}
    assert apply_input_size({"m": mllm, "v": vit}, "native") == {"m": mllm, "v": vit}
    assert apply_input_size({"m": mllm, "v": vit}, 224) == {"m": mllm, "v": {**vit, "input_size": 224,
                                                                               "native_input_size": 384}}
    assert at_input_size(at_input_size(vit, 224), 384) == vit  # back at its own side: the entry as declared


def _ocularbench_resized() -> dict[str, dict]:
    """The OcularBench encoders whose registry side is not 224, as a 224 run builds them."""
    from retinabench.registry import load_registry
    config = yaml.safe_load((REPO / "config/ocularbench.yaml").read_text())
    entries = load_registry(REPO / "config/encoders.yaml", "encoders")
    return {n: at_input_size(entries[n], config["input_size"]) for n in config["encoders"]
            if entries[n]["input_size"] != config["input_size"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_ocularbench_resized()))
def test_each_resized_ocularbench_entry_loads_its_native_layout_at_224(name, tmp_path):
    """A checkpoint in the entry's published layout at its native side (transformers: a one-block version of the
    hub checkpoint's class) loads strictly through the real path into the 224 run and gives the declared
    dimension (transformers: the numbers of the source tower with interpolated position embeddings)."""
    from retinabench.models import build_architecture
    from retinabench.testing.published import reduced_hf_config, save_transformers_checkpoint, write_published
    entry = _ocularbench_resized()[name]
    native = at_input_size(entry, "native")
    assert entry["input_size"] == 224 and native["input_size"] == entry["native_input_size"] != 224
    x = torch.randn(1, 3, 224, 224)
    if entry["source"] == "transformers":
        small = dict(native, hf_config=reduced_hf_config(native))
        src = save_transformers_checkpoint(small, tmp_path / "hub")  # processor file at the native side
        enc = build_encoder(at_input_size(small, 224), weights=tmp_path / "hub")
        tower = src if type(src).__name__ == entry.get("hf_class") else src.vision_model
        kwargs = enc.module.forward_kwargs
        with torch.inference_mode():
            ref = tower(pixel_values=x, **kwargs)
            want = ref.pooler_output if entry["pooling"] == "pooler" else ref.last_hidden_state[:, 0]
            assert torch.allclose(enc.module(x), want, atol=1e-5, rtol=1e-5)
    else:
        path = write_published(native, build_architecture(native, device="meta"), tmp_path / "published.pth")
        enc = build_encoder(entry, weights=path, device="meta")
        assert any(t.startswith("pos_embed resampled") and t.endswith("-> 16x16 (bicubic, antialias)")
                   for t in enc.weights["transforms"])
    assert enc.input_size == 224 and enc.embed_dim == entry["embed_dim"]

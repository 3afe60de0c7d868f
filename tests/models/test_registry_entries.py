"""One offline check per shipped encoder entry (issue 14): the architecture at the declared input size gives the
declared embedding dimension and parameter count, pooling never averages class or register tokens, and a
checkpoint written in the *published* layout (through the entry's inverse key map) loads through the real load
path strictly, with exactly the declared keys dropped. Large models are built on the meta device (the published
file then holds stride-0 tensors and stays small); transformers entries round-trip a one-block version of the
hub checkpoint's class through ``from_pretrained``."""
from pathlib import Path

import pytest
import torch

from retinabench.models import KeyReport, build_architecture, build_encoder, weights_target
from retinabench.testing.published import reduced_hf_config, save_transformers_checkpoint, write_published
from retinabench.registry import load_registry

REPO = Path(__file__).resolve().parents[2]
# Image encoders (the features interface); mllm entries have no image tower of their own here: their offline
# check (architecture on meta, parameter count, a reduced checkpoint through the real loader) is in
# tests/protocols/test_mllm_registry.py.
ENTRIES = {n: e for n, e in load_registry(REPO / "config/encoders.yaml", "encoders").items()
           if "mllm" not in (e.get("interfaces") or [])}


def _param_count(module) -> float:
    return sum(p.numel() for p in weights_target(module).parameters()) / 1e6


def _prefix_tokens(module) -> int | None:
    target = weights_target(module)
    if hasattr(target, "num_prefix_tokens"):  # timm ViT: class + register tokens
        return target.num_prefix_tokens
    return getattr(module, "n_prefix", None)  # transformers wrapper


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entry_architecture_and_published_layout(name, tmp_path):
    entry = ENTRIES[name]
    if entry.get("offline_check"):
        pytest.xfail(entry["offline_check"]["xfail"])
    assert entry.get("embed_dim") and entry.get("params_m"), f"{name}: embed_dim and params_m must be declared"
    # 1. the full-size architecture on meta: dimension at the declared input size, parameter count, pooling
    module = build_architecture(entry, device="meta").eval()
    size = entry["input_size"]
    with torch.inference_mode():
        out = module(torch.empty(2, 3, size, size, device="meta"))
    assert tuple(out.shape) == (2, entry["embed_dim"])
    assert abs(_param_count(module) - entry["params_m"]) <= 0.01 * entry["params_m"] + 0.05, _param_count(module)
    regs = int((entry.get("model_kwargs") or {}).get("reg_tokens", 0)) or (
        4 if "reg4" in entry["architecture"] else int(entry.get("hf_config", {}).get("num_register_tokens", 0)))
    if entry["pooling"] in ("patch_mean", "cls_patch_mean"):
        cls = 0 if (entry.get("model_kwargs") or {}).get("class_token") is False else 1
        assert _prefix_tokens(module) == cls + regs  # class and register tokens excluded from the patch mean
    if entry["pooling"] == "patch_mean" and hasattr(weights_target(module), "global_pool"):
        assert weights_target(module).global_pool == "avg" and isinstance(weights_target(module).fc_norm,
                                                                           torch.nn.Identity)
    if entry.get("init") == "random":
        return
    # 2. a checkpoint in the published layout, loaded through the real path, strictly
    if entry["source"] == "transformers":
        small = dict(entry, hf_config=reduced_hf_config(entry))
        folder = tmp_path / "hub"
        src = save_transformers_checkpoint(small, folder)
        enc = build_encoder(small, weights=folder)
        x = torch.randn(1, 3, size, size)
        with torch.inference_mode():
            emb = enc.module(x)
        assert emb.shape == (1, entry["embed_dim"]) and torch.isfinite(emb).all()
        # the same numbers as the source model's image tower, pooled as declared
        tower = src if type(src).__name__ == entry.get("hf_class") else (
            getattr(src, "vision_model", None) or getattr(src, src.base_model_prefix))
        with torch.inference_mode():
            ref = tower(pixel_values=x)
        want = {"pooler": lambda: ref.pooler_output, "cls": lambda: ref.last_hidden_state[:, 0],
                "patch_mean": lambda: ref.last_hidden_state[:, 1 + regs:].mean(1)}[entry["pooling"]]()
        # (from_pretrained may pick another attention kernel than the directly built model: not bit-exact)
        assert torch.allclose(emb, want, atol=1e-5, rtol=1e-5)
    else:
        path = write_published(entry, module, tmp_path / "published.pth")
        assert path.stat().st_size < 5_000_000  # stride-0 tensors: the file stays small whatever the model size
        enc = build_encoder(entry, weights=path, device="meta")
        assert enc.embed_dim == entry["embed_dim"]
    dropped = enc.weights["dropped"]
    declared = list(entry.get("drop_keys") or []) + ([entry["keep_prefix"]] if entry.get("keep_prefix") else [])
    assert (dropped["count"] > 0) == bool(declared), dropped  # every declared drop used, nothing else dropped
    assert enc.weights["unmatched_drop_keys"] == []


def test_every_study_encoder_is_declared():
    """The reconstructed lists (docs/encoders.md): 33 named OcularBench encoders and FOCUS's vision models."""
    ocular = {n for n, e in ENTRIES.items() if "ocularbench" in (e.get("studies") or []) and "variant_of" not in e}
    focus = {n for n, e in ENTRIES.items() if "focus" in (e.get("studies") or []) and "variant_of" not in e}
    assert len(ocular) == 33, sorted(ocular)
    assert focus == {"vit_large_patch16_in21k", "dinov2_vitl14", "dinov3_vitl16", "visionfm_fundus",
                     "retfound_mae_cfp", "retfound_mae_oct", "retfound_mae_meh", "retfound_mae_shanghai",
                     "retfound_dinov2_meh", "retfound_dinov2_shanghai",
                     # FOCUS's CLIP-like VLMs (their image towers; zero-shot where the text tower loads here)
                     "clip_vitb32_openai", "siglip2_base_patch16_224", "medsiglip_448", "eyeclip", "ret_clip", "flair"}
    for n in ocular | focus:
        e = ENTRIES[n]
        for field in ("paper_name", "domain", "method", "params_m", "embed_dim", "size_class", "input_size",
                      "normalization", "pooling", "exposure"):
            assert field in e, (n, field)
        if e.get("init") != "random":
            for field in ("pretraining_data", "licence", "gated"):
                assert field in e, (n, field)
            assert e.get("hub_id") or e.get("weights_url") or e.get("package"), n
    assert not any(e.get("trust_remote_code") for e in ENTRIES.values())


def test_published_layout_of_a_real_small_model_reproduces_its_embedding(tmp_path):
    """The inverse path with real tensors (not stride-0): a RETFound-style file (MAE checkpoint under 'model',
    decoder keys to drop) of a ViT-Tiny gives back the source model's embedding bit for bit."""
    import timm
    entry = {"name": "mae_tiny", "source": "timm", "architecture": "vit_tiny_patch16_224", "input_size": 224,
             "pooling": "cls", "embed_dim": 192, "state_dict_key": "model", "drop_keys": ["mask_token", "decoder_*"],
             "normalization": "imagenet", "weights_file": "x.pth", "weights_url": "https://example.org/x.pth",
             "download": "manual"}
    torch.manual_seed(3)
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0).eval()
    path = write_published(entry, build_architecture(entry), tmp_path / "ckpt.pth")
    ckpt = torch.load(path, weights_only=True)
    ckpt["model"].update({k: v for k, v in src.state_dict().items()})
    torch.save(ckpt, path)
    enc = build_encoder(entry, weights=path)
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        assert torch.equal(enc.module(x), src(x))
    assert enc.weights["dropped"]["keys"] == ["decoder_placeholder", "mask_token"]
    assert enc.weights["ignored_top_level"] == ["epoch"]


def test_key_report_lists_problems_by_name():
    r = KeyReport(missing=["a"], unexpected=["b"], shape_mismatch=[("c", (1,), (2,))])
    assert not r.ok and "missing keys ['a']" in r.problems() and "unexpected keys ['b']" in r.problems()

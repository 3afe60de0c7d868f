"""Encoder loading: real packaged ImageNet weights, strict key checks, sha256 pins, hub code path offline."""
import copy

import numpy as np
import pytest
import torch

from retinabench.models.loaders import WeightsError, build_encoder, load_state_dict_strict


def test_packaged_efficientnet_lite0_is_real_imagenet(registries):
    """The key mapping is right only if the packaged weights classify a real photo correctly."""
    import timm
    from matplotlib import cbook
    from PIL import Image

    entry = registries.encoder("efficientnet_lite0_in1k")
    enc = build_encoder(entry)
    assert enc.embed_dim == 1280 and enc.weights["sha256"] == entry["sha256"]
    # Re-attach the packaged classifier to check ImageNet predictions on matplotlib's Grace Hopper photo.
    from importlib import resources
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
    assert a.weights["init"] == "random" and a.weights["sha256"] is None


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
    with pytest.raises(WeightsError, match=r"1 missing keys \['layer1.0.conv1.weight'\], 1 unexpected keys"):
        load_state_dict_strict(model, broken, "resnet18")
    load_state_dict_strict(model, sd, "resnet18")  # exact match loads


def test_hub_entry_must_be_pinned(registries):
    with pytest.raises(WeightsError, match="must be pinned"):
        build_encoder(registries.encoder("dinov2_vitb14"))


def test_timm_hub_path_verifies_and_loads_strictly(tmp_path, monkeypatch, registries):
    """The real hub loading code, with the download replaced by a local file of the same architecture."""
    import timm
    from safetensors.torch import save_file
    from retinabench.hashing import sha256_file

    torch.manual_seed(1)
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    calls = []

    def fake_download(repo_id, filename, revision=None):
        calls.append((repo_id, filename, revision))
        return str(path)

    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    entry = {"name": "vit_tiny_hub", "source": "timm", "architecture": "vit_tiny_patch16_224",
             "hub_id": "org/vit-tiny", "revision": "a" * 40, "weights_file": "model.safetensors",
             "sha256": sha256_file(path), "domain": "natural", "method": "supervised", "input_size": 224,
             "normalization": "imagenet", "pooling": "cls", "size_class": "tiny"}
    enc = build_encoder(entry)
    assert calls == [("org/vit-tiny", "model.safetensors", "a" * 40)]
    assert torch.equal(enc.module.state_dict()["blocks.0.attn.qkv.weight"], src.state_dict()["blocks.0.attn.qkv.weight"])
    entry["sha256"] = "f" * 64
    with pytest.raises(WeightsError, match="sha256 mismatch"):
        build_encoder(entry)


def test_keymap_rejects_unknown_keys():
    from retinabench.models.keymaps import lukemelas_efficientnet_lite0
    assert lukemelas_efficientnet_lite0("_blocks.1._expand_conv.weight") == "blocks.1.0.conv_pw.weight"
    assert lukemelas_efficientnet_lite0("_blocks.15._bn2.bias") == "blocks.6.0.bn3.bias"
    with pytest.raises(KeyError):
        lukemelas_efficientnet_lite0("_blocks.16._bn2.bias")
    with pytest.raises(KeyError):
        lukemelas_efficientnet_lite0("_mystery.weight")

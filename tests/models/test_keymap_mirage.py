"""MIRAGE's MultiMAE layout read as a timm ViT (config/encoders.yaml mirage_*): the embedding equals MIRAGE's own
computation — B-scan adapter on the image's first channel, position grid flattened row-major, the global token
appended after the patch tokens, blocks, mean of the patch tokens — written out here from its published code
(j-morano/MIRAGE mirage/input_adapters.py, mirage/model.py, mirage_wrapper.MIRAGECls)."""
import pytest
import timm
import torch

from retinabench.models.keymaps import apply_keymap, invert_keymap

KWARGS = dict(class_token=False, reg_tokens=1, no_embed_class=True, final_norm=False, global_pool="avg",
              fc_norm=False)


def _published():
    """A MultiMAE-layout state dict with random weights (16-px patches, 64-px input: a 4 x 4 grid), plus the
    adapters and decoders a release file carries."""
    torch.manual_seed(0)
    arch = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=64, **KWARGS).eval()
    sd = arch.state_dict()
    sd["pos_embed"] = torch.randn_like(sd["pos_embed"])  # distinct per position: the grid order is tested
    sd["reg_token"] = torch.randn_like(sd["reg_token"])
    published = invert_keymap(sd, "mirage_multimae")
    return arch, published


def _mirage_reference(published: dict, arch, x_rgb: torch.Tensor) -> torch.Tensor:
    w, b = published["input_adapters.bscan.proj.weight"], published["input_adapters.bscan.proj.bias"]
    grey = x_rgb[:, :1]  # mirage_wrapper.to_tensor reads img[..., 0]
    patches = torch.nn.functional.conv2d(grey, w, b, stride=16)  # (B, D, nh, nw)
    tokens = patches.flatten(2).transpose(1, 2)  # 'b d nh nw -> b (nh nw) d'
    pos = published["input_adapters.bscan.pos_emb"].flatten(2).transpose(1, 2)
    tokens = torch.cat([tokens + pos, published["global_tokens"].expand(x_rgb.shape[0], -1, -1)], dim=1)
    for block in arch.blocks:
        tokens = block(tokens)
    return tokens[:, :-1].mean(1)  # every token but the global one


def test_mirage_layout_gives_miragecls_embedding():
    arch, published = _published()
    assert published["input_adapters.bscan.proj.weight"].shape[1] == 1
    assert published["input_adapters.bscan.pos_emb"].shape == (1, 192, 4, 4)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=64, **KWARGS).eval()
    model.load_state_dict(apply_keymap(published, "mirage_multimae"), strict=True)
    x = torch.rand(2, 3, 64, 64)  # a colour image: only channel 0 may count
    with torch.inference_mode():
        ours = model(x)
        ref = _mirage_reference(published, model, x)
        other_channels = model(torch.cat([x[:, :1], torch.rand(2, 2, 64, 64)], dim=1))
    assert torch.allclose(ours, ref, atol=1e-5)
    assert torch.allclose(ours, other_channels, atol=1e-6)


def test_mirage_keymap_names_what_it_cannot_place():
    _, published = _published()
    with pytest.raises(KeyError, match="output_adapters.bscan.x"):
        apply_keymap({**published, "output_adapters.bscan.x": torch.zeros(1)}, "mirage_multimae")
    bad = dict(published)
    bad["input_adapters.bscan.proj.weight"] = torch.zeros(192, 3, 16, 16)
    with pytest.raises(KeyError, match="3 input channels"):
        apply_keymap(bad, "mirage_multimae")


def test_mirage_release_pickles_its_options_and_loads_weights_only(tmp_path):
    """The release file holds {"model": ..., "args": argparse.Namespace} (mirage_wrapper reads both): read with
    weights_only, the Namespace allowed as plain data."""
    import argparse

    from retinabench.models._checkpoints import read_state_dict
    path = tmp_path / "MIRAGE-Base.pth"
    torch.save({"model": {"global_tokens": torch.zeros(1, 1, 4)}, "args": argparse.Namespace(model="mirage_base")},
               path)
    assert set(read_state_dict([path])) == {"model", "args"}

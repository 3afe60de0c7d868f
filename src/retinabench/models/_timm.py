"""timm entries: the architecture built by ``timm.create_model`` with random weights, the entry's pooling and, for a
ViT, ``img_size`` = the run's input size, loaded from a state-dict checkpoint (:mod:`retinabench.models._checkpoints`)
after the ViT position embedding is resampled from the checkpoint's grid to the input grid, as timm's own pretrained
loader does."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from retinabench.models._checkpoints import checkpoint_loader
from retinabench.models._registry import SourceLoader, register_source
from retinabench.models.hub import hub_errors
from retinabench.models.strict import KeyReport, WeightsError
from retinabench.registry.input_size import native_input_size, resized


def _timm_kwargs(entry: dict) -> dict:
    from timm import layers
    kwargs = dict(entry.get("model_kwargs") or {})
    if isinstance(kwargs.get("mlp_layer"), str):
        try:
            kwargs["mlp_layer"] = getattr(layers, kwargs["mlp_layer"])
        except AttributeError:
            raise WeightsError(f"encoder {entry['name']!r}: unknown timm mlp_layer {kwargs['mlp_layer']!r}") from None
    return kwargs


class _TimmConcatPool(nn.Module):
    """CLS token and mean of the patch tokens, concatenated (Virchow's published embedding); registers and other
    prefix tokens are in neither."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @property
    def target(self) -> nn.Module:
        return self.model

    def forward(self, x):
        tokens = self.model.forward_features(x)
        npt = self.model.num_prefix_tokens
        return torch.cat([tokens[:, 0], tokens[:, npt:].mean(dim=1)], dim=-1)


def _timm_module(entry: dict) -> nn.Module:
    import timm
    from timm.models.eva import Eva  # DINOv3, EVA: rotary position embedding, the same token layout
    from timm.models.vision_transformer import VisionTransformer
    pooling = entry["pooling"]
    kwargs = _timm_kwargs(entry)
    is_vit = any(t in entry["architecture"] for t in ("vit", "deit", "eva", "beit"))
    if is_vit:
        if resized(entry) or "img_size" not in kwargs:  # the run's side wins over an entry's own img_size
            kwargs["img_size"] = entry["input_size"]
        if pooling in ("cls", "cls_patch_mean"):
            kwargs["global_pool"] = "token"
        elif pooling == "patch_mean":
            # timm's 'avg' averages tokens after num_prefix_tokens (class + register tokens excluded); fc_norm=False
            # keeps the checkpoint's final norm on every token instead of a new, untrained fc_norm.
            kwargs["global_pool"], kwargs["fc_norm"] = "avg", False
        else:
            raise WeightsError(f"encoder {entry['name']!r}: pooling {pooling!r} is not defined for a timm ViT")
    elif pooling != "avg":
        raise WeightsError(f"encoder {entry['name']!r}: pooling {pooling!r} is not defined for a timm CNN (use avg)")
    with hub_errors(entry):  # an hf-hub: architecture's config comes from the hub
        model = timm.create_model(entry["architecture"], pretrained=False, num_classes=0, **kwargs)
    if is_vit and not isinstance(model, (VisionTransformer, Eva)):
        raise WeightsError(f"encoder {entry['name']!r}: {entry['architecture']} is neither a timm VisionTransformer "
                           f"nor an Eva")
    return _TimmConcatPool(model) if pooling == "cls_patch_mean" else model


def _grid(n_tokens: int, what: str) -> int:
    g = math.isqrt(n_tokens)
    if g * g != n_tokens:
        raise WeightsError(f"{what}: {n_tokens} position tokens do not form a square grid")
    return g


def resample_pos_embed(module: nn.Module, sd: dict, entry: dict, report: KeyReport) -> None:
    """Resample a timm ViT's absolute position embedding from the checkpoint's grid to the architecture's grid (built
    at the run's ``input_size``), as timm's own pretrained loader does (``checkpoint_filter_fn``: bicubic,
    antialiased, prefix tokens kept). The checkpoint's grid: the entry's ``checkpoint_img_size`` (DINOv2's 518), else
    its registry input size when the run resizes it (config ``input_size``); either is checked against the file."""
    src_size = entry.get("checkpoint_img_size") or (native_input_size(entry) if resized(entry) else None)
    if not src_size or "pos_embed" not in sd:
        return
    from timm.layers import resample_abs_pos_embed
    what = f"encoder {entry['name']!r}"
    target = module.state_dict()["pos_embed"]
    prefix = 0 if getattr(module, "no_embed_class", False) else getattr(module, "num_prefix_tokens", 1)
    patch_embed: Any = module.patch_embed  # timm's PatchEmbed (torch types module attributes Tensor | Module)
    patch = patch_embed.patch_size[0]
    want_src = (src_size // patch) ** 2 + prefix
    have = sd["pos_embed"]
    if have.shape[1] != want_src:
        declared = "checkpoint_img_size" if entry.get("checkpoint_img_size") else "the registry's input_size"
        raise WeightsError(f"{what}: pos_embed of the checkpoint has {have.shape[1]} tokens; {declared} "
                           f"{src_size} with patch {patch} means {want_src} (shape {tuple(have.shape)})")
    if have.shape == target.shape:
        return
    old = _grid(have.shape[1] - prefix, what)
    new = _grid(target.shape[1] - prefix, what)
    if have.device.type == "meta" or target.device.type == "meta" or have.stride() == (0,) * have.ndim:
        sd["pos_embed"] = torch.zeros((), dtype=have.dtype).expand(target.shape)  # offline key check: shape only
    else:
        sd["pos_embed"] = resample_abs_pos_embed(have, new_size=[new, new], old_size=[old, old],
                                                 num_prefix_tokens=prefix, interpolation="bicubic", antialias=True,
                                                 verbose=False)
    report.transforms.append(f"pos_embed resampled {old}x{old} -> {new}x{new} (bicubic, antialias)")


def _architecture(entry: dict, device: torch.device) -> nn.Module:
    return _timm_module(entry)


register_source(SourceLoader("timm", _architecture, checkpoint_loader(adapt=resample_pos_embed)))

"""open_clip entries: the image tower (class-token or projected pooling) loaded from a state-dict checkpoint
(:mod:`retinabench.models._checkpoints`), and the whole model — both towers and the tokenizer — as a dual encoder
for the zero-shot protocols. At another input size than the checkpoint's (config ``input_size``) the tower is built
at the run's size and the checkpoint's position embedding resampled, as open_clip's own pretrained loader does."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from retinabench.models._checkpoints import checkpoint_loader, load_checkpoint_into
from retinabench.models._dual import DualEncoder, module_device
from retinabench.models.preprocess import resolve_normalization
from retinabench.models._registry import SourceLoader, register_source, weight_files
from retinabench.models.hub import hub_errors
from retinabench.models.strict import KeyReport, WeightsError
from retinabench.registry.input_size import native_input_size, resized


class _OpenClipVisual(nn.Module):
    """open_clip's image tower with an explicit pooling: ``cls`` = the class token after ``ln_post`` (the
    tower's pooled output before the projection), ``projected`` = the image embedding of the CLIP space."""

    def __init__(self, visual: nn.Module, pooling: str):
        super().__init__()
        self.visual, self.pooling = visual, pooling

    @property
    def target(self) -> nn.Module:
        return self.visual

    def forward(self, x):
        v = self.visual
        tokens = v.transformer(v._embeds(x))
        pooled, _ = v._pool(tokens)
        if self.pooling == "projected":
            pooled = pooled @ v.proj
        return pooled


def _open_clip_model(entry: dict, device: torch.device | None = None) -> nn.Module:
    """The architecture with random weights; at the run's input size where the run resizes the entry (open_clip's
    ``force_image_size``)."""
    import open_clip
    kwargs = dict(entry.get("model_kwargs") or {})
    if resized(entry):
        kwargs["force_image_size"] = entry["input_size"]
    with hub_errors(entry):  # an hf-hub: architecture's config comes from the hub
        return open_clip.create_model(entry["architecture"], pretrained=None, device=device or "cpu", **kwargs)


def resample_pos_embed(target: nn.Module, sd: dict, entry: dict, report: KeyReport) -> None:
    """The image tower's position embedding resampled from the checkpoint's grid (its registry input size) to the
    architecture's (the run's), by open_clip's own ``resize_pos_embed`` (what its pretrained loader calls: bicubic,
    antialiased, the class token kept); ``target`` is the image tower (state-dict keys without ``visual.``) or the
    whole model."""
    if not resized(entry):
        return
    from open_clip.model import resize_pos_embed
    visual = getattr(target, "visual", target)
    key = "positional_embedding" if visual is target else "visual.positional_embedding"
    if key not in sd or not hasattr(visual, "grid_size"):
        return
    have = sd[key]
    want = visual.state_dict()["positional_embedding"]
    if have.shape == want.shape:
        return
    if have.device.type == "meta" or want.device.type == "meta":
        sd[key] = torch.zeros((), dtype=have.dtype).expand(want.shape)  # offline key check: shape only
    else:
        moved = {"visual.positional_embedding": have}
        resize_pos_embed(moved, SimpleNamespace(visual=visual), interpolation="bicubic", antialias=True)
        sd[key] = moved["visual.positional_embedding"]
    report.transforms.append(f"positional_embedding resampled {have.shape[0]} -> {want.shape[0]} tokens "
                             f"({native_input_size(entry)}px -> {entry['input_size']}px; open_clip "
                             f"resize_pos_embed, bicubic, antialias)")


def _open_clip_module(entry: dict, device: torch.device | None = None) -> nn.Module:
    if entry["pooling"] not in ("cls", "projected"):
        raise WeightsError(f"encoder {entry['name']!r}: pooling {entry['pooling']!r} is not defined for open_clip "
                           f"(cls or projected)")
    model = _open_clip_model(entry, device)
    if getattr(model.visual, "_global_pool", None) is None or getattr(model.visual, "pool_type", "tok") != "tok":
        raise WeightsError(f"encoder {entry['name']!r}: {entry['architecture']} does not pool the class token")
    assert isinstance(model.visual, nn.Module)
    return _OpenClipVisual(model.visual, entry["pooling"])


def load_open_clip_model(entry: dict, weights: str | Path | None = None):
    """The whole open_clip model (image and text towers) and its tokenizer, loaded strictly; for zero-shot."""
    import open_clip
    if entry["source"] != "open_clip" or entry.get("keep_prefix") not in (None, "visual."):
        raise WeightsError(f"encoder {entry['name']!r}: only the image tower of this checkpoint is in open_clip's "
                           f"layout (keep_prefix {entry.get('keep_prefix')!r}); its text tower is not loadable here")
    files, prov = weight_files(entry, weights)
    model = _open_clip_model(entry)
    full = {k: v for k, v in entry.items() if k not in ("keep_prefix", "drop_keys")}
    report = load_checkpoint_into(model, full, files, adapt=resample_pos_embed)
    # a hub tokenizer (SigLIP's, the config's hf_tokenizer_name) is downloaded by open_clip itself
    with hub_errors(entry):  # an hf-hub: architecture's config comes from the hub
        text_cfg = (open_clip.get_model_config(entry["architecture"]) or {}).get("text_cfg") or {}
    with hub_errors({**entry, "hub_id": text_cfg.get("hf_tokenizer_name") or entry.get("hub_id")}):
        tokenizer = open_clip.get_tokenizer(entry["architecture"])
    return model.eval(), tokenizer, prov | report.record()


def _dual_encoder(entry: dict, weights: str | Path | None = None) -> DualEncoder:
    mean, std = resolve_normalization(entry)
    model, tokenizer, prov = load_open_clip_model(entry, weights)
    bias = getattr(model, "logit_bias", None)

    def enc_text(texts):
        return model.encode_text(tokenizer(list(texts)).to(module_device(model)))
    return DualEncoder(entry["name"], "siglip" if bias is not None else "clip", model, model.encode_image,
                       enc_text, entry["input_size"], mean, std, float(model.logit_scale.detach().exp()),
                       None if bias is None else float(bias.detach()), prov)


register_source(SourceLoader("open_clip", _open_clip_module, checkpoint_loader(adapt=resample_pos_embed),
                             dual_encoder=_dual_encoder))

"""transformers entries: loaded with ``from_pretrained`` from exactly the verified files (config, weights,
processor), by the same rule as every load: a missing or mismatched key is an error, an unexpected one too unless
the entry declares it dropped; the fetched config must agree with the entry's ``hf_config`` and the processor with
its normalisation / input size.

Three uses of one path: the image encoder (a vision model with the entry's pooling), the whole dual encoder (CLIP
and SigLIP, both towers and the tokenizer) and the image-text-to-text models of the MLLM protocols
(:func:`load_transformers_with`, ``AutoProcessor``).

At another input size than the checkpoint's (config ``input_size``) the image forward interpolates the position
embeddings the way transformers documents it (``interpolate_pos_encoding=True``; DINOv2 always interpolates).
"""
from __future__ import annotations

import fnmatch
import tempfile
from inspect import signature
from pathlib import Path

import torch
from torch import nn

from retinabench.models._dual import DualEncoder, module_device
from retinabench.models.preprocess import check_pipeline_files, resolve_normalization
from retinabench.models._registry import SourceLoader, register_source, weight_files
from retinabench.models.strict import KeyReport, WeightsError
from retinabench.registry.input_size import native_input_size, resized


class _HFVision(nn.Module):
    """A transformers image model with an explicit pooling of its final (normed) hidden states:
    ``cls`` token 0, ``patch_mean`` the mean over patch tokens only (after the class and register tokens),
    ``pooler`` the model's own pooled output (SigLIP's attention-pool head)."""

    def __init__(self, model: nn.Module, pooling: str, n_prefix: int, forward_kwargs: dict | None = None):
        super().__init__()
        self.model, self.pooling, self.n_prefix = model, pooling, n_prefix
        self.forward_kwargs = dict(forward_kwargs or {})

    @property
    def target(self) -> nn.Module:
        return self.model

    def forward(self, x):
        out = self.model(pixel_values=x, **self.forward_kwargs)
        if self.pooling == "pooler":
            return out.pooler_output
        if self.pooling == "cls":
            return out.last_hidden_state[:, 0]
        return out.last_hidden_state[:, self.n_prefix:].mean(dim=1)


def hf_config(entry: dict):
    """The transformers config an entry declares (the hub checkpoint's, e.g. SiglipConfig with both towers)."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()  # a partial config warns about token ids of the tokenizer it does not declare
    cfg = dict(entry.get("hf_config") or {})
    if "model_type" not in cfg:
        raise WeightsError(f"encoder {entry['name']!r}: hf_config needs model_type")
    return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def _hf_class(name: str):
    import transformers
    try:
        return getattr(transformers, name)
    except AttributeError:
        raise WeightsError(f"transformers has no class {name!r}") from None


def _config_for(cls, config):
    """``config`` itself, or its sub-config of the class's config type (SiglipVisionModel <- SiglipConfig)."""
    want = getattr(cls, "config_class", None)
    if want is None or isinstance(config, want):
        return config
    for attr in ("vision_config", "image_config"):
        sub = getattr(config, attr, None)
        if sub is not None and isinstance(sub, want):
            return sub
    raise WeightsError(f"{cls.__name__} needs a {want.__name__}; the entry's config is {type(config).__name__}")


def _hf_prefix_tokens(entry: dict, config) -> int:
    vc = getattr(config, "vision_config", config)
    if entry["source"] == "transformers" and getattr(vc, "model_type", "") in ("siglip_vision_model",
                                                                                "siglip2_vision_model"):
        return 0
    return 1 + int(getattr(vc, "num_register_tokens", 0) or 0)


def interpolation_kwargs(entry: dict, forward) -> dict:
    """What a transformers image forward needs to run at the entry's input size when the run resizes it (config
    ``input_size``): ``interpolate_pos_encoding=True`` where the forward takes it (ViT, CLIP, SigLIP: the position
    embeddings are interpolated bicubically to the input's grid, transformers' documented path); nothing where the
    model interpolates on every forward (DINOv2) or has no absolute position embedding, or at the native size."""
    if not resized(entry):
        return {}
    return {"interpolate_pos_encoding": True} if "interpolate_pos_encoding" in signature(forward).parameters else {}


def _interpolation_note(entry: dict, kwargs: dict) -> str:
    how = "interpolate_pos_encoding=True" if kwargs else "the model's own interpolation on every forward"
    return (f"input {entry['input_size']}px instead of the checkpoint's {native_input_size(entry)}px: position "
            f"embeddings interpolated at each forward ({how})")


def _hf_wrap(entry: dict, model: nn.Module, config) -> _HFVision:
    n_prefix = _hf_prefix_tokens(entry, config)
    if entry["pooling"] == "cls" and n_prefix == 0:
        raise WeightsError(f"encoder {entry['name']!r}: the model has no class token (use pooler or patch_mean)")
    if entry["pooling"] not in ("cls", "patch_mean", "pooler"):
        raise WeightsError(f"encoder {entry['name']!r}: pooling {entry['pooling']!r} is not defined for transformers")
    return _HFVision(model, entry["pooling"], n_prefix, interpolation_kwargs(entry, model.forward))


def _architecture(entry: dict, device: torch.device) -> nn.Module:
    config = hf_config(entry)
    cls = _hf_class(entry.get("hf_class", "AutoModel"))
    if cls.__name__ == "AutoModel":
        from transformers import AutoModel
        model = AutoModel.from_config(config, **(entry.get("hf_kwargs") or {}))
    else:
        model = cls(_config_for(cls, config), **(entry.get("hf_kwargs") or {}))
    return _hf_wrap(entry, model, config)


# --- the from_pretrained path -------------------------------------------------------------------------------------
def _check_hf_config(entry: dict, config) -> None:
    declared = dict(entry.get("hf_config") or {})
    diffs = []
    for key, want in declared.items():
        if isinstance(want, dict):
            sub = getattr(config, key, None)
            for k2, w2 in want.items():
                have = getattr(sub, k2, None)
                if have != w2:
                    diffs.append((f"{key}.{k2}", w2, have))
        elif getattr(config, key, None) != want:
            diffs.append((key, want, getattr(config, key, None)))
    if diffs:
        raise WeightsError(f"encoder {entry['name']!r}: the checkpoint's config.json disagrees with the entry's "
                           f"hf_config (key, entry, file): {diffs[:6]}")


def _staged(files: dict[str, Path]) -> tempfile.TemporaryDirectory:
    """A folder holding exactly the verified files (links), so from_pretrained reads nothing else."""
    tmp = tempfile.TemporaryDirectory(prefix="retinabench-hf-")
    for fname, p in files.items():
        (Path(tmp.name) / fname).symlink_to(Path(p).resolve())
    return tmp


def _hf_from_pretrained(entry: dict, files: dict[str, Path], cls_name: str, drop: list[str],
                        extra: dict | None = None, processor: str | None = None):
    """``cls_name.from_pretrained`` from exactly ``files``, strictly; ``extra``: more from_pretrained keyword
    arguments (dtype, device_map); ``processor``: also load ``AutoTokenizer`` / ``AutoProcessor`` from the same
    verified files (returned as a fourth value)."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    if entry.get("trust_remote_code") and not entry.get("code_revision"):
        raise WeightsError(f"encoder {entry['name']!r}: trust_remote_code needs a pinned code_revision")
    what = f"encoder {entry['name']!r}"
    if "config.json" not in files:
        raise WeightsError(f"{what}: no config.json among the files {sorted(files)}")
    remote = {"trust_remote_code": True} if entry.get("trust_remote_code") else {}  # its code is a locked file
    with _staged(files) as folder:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, **remote)
        _check_hf_config(entry, config)
        cls = _hf_class(cls_name)
        kwargs = dict(entry.get("hf_kwargs") or {}) if cls_name == entry.get("hf_class", "AutoModel") else {}
        kwargs |= remote | dict(extra or {})
        model, info = cls.from_pretrained(folder, local_files_only=True, output_loading_info=True, **kwargs)
        side = None
        if processor is not None:
            import transformers
            side_cls = getattr(transformers, processor)
            try:
                side = side_cls.from_pretrained(folder, local_files_only=True, **remote)
            except (OSError, ValueError, TypeError, ImportError) as err:  # ImportError: sentencepiece / protobuf
                raise WeightsError(f"{what}: cannot load its {processor} from the pinned files {sorted(files)} "
                                   f"({type(err).__name__}: {err}); list the tokenizer / processor files in "
                                   f"the entry's hf_files") from err
    report = KeyReport(missing=sorted(info.get("missing_keys") or []),
                       unexpected=[k for k in sorted(info.get("unexpected_keys") or [])
                                   if not any(fnmatch.fnmatchcase(k, p) for p in drop)],
                       shape_mismatch=[tuple(m) for m in (info.get("mismatched_keys") or [])])
    report.dropped = [k for k in sorted(info.get("unexpected_keys") or []) if k not in report.unexpected]
    if info.get("error_msgs"):
        raise WeightsError(f"{what}: transformers load errors {info['error_msgs'][:3]}", report)
    if not report.ok:
        raise WeightsError(f"{what}: checkpoint does not match the architecture: {report.problems()}", report)
    if processor is not None:
        return model, config, report, side
    return model, config, report


def load_transformers_model(entry: dict, weights: str | Path | None = None):
    """The whole transformers model (both towers of a dual encoder), loaded strictly; for zero-shot protocols."""
    files, prov = weight_files(entry, weights)
    model, config, report = _hf_from_pretrained(entry, files, entry.get("hf_full_class", "AutoModel"), [])
    return model.eval(), prov | report.record()


def load_transformers_with(entry: dict, weights: str | Path | None = None, *, processor: str = "AutoTokenizer",
                           cls_name: str | None = None, extra: dict | None = None):
    """The whole transformers model and its tokenizer or processor (``processor``: ``AutoTokenizer`` for dual
    encoders, ``AutoProcessor`` for image-text-to-text models), both from the entry's verified files, the model
    loaded strictly (declared ``drop_keys`` aside). Returns ``(model, tokenizer_or_processor, provenance)``;
    the processor files are checked against the entry's normalisation and input size where it declares them."""
    files, prov = weight_files(entry, weights)
    checked = check_pipeline_files(entry, files) if "normalization" in entry else []
    model, config, report, side = _hf_from_pretrained(entry, files, cls_name or entry.get("hf_full_class",
                                                                                         "AutoModel"),
                                                      entry.get("full_drop_keys") or [], extra=extra,
                                                      processor=processor)
    return model.eval(), side, prov | report.record() | {"pipeline_checked": checked}


def _pretrained(entry: dict, files: dict[str, Path], device: torch.device):
    model, config, report = _hf_from_pretrained(entry, files, entry.get("hf_class", "AutoModel"),
                                                entry.get("drop_keys") or [])
    module = _hf_wrap(entry, model, config)
    if resized(entry):
        report.transforms.append(_interpolation_note(entry, module.forward_kwargs))
    return module, report, None


# --- the dual encoder ---------------------------------------------------------------------------------------------
def _features(out):
    """transformers ``get_*_features`` return a tensor (or, in some versions, an output with ``pooler_output``)."""
    return getattr(out, "pooler_output", out) if not hasattr(out, "shape") else out


def _dual_encoder(entry: dict, weights: str | Path | None = None) -> DualEncoder:
    """CLIP or SigLIP with both towers, and the tokenizer from the entry's pinned files."""
    what = f"encoder {entry['name']!r}"
    mean, std = resolve_normalization(entry)
    model, tokenizer, prov = load_transformers_with(entry, weights, processor="AutoTokenizer")
    mtype = getattr(model.config, "model_type", "")
    if mtype not in ("clip", "siglip"):
        raise WeightsError(f"{what}: zero-shot supports transformers CLIP and SigLIP models (fixed-resolution "
                           f"SigLIP2 checkpoints are model_type siglip); got model_type {mtype!r}")
    family = "siglip" if mtype == "siglip" else "clip"
    if family == "siglip":  # SigLIP's text tower pools the last position: it was trained on max_length padding
        pad = dict(padding="max_length", max_length=int(model.config.text_config.max_position_embeddings),
                   truncation=True)
    else:
        pad = dict(padding=True, truncation=True, max_length=int(model.config.text_config.max_position_embeddings))

    def enc_text(texts, *, padding: str = "max_length"):
        """``padding`` (SigLIP only; zeroshot.siglip_text_padding): max_length, or focus: FOCUS's tokenizer call
        (padding=True, truncation=True: to the batch's longest text) with what the tokenizer returns."""
        focus = family == "siglip" and padding == "focus"
        args = dict(padding=True, truncation=True, max_length=pad["max_length"]) if focus else pad
        tok = tokenizer(list(texts), return_tensors="pt", **args)
        tok = {k: v.to(module_device(model)) for k, v in tok.items() if k in ("input_ids", "attention_mask")}
        if family == "siglip" and not focus:
            tok.pop("attention_mask", None)  # SigLIP is used without a text attention mask (its reference usage)
        return _features(model.get_text_features(**tok))

    image_kwargs = interpolation_kwargs(entry, model.get_image_features)
    if resized(entry):
        prov.setdefault("transforms", []).append(_interpolation_note(entry, image_kwargs))

    def enc_image(x):
        return _features(model.get_image_features(pixel_values=x, **image_kwargs))
    bias = getattr(model, "logit_bias", None)
    with torch.no_grad():
        scale = float(model.logit_scale.exp())
    return DualEncoder(entry["name"], family, model, enc_image, enc_text, entry["input_size"], mean, std, scale,
                       None if bias is None else float(bias.detach().reshape(-1)[0]), prov)


register_source(SourceLoader("transformers", _architecture, _pretrained, on_meta=False, dual_encoder=_dual_encoder))

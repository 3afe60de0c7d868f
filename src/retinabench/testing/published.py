"""The inverse of the load path: an architecture's state dict written back in an entry's *published* layout.

Used by the offline tests (one per registry entry): build the architecture with random weights — on the meta
device for large models —, write what the published checkpoint would look like (nested under ``state_dict_key``,
renamed by the inverse key map, position embeddings at the checkpoint's grid, one placeholder for every declared
drop) and load it back through the real path, strictly. A wrong key map, prefix, drop list or grid then fails
without downloading anything. For transformers entries the published layout is what ``save_pretrained`` of the
hub checkpoint's class writes (:func:`save_transformers_checkpoint`).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from retinabench.models.keymaps import invert_keymap
from retinabench.models import hf_config, resolve_normalization, weights_target


def _placeholder() -> torch.Tensor:
    return torch.zeros(1)


def cheap(t: torch.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s shape and dtype whose storage is one element (stride 0): a published-layout file of a
    billion-parameter model stays a few hundred kilobytes, and meta tensors get real (if constant) values."""
    return torch.zeros((), dtype=t.dtype).expand(t.shape)


def published_state_dict(entry: dict, module: nn.Module, rng: torch.Generator | None = None,
                         materialize=cheap) -> dict:
    """What the entry's published checkpoint looks like for ``module`` (the built encoder)."""
    target = weights_target(module)
    sd = {k: materialize(v) if v.device.type == "meta" else v.detach() for k, v in target.state_dict().items()}
    src_size = entry.get("checkpoint_img_size")
    if src_size and "pos_embed" in sd:
        prefix = 0 if getattr(target, "no_embed_class", False) else getattr(target, "num_prefix_tokens", 1)
        patch = target.patch_embed.patch_size[0]
        shape = (1, (src_size // patch) ** 2 + prefix, sd["pos_embed"].shape[-1])
        sd["pos_embed"] = torch.zeros((), dtype=sd["pos_embed"].dtype).expand(shape)
    if entry.get("key_map"):
        sd = invert_keymap(sd, entry["key_map"], rng=rng)
    prefix = entry.get("keep_prefix")
    if prefix:
        sd = {prefix + k: v for k, v in sd.items()}
        sd["outside_" + prefix.replace(".", "_") + "placeholder"] = _placeholder()  # e.g. a text tower key
    for pattern in entry.get("drop_keys") or []:
        key = pattern.replace("*", "placeholder").replace("?", "x")
        if key in sd:
            raise ValueError(f"encoder {entry['name']!r}: drop_keys pattern {pattern!r} would drop the "
                             f"architecture's own key {key!r}")
        sd[key] = _placeholder()
    key = entry.get("state_dict_key")
    if key:
        for part in reversed(key.split("/")):
            sd = {part: sd, "epoch": 7}
    return sd


def write_published(entry: dict, module: nn.Module, path: str | Path, rng: torch.Generator | None = None) -> Path:
    """Write :func:`published_state_dict` with ``torch.save`` (strides kept: stride-0 tensors stay small)."""
    path = Path(path)
    torch.save(published_state_dict(entry, module, rng=rng), path)
    return path


def reduced_hf_config(entry: dict, layers: int = 1, vocab: int = 64) -> dict:
    """The entry's hf_config with every tower cut to ``layers`` blocks and text vocabularies to ``vocab`` tokens:
    the same key names, a small model."""
    cfg = json.loads(json.dumps(entry["hf_config"]))
    for c in [cfg] + [v for v in cfg.values() if isinstance(v, dict)]:
        for k in ("num_hidden_layers",):
            if k in c:
                c[k] = layers
        if "vocab_size" in c:
            c["vocab_size"] = vocab
    if not any("num_hidden_layers" in c for c in [cfg] + [v for v in cfg.values() if isinstance(v, dict)]):
        cfg["num_hidden_layers"] = layers
    return cfg


def save_transformers_checkpoint(entry: dict, folder: str | Path, seed: int = 0) -> nn.Module:
    """A hub-layout folder for a transformers entry: ``save_pretrained`` of its checkpoint class (random weights
    from ``entry['hf_config']``) plus a processor file with the entry's normalisation and input size."""
    import transformers
    folder = Path(folder)
    torch.manual_seed(seed)
    config = hf_config(entry)
    cls = getattr(transformers, entry.get("hf_checkpoint_class") or entry.get("hf_class", "AutoModel"))
    if cls.__name__ == "AutoModel":
        model = transformers.AutoModel.from_config(config)
    else:
        model = cls(config)
    model.save_pretrained(folder)
    mean, std = resolve_normalization(entry)
    size = entry["input_size"]
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": list(mean), "image_std": list(std), "crop_size": {"height": size, "width": size}}))
    return model.eval()

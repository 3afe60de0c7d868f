"""Checkpoint files and the state-dict load path (timm and open_clip entries).

The files: a Hugging Face repo's files at the locked revision, a file downloaded from the entry's ``weights_url``
(``url``) or by hand (``manual``), each verified against the sha256 of the lock file
(:mod:`retinabench.registry.lockfile`); registered as those weight origins.

The state dict:

1. the entry's ``state_dict_key`` selects the weights inside the file, ``drop_keys`` / ``keep_prefix`` remove
   what the image encoder does not use (classifier heads, decoders, text towers, ...) and the removal is
   recorded, ``key_map`` renames the published layout into the architecture's (:mod:`retinabench.models.keymaps`);
2. the library's own adaptation, where it declares one (timm: absolute position embeddings resampled from the
   checkpoint's grid to the input grid);
3. a strict load into the architecture built with random weights (``pretrained=False``): any missing or unexpected
   key, or any shape mismatch, is a :class:`~retinabench.models.strict.WeightsError` naming the keys.
"""
from __future__ import annotations

import argparse
import fnmatch
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from retinabench.models.hub import hub_errors
from retinabench.models.keymaps import apply_keymap
from retinabench.models._registry import build_architecture, register_origin
from retinabench.models.strict import (KeyReport, WeightsError, load_state_dict_strict, probe_embed_dim,
                                       verify_sha256, weights_target)
from retinabench.registry.lockfile import LockError, local_weights_file, verified_record

StateDictAdapter = Callable[[nn.Module, dict, dict, KeyReport], None]


# --- the files ----------------------------------------------------------------------------------------------------
def _locked_record(entry: dict) -> dict:
    try:
        record = verified_record(entry)
    except LockError as err:
        raise WeightsError(str(err)) from err
    if record is None:
        raise WeightsError(f"encoder {entry['name']!r}: no lock record (its weights origin is not pinned by the "
                           f"lock file)")
    return record


def _verify(entry: dict, files: dict[str, Path], record: dict) -> None:
    for fname, p in files.items():
        verify_sha256(p, record["files"][fname], f"encoder {entry['name']!r}")


def hub_files(entry: dict) -> tuple[dict[str, Path], dict]:
    """The locked files of the entry's Hugging Face repo at the locked revision (``HF_HUB_OFFLINE=1``: from the
    cache only); a hub error (gated, missing, not cached) is a :class:`WeightsError` naming the model and what to
    do (:mod:`retinabench.models.hub`)."""
    from huggingface_hub import hf_hub_download
    record = _locked_record(entry)
    with hub_errors(entry, record["revision"]):  # gated, missing, not cached: one message naming the model
        files = {fname: Path(hf_hub_download(entry["hub_id"], fname, revision=record["revision"]))
                 for fname in record["files"]}
    _verify(entry, files, record)
    return files, {"origin": "hub", "files": dict(record["files"]), "hub_id": entry["hub_id"],
                   "revision": record["revision"]}


def _downloaded_file(entry: dict, origin: str) -> tuple[dict[str, Path], dict]:
    record = _locked_record(entry)
    p = local_weights_file(entry)
    if not p.is_file():
        raise WeightsError(f"encoder {entry['name']!r}: weight file {p} not found (" + (
            f"download {entry['weights_url']} there" if origin == "manual" else "run `retinabench lock-encoders "
            f"{entry['name']}` to download it") + ")")
    files = {entry["weights_file"]: p}
    _verify(entry, files, record)
    return files, {"origin": origin, "files": dict(record["files"]), "url": entry["weights_url"]}


def url_file(entry: dict) -> tuple[dict[str, Path], dict]:
    """The file ``retinabench lock-encoders`` downloaded from the entry's ``weights_url``."""
    return _downloaded_file(entry, "url")


def manual_file(entry: dict) -> tuple[dict[str, Path], dict]:
    """The file the user downloaded by hand from the entry's ``weights_url`` (behind a login or a form)."""
    return _downloaded_file(entry, "manual")


register_origin("hub", hub_files)
register_origin("url", url_file)
register_origin("manual", manual_file)


# --- the state dict -----------------------------------------------------------------------------------------------
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
            # Training checkpoints (MAE, MultiMAE) pickle their argparse.Namespace of options beside the weights:
            # allowed as plain data; any other object is still refused by weights_only.
            with torch.serialization.safe_globals([argparse.Namespace]):
                part = torch.load(p, map_location="cpu", weights_only=True)
        if len(paths) > 1:
            dup = set(part) & set(out)
            if dup:
                raise WeightsError(f"checkpoint shards repeat keys {sorted(dup)[:5]} ({p})")
        out.update(part)
    if not out:
        raise WeightsError(f"no weight file among {[str(p) for p in paths]}")
    return out


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


def load_checkpoint_into(target: nn.Module, entry: dict, files: dict[str, Path], assign: bool = False,
                         adapt: StateDictAdapter | None = None) -> KeyReport:
    """The shared path: read the files, prepare the state dict, adapt it (``adapt(target, state_dict, entry,
    report)``: the library's own step, e.g. timm's position-embedding resampling), load strictly."""
    raw = read_state_dict([files[k] for k in sorted(files)])
    sd, report = prepare_state_dict(raw, entry)
    if adapt is not None:
        adapt(target, sd, entry, report)
    return load_state_dict_strict(target, sd, f"encoder {entry['name']!r} ({', '.join(sorted(files))})", report,
                                  assign=assign)


def checkpoint_loader(adapt: StateDictAdapter | None = None):
    """A library's ``pretrained`` loader (:class:`~retinabench.models.sources.SourceLoader`) for state-dict
    checkpoints: the architecture with random weights, then the prepared state dict loaded strictly. On the meta
    device the embedding dimension is probed before the load, and the checkpoint's tensors are assigned rather
    than copied."""

    def pretrained(entry: dict, files: dict[str, Path], device: torch.device):
        meta = device.type == "meta"
        module = build_architecture(entry, device)
        dim = probe_embed_dim(module.eval(), entry, device) if meta else None
        report = load_checkpoint_into(weights_target(module), entry, files, assign=meta, adapt=adapt)
        return module, report, dim

    return pretrained

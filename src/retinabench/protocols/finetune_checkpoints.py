"""Checkpoints and kept weights of the fine-tuning runs (retinabench.protocols.finetune).

A run checkpoints every ``checkpoint_every`` epochs (and after the last one) — model, optimizer, scheduler, best
weights, log, RNG states — atomically, with a sha256 sidecar verified at load; a checkpoint records a fingerprint
of everything that determines the result, and one written under other settings (or other code) is discarded,
never resumed. A job that keeps its best weights (for the saliency maps) writes them as one verified file.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from retinabench.atomic import atomic_path, write_text_atomic
from retinabench.hashing import sha256_file

CHECKPOINT_FORMAT = 1

class CheckpointError(RuntimeError):
    pass


class DivergedError(FloatingPointError):
    """A run whose loss went non-finite before any epoch had a finite validation loss (nothing to keep)."""


def rng_state(device: torch.device) -> dict:
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # the legacy form of the Mersenne Twister state
    state = {"torch": torch.get_rng_state(), "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                                                       *np_state[2:]],
             "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    kind, key, *rest = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), *rest))
    random.setstate(_tuplify(state["python"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


def _ckpt_files(ckpt_dir: Path) -> list[Path]:
    return sorted(ckpt_dir.glob("epoch*.pt"))


def _save_verified(path: Path, obj: Any) -> Path:
    """``torch.save`` to a temporary name, renamed, then a ``.sha256`` sidecar (also written atomically): whoever
    finds the sidecar finds the complete file it describes."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
        digest = sha256_file(tmp)
    write_text_atomic(path.with_name(path.name + ".sha256"), f"{digest}  {path.name}\n")
    return path


def save_checkpoint(ckpt_dir: Path, state: dict) -> Path:
    """``epochNNNNN.pt`` + ``.sha256`` sidecar, each written to a temporary name and renamed; older ones pruned
    only after both are in place, so a kill at any moment leaves the previous checkpoint usable."""
    path = _save_verified(ckpt_dir / f"epoch{state['epoch']:05d}.pt", state)
    for old in _ckpt_files(ckpt_dir):
        if old != path:
            old.unlink()
            old.with_name(old.name + ".sha256").unlink(missing_ok=True)
    return path


def load_checkpoint(ckpt_dir: Path, fingerprint: str, log: Callable[[str], None] = print) -> dict | None:
    """The newest complete checkpoint of this run, or None. A checkpoint without its sidecar is an interrupted
    write (ignored); a sidecar that disagrees with the file is corruption (error); another fingerprint means
    other settings or code (the stale checkpoints are removed and the run starts over)."""
    if not ckpt_dir.is_dir():
        return None
    for path in reversed(_ckpt_files(ckpt_dir)):
        side = path.with_name(path.name + ".sha256")
        if not side.is_file():
            log(f"checkpoint {path} has no sha256 sidecar (interrupted write); ignoring it")
            continue
        expected = side.read_text().split()[0]
        actual = sha256_file(path)
        if actual != expected:
            raise CheckpointError(f"checkpoint {path} is corrupt: sha256 {actual} but its sidecar {side} says "
                                  f"{expected}; delete {ckpt_dir} to start this run over")
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("format") != CHECKPOINT_FORMAT or state.get("fingerprint") != fingerprint:
            log(f"checkpoints in {ckpt_dir} were written with other settings or code; starting over")
            shutil.rmtree(ckpt_dir)
            return None
        return state
    return None


# -- trained weights (kept for the saliency maps) ----------------------------------------------------------------

WEIGHTS_FORMAT = 1
WEIGHTS_KIND = "retinabench.finetuned_weights"


def module_digest(module: nn.Module) -> str:
    """sha256 over a module's state dict (names, dtypes, shapes, bytes): identifies a frozen encoder exactly."""
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def entry_digest(entry: dict) -> str:
    """Hash of a registry entry without its free-text notes: weights trained from another entry are refused."""
    return hashlib.sha256(json.dumps({k: v for k, v in entry.items() if k != "notes"}, sort_keys=True,
                                     default=str).encode()).hexdigest()


def save_weights(path: str | os.PathLike, weights: dict, *, protocol: str, encoder_entry: dict, task: dict,
                 seed: int) -> Path:
    """The best-validation weights of a job's training regimes (``FinetuneOutput.weights``) as one verified file
    (``.sha256`` sidecar): everything training changed (the whole model, or only the head of ``linear_aug``) plus
    what identifies the run, so :func:`load_finetuned` can refuse weights of another encoder, task or entry."""
    record = {"format": WEIGHTS_FORMAT, "kind": WEIGHTS_KIND, "protocol": protocol, "encoder": encoder_entry["name"],
              "entry_digest": entry_digest(encoder_entry), "task": task["name"], "classes": list(task["classes"]),
              "seed": int(seed), **weights}
    return _save_verified(Path(path), record)


def read_weights(path: str | os.PathLike) -> dict:
    """A weights file after checking it against its sha256 sidecar (a missing or disagreeing sidecar is an error)."""
    path = Path(path)
    side = path.with_name(path.name + ".sha256")
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist")
    if not side.is_file():
        raise CheckpointError(f"weights file {path} has no sha256 sidecar {side.name} (interrupted write?)")
    expected, actual = side.read_text().split()[0], sha256_file(path)
    if actual != expected:
        raise CheckpointError(f"weights file {path} is corrupt: sha256 {actual} but its sidecar says {expected}")
    record = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(record, dict) or record.get("kind") != WEIGHTS_KIND or record.get("format") != WEIGHTS_FORMAT:
        raise CheckpointError(f"{path} is not a retinabench weights file of format {WEIGHTS_FORMAT}")
    record["sha256"] = actual
    return record

"""The strict rule every load follows: a file matches its sha256 pin, and a checkpoint fills its architecture
exactly, or the load fails.

Any missing or unexpected key, or any shape mismatch, is a :class:`WeightsError` naming the keys; its
:class:`KeyReport` also records what a load deliberately left out (dropped keys, ignored top-level entries,
transforms) for provenance.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retinabench.hashing import sha256_file

if TYPE_CHECKING:
    import torch
    from torch import nn

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


def weights_target(module: nn.Module) -> nn.Module:
    """The module whose state dict a checkpoint fills (the library model inside a pooling wrapper)."""
    return getattr(module, "target", module)


def probe_embed_dim(module: nn.Module, entry: dict, device: str | torch.device = "cpu") -> int:
    """The module's embedding dimension at the entry's input size (one zero image), checked against the entry's
    ``embed_dim`` where it declares one."""
    import torch
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


def verify_sha256(path: Path, expected: str | None, what: str) -> str:
    actual = sha256_file(path)
    if expected is None:
        raise WeightsError(f"{what}: no sha256 pinned for {path}; the file has sha256 {actual}")
    if actual != expected:
        raise WeightsError(f"{what}: sha256 mismatch for {path}: expected {expected}, got {actual}")
    return actual

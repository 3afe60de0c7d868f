"""One adapter per raw layout. An adapter maps a raw folder to ``(manifest, exclusions)`` DataFrames.

The manifest holds the fixed columns of :data:`retinabench.schemas.MANIFEST` plus one nullable string column per
label, with values equal to the registry task's class names (and ``official_split`` where a dataset publishes
train/val/test partitions: kept as metadata, never used as our split). Every raw row or file that does not reach
the manifest, every missing label and every quirk that was normalised has a row in the exclusions table:
scope ``image`` (row dropped), ``label:<column>`` (image kept, label unknown) or ``normalised`` (kept, fixed).

Most datasets of the reference studies use the generic ``table`` adapter, configured in their registry entry
(``adapters/table.py``); ``harvard_npz`` reads NPZ-only releases; ``unestablished`` stands for a dataset whose
raw layout could not be established from public sources (its entry says why, and reading it is an error).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from retinabench.data.adapters import harvard_npz, table
from retinabench.data.adapters.phantom import LABELS as _PHANTOM_LABELS, adapt_phantom
from retinabench.data.adapters.tvhl import DME as _TVHL_DME, DR as _TVHL_DR, adapt_tvhl

Adapter = Callable[[Path, dict], "tuple[pd.DataFrame, pd.DataFrame]"]


class UnestablishedLayoutError(NotImplementedError):
    """The dataset's raw layout is not established from public sources; the registry entry says why."""


def adapt_unestablished(root: Path, entry: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    raise UnestablishedLayoutError(
        f"dataset {entry.get('name', '?')!r}: its raw layout could not be established from public sources, so "
        f"there is no adapter for it. Reason: {entry.get('reason', '(no reason recorded)')}. If you hold the "
        f"data, describe its index file(s) with a `table` adapter entry (docs/datasets.md, 'The table adapter').")


@dataclass(frozen=True)
class AdapterInfo:
    adapt: Adapter
    # ``(root, entry) -> Plan``: rows and exclusions before hashing (used by `retinabench datasets --check`)
    plan: Callable | None
    # ``entry -> {label column: classes the adapter can write}`` (registry consistency checks)
    label_classes: Callable[[dict], dict[str, list[str]]]


def _codes(coding) -> list[str]:
    return list(dict.fromkeys(coding.codes.values()))


ADAPTER_INFO: dict[str, AdapterInfo] = {
    "phantom": AdapterInfo(adapt_phantom, None,
                           lambda e: {col: _codes(c) for col, (c, _) in _PHANTOM_LABELS.items()}),
    "tvhl": AdapterInfo(adapt_tvhl, None, lambda e: {"dr3": _codes(_TVHL_DR), "dme": _codes(_TVHL_DME)}),
    "table": AdapterInfo(table.adapt_table, table.plan, table.label_classes),
    "harvard_npz": AdapterInfo(harvard_npz.adapt_harvard_npz, harvard_npz.plan, harvard_npz.label_classes),
    "unestablished": AdapterInfo(adapt_unestablished, None, lambda e: {}),
}
ADAPTERS: dict[str, Adapter] = {name: info.adapt for name, info in ADAPTER_INFO.items()}


def get_adapter(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise KeyError(f"no adapter {name!r}; known adapters: {sorted(ADAPTERS)}") from None


def adapter_info(name: str) -> AdapterInfo:
    try:
        return ADAPTER_INFO[name]
    except KeyError:
        raise KeyError(f"no adapter {name!r}; known adapters: {sorted(ADAPTER_INFO)}") from None

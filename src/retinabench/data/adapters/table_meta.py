"""The table adapter's metadata fields: a value or a column read through optional codes (unknown codes are
missing and recorded), and ages (non-numeric or out-of-range cells are missing and recorded)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from retinabench.data.adapters.common import Exclusions
from retinabench.data.adapters.table_read import TableConfigError, cell_text
from retinabench.data.adapters.table_steps import need_column


class Coded:
    """A metadata field read from a column through optional codes (unknown codes -> missing, recorded)."""

    def __init__(self, field: str, spec: Any, frame: pd.DataFrame, dataset: str, allowed=None,
                 string_is_value: bool = False):
        self.field = field
        if isinstance(spec, str):
            spec = {"value": spec} if string_is_value else {"column": spec}
        self.spec = spec or {}
        self.value = self.spec.get("value")
        self.column = self.spec.get("column")
        if self.column is not None:
            need_column(frame, self.column, f"dataset {dataset!r}", f"`{field}`")
        case = self.spec.get("case")
        self.lower = case == "lower"
        codes = self.spec.get("codes")
        self.codes = None if codes is None else {self._key(cell_text(k)): cell_text(v) for k, v in codes.items()}
        self.missing = {self._key(cell_text(m)) for m in self.spec.get("missing", [""])}
        if allowed is not None and self.codes is not None:
            bad = sorted(set(self.codes.values()) - set(allowed))
            if bad:
                raise TableConfigError(f"dataset {dataset!r}: `{field}` codes map to {bad}; allowed {list(allowed)}")
        if self.value is not None and allowed is not None and self.value not in allowed:
            raise TableConfigError(f"dataset {dataset!r}: `{field}` value {self.value!r}; allowed {list(allowed)}")

    def _key(self, v: str) -> str:
        return v.lower() if self.lower else v

    def __bool__(self):
        return self.value is not None or self.column is not None

    def read(self, row: dict, excl: Exclusions, src: str, image_id: str) -> str | None:
        if self.value is not None:
            return str(self.value)
        if self.column is None:
            return None
        raw = row[self.column]
        key = self._key(raw)
        if key in self.missing:
            return None
        if self.codes is None:
            return raw
        if key in self.codes:
            return self.codes[key]
        excl.add(src, image_id, "normalised", f"unknown {self.field} code {raw!r} in {self.column} read as missing")
        return None


def read_age(row: dict, spec: dict, excl: Exclusions, src: str, image_id: str) -> float | None:
    raw = row[spec["column"]]
    if raw in {cell_text(m) for m in spec.get("missing", [""])}:
        return None
    try:
        age = float(raw.replace(",", "."))
    except ValueError:
        excl.add(src, image_id, "normalised", f"age {raw!r} in {spec['column']} is not a number: read as missing")
        return None
    lo, hi = spec.get("range", [0, 120])
    if not lo <= age <= hi:
        excl.add(src, image_id, "normalised", f"age {raw!r} outside [{lo}, {hi}]: read as missing")
        return None
    return age

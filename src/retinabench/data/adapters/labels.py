"""Raw label values -> task classes, with *declared* missing-value codes: invalid is not unknown.

Every adapter describes each raw label column with a :class:`LabelCoding`: the raw codes that map to a class,
and the raw codes the dataset documents as "unknown" (with the documentation's wording). A :class:`LabelReader`
reads values through the codings while the adapter walks its rows:

- a class code gives the class;
- a declared missing code gives ``None`` and a ``label:<column>`` exclusion row with the declared reason;
- any other value is **invalid**. The reader collects every invalid value of the dataset; at the end,
  :meth:`LabelReader.finish` raises one :class:`InvalidLabelError` that lists them all (file, row, column,
  value) — unless the dataset entry opts into ``invalid_labels: exclude``, in which case each becomes a
  ``label:<column>`` exclusion with reason ``invalid value ...`` (the image stays for its other labels).

Raw values are compared after ``str(value).strip()``; NaN / None read as the empty string, so a blank cell is
only "missing" when ``""`` is among the declared missing codes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from retinabench.data.adapters.common import Exclusions

INVALID_LABEL_POLICIES = ("error", "exclude")
_MAX_LISTED = 50  # an error message lists at most this many offending values (and says how many more)


class InvalidLabelError(ValueError):
    """Raw label values outside a column's classes and its declared missing codes."""

    def __init__(self, dataset: str, invalid: list[dict]):
        self.dataset = dataset
        self.invalid = invalid
        lines = [f"  {r['source']}: {r['raw_column']}={r['value']!r} (image {r['image_id']}; "
                 f"allowed {r['allowed']})" for r in invalid[:_MAX_LISTED]]
        more = f"\n  ... and {len(invalid) - _MAX_LISTED} more" if len(invalid) > _MAX_LISTED else ""
        super().__init__(
            f"dataset {dataset!r}: {len(invalid)} label value(s) are neither a class code nor a declared "
            f"missing-value code:\n" + "\n".join(lines) + more +
            "\nFix the raw file, declare the code as missing in the adapter, or set `invalid_labels: exclude` "
            "on the dataset entry to record them as exclusions.")


@dataclass(frozen=True)
class LabelCoding:
    """How one raw label column maps to one manifest label column.

    ``codes``: raw value -> class name. ``missing``: raw value -> the reason recorded for it (the dataset's own
    wording of "unknown", e.g. ``{"-": "DR grade '-' (unknown)"}``).
    """
    column: str                      # manifest label column
    raw_column: str                  # column (or field) name in the raw index, for messages
    codes: Mapping[str, str]
    missing: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        both = sorted(set(self.codes) & set(self.missing))
        if both:
            raise ValueError(f"label coding {self.column!r}: codes {both} are both classes and missing codes")

    def allowed(self) -> str:
        parts = [f"{k!r}" for k in self.codes] + [f"{k!r} (missing)" for k in self.missing]
        return ", ".join(parts)


def _text(raw: Any) -> str:
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return ""
    try:
        import pandas as pd
        if raw is pd.NA:
            return ""
    except ImportError:  # pragma: no cover - pandas is a core dependency
        pass
    return str(raw).strip()


class LabelReader:
    """Reads raw label values through :class:`LabelCoding` s, collecting invalid values (see module doc)."""

    def __init__(self, excl: Exclusions, policy: str = "error"):
        if policy not in INVALID_LABEL_POLICIES:
            raise ValueError(f"invalid_labels must be one of {INVALID_LABEL_POLICIES}, got {policy!r}")
        self.excl = excl
        self.policy = policy
        self.invalid: list[dict] = []

    @classmethod
    def for_entry(cls, excl: Exclusions, entry: dict) -> LabelReader:
        """A reader with the dataset entry's ``invalid_labels`` policy (default ``error``)."""
        return cls(excl, entry.get("invalid_labels", "error"))

    def read(self, coding: LabelCoding, raw: Any, *, source: str, image_id: str | None) -> str | None:
        value = _text(raw)
        if value in coding.codes:
            return coding.codes[value]
        if value in coding.missing:
            self.excl.add(source, image_id, f"label:{coding.column}", coding.missing[value])
            return None
        self.invalid.append({"source": source, "image_id": image_id, "column": coding.column,
                             "raw_column": coding.raw_column, "value": value, "allowed": coding.allowed()})
        if self.policy == "exclude":
            self.excl.add(source, image_id, f"label:{coding.column}",
                          f"invalid value {value!r} in {coding.raw_column} (allowed {coding.allowed()})")
        return None

    def finish(self) -> None:
        """Raise one error listing every invalid value (policy ``error``); no-op when none or ``exclude``."""
        if self.invalid and self.policy == "error":
            raise InvalidLabelError(self.excl.dataset, self.invalid)

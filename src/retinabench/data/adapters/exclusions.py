"""Exclusion records: the rows an adapter leaves out of a manifest, each with its scope and reason."""
from __future__ import annotations

import pandas as pd


class Exclusions:
    """Collects exclusion rows; ``scope`` is ``image``, ``label:<column>`` or ``normalised``."""

    def __init__(self, dataset: str):
        self.dataset = dataset
        self.rows: list[dict] = []

    def add(self, source: str, image_id: str | None, scope: str, reason: str) -> None:
        self.rows.append({"dataset": self.dataset, "source": source, "image_id": image_id, "scope": scope,
                          "reason": reason})

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=["dataset", "source", "image_id", "scope", "reason"])

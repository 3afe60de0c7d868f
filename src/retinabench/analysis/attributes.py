"""The ``attributes`` family: OcularBench's Table 1, the sensitive-attribute distribution per dataset, from the
manifests (:mod:`retinabench.stats.attributes`)."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from retinabench.analysis.common import _write_csv, _write_text
from retinabench.analysis.context import AnalysisContext


def read_manifests(paths: str | Sequence[str]) -> pd.DataFrame:
    """The manifests of the config's datasets, one frame (schema-checked: ``dataset``, ``age``, ``sex``, ...)."""
    from retinabench.schemas import read_table
    paths = [paths] if isinstance(paths, str) else list(paths)
    if not paths:
        raise ValueError("attribute distribution: no manifest files")
    return pd.concat([read_table(p, "manifest") for p in paths], ignore_index=True)


def family_attributes(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.stats.attributes import attribute_distribution, attribute_latex
    table = attribute_distribution(inputs["manifests"], ctx.attributes)
    return [_write_csv(table, out["attributes_csv"]),
            _write_text(attribute_latex(table), out["attributes_tex"])]

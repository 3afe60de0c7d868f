"""Helpers every analysis family uses: atomic CSV / text writers, the shared encoder order, metric titles and how
a table names a protocol's role."""
from __future__ import annotations

import pandas as pd

from retinabench.analysis.context import AnalysisContext
from retinabench.atomic import atomic_write, write_text_atomic


def _write_csv(df: pd.DataFrame, path: str) -> str:
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False, float_format="%.6g"))
    return path


def _write_text(text: str, path: str) -> str:
    write_text_atomic(path, text)
    return path


def _order(ranks: pd.DataFrame, ctx: AnalysisContext) -> list[str]:
    from retinabench.stats.ranks import encoder_order
    ranked = ranks[ranks["protocol"].isin(ctx.protocols)] if ctx.protocols else ranks
    return encoder_order(ranked, metric=ctx.metric, regime=ctx.regime)


def _metric_title(ctx: AnalysisContext, metric: str) -> str:
    return f"test {metric.replace('_', ' ')}"


def _role(ctx: AnalysisContext, protocol: str) -> str:
    """How a table names a protocol's part: the analysis protocol's role (headline / fallback: why / configured),
    or ``other``."""
    h = ctx.analysis_protocol
    if protocol != h["protocol"]:
        return "other"
    return h["note"] if h["role"] == "fallback" else h["role"]

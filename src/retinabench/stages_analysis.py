"""Stage entry points of the analysis layer (statistics, figures, tables); merged into retinabench.stages.STAGES."""
from __future__ import annotations

from typing import Callable

ANALYSIS_STAGES: dict[str, Callable] = {}

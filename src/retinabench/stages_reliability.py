"""Stage entry points of the reliability layer; merged into retinabench.stages.STAGES."""
from __future__ import annotations

from typing import Callable

RELIABILITY_STAGES: dict[str, Callable] = {}

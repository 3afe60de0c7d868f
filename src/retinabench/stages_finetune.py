"""Stage entry points of the finetune layer; merged into retinabench.stages.STAGES."""
from __future__ import annotations

from typing import Callable

FINETUNE_STAGES: dict[str, Callable] = {}

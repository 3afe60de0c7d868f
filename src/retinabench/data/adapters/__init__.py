"""One adapter per raw layout. An adapter maps a raw folder to ``(manifest, exclusions)`` DataFrames.

The manifest holds the fixed columns of :data:`retinabench.schemas.MANIFEST` plus one nullable string column per
label, with values equal to the registry task's class names. Every raw row or file that does not reach the
manifest, every missing label and every quirk that was normalised has a row in the exclusions table:
scope ``image`` (row dropped), ``label:<column>`` (image kept, label unknown) or ``normalised`` (kept, fixed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from retinabench.data.adapters.phantom import adapt_phantom
from retinabench.data.adapters.tvhl import adapt_tvhl

Adapter = Callable[[Path, dict], "tuple[pd.DataFrame, pd.DataFrame]"]

ADAPTERS: dict[str, Adapter] = {
    "phantom": adapt_phantom,
    "tvhl": adapt_tvhl,
}


def get_adapter(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise KeyError(f"no adapter {name!r}; known adapters: {sorted(ADAPTERS)}") from None

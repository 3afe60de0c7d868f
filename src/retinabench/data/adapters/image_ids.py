"""Image ids must be unique within a dataset (caches, splits and predictions key on them). Two rows with one id
are an error listing the count, every colliding id with its rows and files, and the fix; or, with the table
adapter's ``duplicates: keep_first``, the first row of each id is kept and the others are recorded as
exclusions. The same function serves the adapter's plan (so ``datasets --check`` reports it) and
``finish_manifest`` (so no adapter can write duplicate ids)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from retinabench.data.adapters.exclusions import Exclusions

DUPLICATE_POLICIES = ("error", "keep_first")
DUPLICATE_REASON = "duplicate image id"
TABLE_FIX = ("give `table.image_id` a template that tells these rows apart (e.g. one with the file name or "
             "folder; without `image_id` the id is the image path without extension, which is always unique), "
             "or set `table.duplicates: keep_first` to keep the first row of each id and record the others as "
             "exclusions (reason 'duplicate image id'); a listing's `ignore:` patterns can skip copies such as "
             "'_DH' files instead")
ADAPTER_FIX = "make the adapter give every image its own id (e.g. its path relative to the root without extension)"
_SHOWN = 10


class DuplicateImageIdError(ValueError):
    """Two or more manifest rows share an image id."""


def settle_duplicate_ids(rows: pd.DataFrame, sources: list[str], *, dataset: str, policy: str = "error",
                         excl: Exclusions | None = None, fix: str = ADAPTER_FIX) -> pd.DataFrame:
    """``rows`` without duplicate ``image_id`` values (``sources[i]`` names row i's index file and row)."""
    if policy not in DUPLICATE_POLICIES:
        raise ValueError(f"dataset {dataset!r}: `duplicates: {policy}`; allowed {list(DUPLICATE_POLICIES)}")
    ids = rows["image_id"].reset_index(drop=True)
    dup = ids.duplicated(keep=False)
    if not dup.any():
        return rows
    if policy == "keep_first":
        assert excl is not None, "duplicates: keep_first records the rows it drops: pass `excl`"
        later = ids.duplicated(keep="first")
        for k in later[later].index:  # one reason text for all, so the printed counts group them
            excl.add(sources[k], ids[k], "image",
                     f"{DUPLICATE_REASON}: an earlier row has this id and is kept (duplicates: keep_first)")
        return rows[~later.to_numpy()]
    raise DuplicateImageIdError(duplicate_id_message(rows, sources, dataset=dataset, fix=fix))


def duplicate_id_message(rows: pd.DataFrame, sources: list[str], *, dataset: str, fix: str) -> str:
    ids = rows["image_id"].reset_index(drop=True)
    paths = rows["path"].reset_index(drop=True)
    dup = ids[ids.duplicated(keep=False)]
    groups = list(dup.groupby(dup, sort=False).groups.items())
    lines = [f"  {image_id!r}: " + "; ".join(f"{sources[k]} ({paths[k]})" for k in members)
             for image_id, members in groups[:_SHOWN]]
    if len(groups) > _SHOWN:
        lines.append(f"  ... {len(groups) - _SHOWN} more ids")
    return (f"dataset {dataset!r}: {len(groups)} image id(s) are shared by {len(dup)} rows, so caches, splits and "
            f"predictions could not tell those images apart:\n" + "\n".join(lines) + f"\nFix: {fix}")

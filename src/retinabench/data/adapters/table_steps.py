"""The table adapter's row-shaping steps: computed ``fields``, ``unpivot``, ``join`` and ``filter``
(docs/datasets.md, "The table adapter"). Every row a step drops or leaves without its joined columns is recorded."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from retinabench.data.adapters.common import Exclusions
from retinabench.data.adapters.table_read import MAX_LISTED, TableConfigError, cell_text, list_files, read_raw_table


class Row(dict):
    """Row for ``str.format_map``: a missing column is an error naming the available ones."""

    def __missing__(self, key):
        raise TableConfigError(f"template field {{{key}}} is not a column; columns: "
                               f"{sorted(k for k in self if not k.startswith('_'))}")


def apply_fields(frame: pd.DataFrame, fields: dict | None, *, where: str) -> pd.DataFrame:
    frame = frame.copy()
    for name, spec in (fields or {}).items():
        if not isinstance(spec, dict):
            raise TableConfigError(f"{where}: field {name!r} must be a mapping")
        if "template" in spec:
            template = spec["template"]
            frame[name] = [template.format_map(Row(r)) for r in frame.to_dict("records")]
        elif "regex" in spec:
            col = need_column(frame, spec.get("column"), where, f"field {name!r}")
            rx = re.compile(spec["regex"])
            group = "value" if "value" in rx.groupindex else 1

            def extract(v, rx=rx, group=group):
                m = rx.search(v)
                return (m.group(group) or "") if m else ""
            frame[name] = frame[col].map(extract)
        elif "map" in spec:
            col = need_column(frame, spec.get("column"), where, f"field {name!r}")
            mapping = {str(k): str(v) for k, v in spec["map"].items()}
            default = spec.get("default")
            unknown = sorted(set(frame[col]) - set(mapping)) if default is None else []
            if unknown:
                raise TableConfigError(f"{where}: field {name!r}: values {unknown[:MAX_LISTED]} of {col!r} "
                                       f"have no entry in `map`")
            frame[name] = frame[col].map(lambda v: mapping.get(v, default))  # noqa: B023 (called within the iteration)
        elif "min_of" in spec:
            cols = [need_column(frame, c, where, f"field {name!r}") for c in spec["min_of"]]
            frame[name] = [min((v for v in vals if v), default="") for vals in frame[cols].itertuples(index=False)]
        elif spec.get("row_number"):  # 1-based position among the source's data rows
            frame[name] = [str(i) for i in range(1, len(frame) + 1)]
        else:
            raise TableConfigError(f"{where}: field {name!r} needs one of template, regex, map, min_of, "
                                   f"row_number")
    return frame


def need_column(frame: pd.DataFrame, column: str | None, where: str, what: str) -> str:
    if column is None:
        raise TableConfigError(f"{where}: {what} needs `column`")
    if column not in frame.columns:
        raise TableConfigError(f"{where}: {what} names column {column!r}, which is not in the table; columns: "
                               f"{sorted(c for c in frame.columns if not c.startswith('_'))}")
    return column


def apply_unpivot(frame: pd.DataFrame, spec: dict | None, excl: Exclusions, *, where: str) -> pd.DataFrame:
    if not spec:
        return frame
    columns = spec.get("columns") or {}
    value, name = spec.get("value"), spec.get("name")
    if not columns or not value or not name:
        raise TableConfigError(f"{where}: unpivot needs `columns`, `value` and `name`")
    for c in columns:
        need_column(frame, c, where, "unpivot")
    parts = []
    for raw_col, label in columns.items():
        part = frame.drop(columns=list(columns)).copy()
        part[value] = frame[raw_col].to_numpy()
        part[name] = str(label)
        empty = part[value].eq("")
        for _, r in part[empty].iterrows():
            excl.add(f"{r['_file']}:row {r['_row']}", None, "image", f"no {raw_col} image named in this row")
        parts.append(part[~empty])
    out = pd.concat(parts) if parts else frame
    return out.sort_values(["_source", "_row", name], kind="stable")


def read_sources(root: Path, cfg: dict, excl: Exclusions, dataset: str) -> pd.DataFrame:
    frames = []
    specs = cfg.get("sources") or []
    if cfg.get("listing"):
        specs = [{"listing": cfg["listing"], **({"name": "listing"})}] + list(specs)
    if not specs:
        raise TableConfigError(f"dataset {dataset!r}: `table` needs `sources` or `listing`")
    names = []
    for spec in specs:
        raw = list_files(root, spec["listing"], dataset=dataset) if "listing" in spec else \
            read_raw_table(root, spec, dataset=dataset)
        name = spec.get("name") or raw.name
        if name in names:
            raise TableConfigError(f"dataset {dataset!r}: two sources are named {name!r}; set `name:`")
        names.append(name)
        if raw.blank_rows:
            excl.add(raw.file, None, "normalised", f"{raw.blank_rows} blank row(s) skipped")
        for note in raw.notes:
            excl.add(raw.file, None, "normalised", note)
        frame = raw.frame.copy()
        frame["_source"] = name
        frame["_row"] = frame.index
        frame["_file"] = raw.file
        for col, value in (spec.get("constants") or {}).items():
            frame[col] = cell_text(value)
        where = f"dataset {dataset!r}, source {name!r} ({raw.file})"
        frame = apply_fields(frame, spec.get("fields"), where=where)
        frame = apply_unpivot(frame, spec.get("unpivot"), excl, where=where)
        frames.append(frame)
    all_columns: list[str] = []
    for f in frames:
        all_columns += [c for c in f.columns if c not in all_columns]
    out = pd.concat([f.reindex(columns=all_columns) for f in frames], ignore_index=True)
    return out.fillna("")


def apply_joins(root: Path, frame: pd.DataFrame, cfg: dict, excl: Exclusions, dataset: str
                ) -> tuple[pd.DataFrame, dict[str, tuple[str, str]]]:
    """Apply ``join`` specs; returns the frame and, per joined column, (file, marker column that is "1" on
    rows without a match). Source rows without a match and joined rows that no source row asks for are
    recorded."""
    missing_by_column: dict[str, tuple[str, str]] = {}
    for k, spec in enumerate(cfg.get("join") or []):
        raw = read_raw_table(root, spec, dataset=dataset)
        where = f"dataset {dataset!r}, join {raw.file}"
        right = raw.frame.copy()
        right["_source"], right["_row"], right["_file"] = raw.name, right.index, raw.file
        for col, value in (spec.get("constants") or {}).items():
            right[col] = cell_text(value)
        right = apply_fields(right, spec.get("fields"), where=where)
        right = apply_unpivot(right, spec.get("unpivot"), excl, where=where)
        on = spec.get("keys") or {}
        if not on:
            raise TableConfigError(f"{where}: `keys` ({{row column: joined column}}) is required")
        for left_col, right_col in on.items():
            need_column(frame, left_col, f"dataset {dataset!r}", f"join on {left_col!r}")
            need_column(right, right_col, where, f"join on {right_col!r}")
        keys = list(on.values())
        dupes = right[right.duplicated(keys, keep=False)]
        if len(dupes):
            listed = "; ".join(f"{dict(zip(keys, k))} at rows {sorted(g['_row'].tolist())}"
                               for k, g in list(dupes.groupby(keys))[:MAX_LISTED])
            raise ValueError(f"{where}: {dupes.groupby(keys).ngroups} key(s) occur more than once, so the "
                             f"joined values are ambiguous: {listed}")
        cols = spec.get("columns")
        if isinstance(cols, dict):
            take = cols
        else:
            take = {c: c for c in (cols or [c for c in right.columns if c not in keys and not c.startswith("_")])}
        for c in take:
            need_column(right, c, where, "join column")
        clash = [new for new in take.values() if new in frame.columns]
        if clash:
            raise TableConfigError(f"{where}: joined columns {clash} already exist; map them to new names "
                                   f"with `columns: {{raw: new}}`")
        sub = right[keys + list(take)].rename(columns={**dict(zip(keys, list(on))), **take})
        sub = sub.assign(_joined=True)
        merged = frame.merge(sub, how="left", on=list(on), validate="many_to_one")
        miss = merged["_joined"].isna()
        marker = f"_nojoin{k}"
        merged = merged.drop(columns="_joined").assign(**{marker: miss.map({True: "1", False: ""})})
        for new in take.values():
            merged[new] = merged[new].fillna("")
            missing_by_column[new] = (raw.file, marker)
        if miss.any() and spec.get("required", False):
            first = merged[miss].iloc[0]
            raise ValueError(f"{where}: {int(miss.sum())} row(s) have no matching row, e.g. "
                             f"{first['_file']}:row {first['_row']} key {[first[c] for c in on]}")
        for _, r in merged[miss].iterrows():
            excl.add(f"{r['_file']}:row {r['_row']}", None, "normalised",
                     f"no row in {raw.file} for {', '.join(f'{k}={r[k]!r}' for k in on)}: its columns are empty")
        # Rows of the joined table that no source row asks for reach no image: recorded, never dropped silently.
        asked = frame[list(on)].drop_duplicates().rename(columns=on).assign(_asked=True)
        unused = right.merge(asked, how="left", on=keys)["_asked"].isna().to_numpy()
        for r in right[unused].to_dict("records"):
            excl.add(f"{r['_file']}:row {r['_row']}", None, "image",
                     f"row of {raw.file} joins to no image: no source row has its {', '.join(keys)}")
        frame = merged
    return frame, missing_by_column


def apply_filter(frame: pd.DataFrame, spec: dict | None, excl: Exclusions, dataset: str
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kept rows, filtered-out rows); every filtered-out row is recorded with the rule it failed."""
    if not spec:
        return frame, frame.iloc[0:0]
    keep = pd.Series(True, index=frame.index)
    reasons = pd.Series("", index=frame.index)
    for col, rule in spec.items():
        need_column(frame, col, f"dataset {dataset!r}", "filter")
        values = frame[col]
        if "in" in rule:
            ok = values.isin([cell_text(v) for v in rule["in"]])
        elif "not_in" in rule:
            ok = ~values.isin([cell_text(v) for v in rule["not_in"]])
        elif "regex" in rule:
            rx = re.compile(rule["regex"])
            ok = values.map(lambda v: bool(rx.search(v)))  # noqa: B023 (called within the iteration)
        else:
            raise TableConfigError(f"dataset {dataset!r}: filter on {col!r} needs in, not_in or regex")
        new = keep & ~ok
        reasons[new] = [f"filtered out: {col}={v!r} not selected ({rule})" for v in values[new]]
        keep &= ok
    for i in frame.index[~keep]:
        r = frame.loc[i]
        excl.add(f"{r['_file']}:row {r['_row']}", None, "image", reasons[i])
    return frame[keep], frame[~keep]

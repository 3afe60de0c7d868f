"""The generic TABLE adapter: a dataset that is "a folder of images and one or more tables", configured entirely
in its registry entry (``adapter: table`` + a ``table:`` section). Most of the reference studies' datasets are
declared this way in ``config/datasets.yaml``; the README ("Your own data") has the walkthrough.

Pipeline, in order (every row that does not reach the manifest, every unknown label and every normalised quirk
is an exclusion row; nothing is dropped silently):

1. **sources** — index files (CSV/TSV/TXT, XLSX, Parquet, JSON) or one **listing** of image files whose path
   a regex splits into columns (labels given by folder or file name). Per source: ``sep``, ``encoding``,
   ``sheet``, ``header_row`` (1-based; XLSX files with title rows above the header) or ``header_rows`` (a
   two-row header flattened to ``parent/child``), ``rename`` (header typos), ``constants`` (columns with one
   value per source, e.g. ``partition: train`` or ``eye: OD``), ``fields`` and ``unpivot`` (below). Header
   cells are stripped of whitespace (non-breaking spaces included: trailing spaces in headers are a known
   trap); blank header cells are named ``column A``, ``column B``… (spreadsheet letters); fully blank rows and
   fully blank unnamed columns are skipped and counted.
2. **fields** — computed columns: ``{template: "..."}`` (``str.format`` on the row), ``{column: X, regex: R}``
   (first group, or the group named ``value``), ``{column: X, map: {...}}``, ``{min_of: [A, B]}``,
   ``{row_number: true}`` (1-based position among the source's data rows). Fields given on a source run
   before its unpivot; top-level ``fields`` run after the joins.
3. **unpivot** — one row per listed column (a pair table ``left;right`` or two views per eye):
   ``{columns: {raw column: name}, value: <new column>, name: <new column>}``.
4. **join** — columns from another table keyed on one or more columns (``keys: {row column: table column}``);
   duplicate keys in the joined table are an error naming them; a row without a match keeps the joined
   columns empty and any label read from them is missing with reason "no row in FILE for KEY". This is how
   labels given per patient (or per eye) are joined onto per-eye (or per-visit) images.
5. **filter** — rows kept by column values (``in`` / ``not_in`` / ``regex``); the others are recorded.
6. **image** — ``column`` (a path relative to the dataset root or to ``base``), ``template``, or ``index`` +
   ``key`` (the file under a glob whose stem equals the key: images spread over partition folders);
   ``extensions`` completes extension-less names; ``no_image`` lists cell values meaning "no image for this
   row". ``image_id`` is a template (default: the relative path without extension, unique even when two
   folders reuse file names, as IDRiD's training and test sets do). ``unlisted`` globs find images on disk
   that no row names.
7. **metadata** — ``modality``, ``patient`` (``column``/``template``, or ``per_image: true`` when the dataset
   publishes no patient id: each image is its own patient, recorded once; ``fallback: per_image`` does that
   only for rows whose patient cell is empty, recording each), ``eye``, ``age`` (``range``, default 0-120),
   ``sex``,
   ``quality``, ``site`` and ``partition`` (the official train/val/test partition, kept as the manifest column
   ``official_split``; our splits are our own). Coded fields take ``codes`` (raw -> normalised) and
   ``missing`` (raw codes meaning unknown); an undeclared code is read as missing and recorded.
8. **labels** — one manifest column per entry: ``column``, ``codes`` (raw -> class), ``missing`` (raw ->
   documented reason), ``case: lower`` (compare lower-cased), ``sources`` (the label exists only for rows of
   these sources, e.g. a partition without published labels; ``unlabelled_reason`` says why). Invalid values
   follow ``adapters/labels.py``: one error listing them all, or exclusions with ``invalid_labels: exclude``.

Cell values are compared as text after stripping; numbers read from XLSX/Parquet that are whole become their
integer text (``1.0`` -> ``"1"``), so codings are written once for every index format.
"""
from __future__ import annotations

import json
import math
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from retinabench.data.adapters.common import Exclusions, finish_manifest, index_files
from retinabench.data.adapters.labels import LabelCoding, LabelReader

MANIFEST_META = ("patient_id", "eye", "age", "sex", "quality", "site")
OFFICIAL_SPLIT = "official_split"
EYES = ("OD", "OS")
SEXES = ("female", "male")
PARTITIONS = ("train", "val", "test")
_TABLE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".txt": "csv", ".xlsx": "xlsx", ".xlsm": "xlsx",
                   ".parquet": "parquet", ".json": "json"}
_INTERNAL = ("_source", "_row", "_file")
_MAX_LISTED = 20


class TableConfigError(ValueError):
    """The dataset entry's ``table:`` section is malformed or names columns the raw files do not have."""


# ----------------------------------------------------------------------------------------------- cell text
def cell_text(value: Any) -> str:
    """A raw cell as comparable text: None/NaN -> "", whole floats -> integer text, strings stripped."""
    if value is None:
        return ""
    if value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer():
            return str(int(value))
        return repr(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalar
        try:
            return cell_text(value.item())
        except (ValueError, TypeError):
            pass
    return str(value).replace("\xa0", " ").strip()


def _header(name: Any, position: int, ascii_only: bool = False) -> str:
    text = cell_text(name)
    if ascii_only:
        text = text.encode("ascii", "ignore").decode().strip()
    if not text or re.fullmatch(r"Unnamed: \d+(_level_\d+)?", text):
        return f"column {_letters(position)}"
    return text


def _letters(position: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA (spreadsheet column letters)."""
    out = ""
    n = position + 1
    while n:
        n, r = divmod(n - 1, 26)
        out = string.ascii_uppercase[r] + out
    return out


# ----------------------------------------------------------------------------------------------- reading
@dataclass
class RawTable:
    name: str
    file: str
    frame: pd.DataFrame          # text cells; columns = cleaned headers; index: data row number for messages
    first_row: int               # spreadsheet/file line number of the first data row
    blank_rows: int = 0


def read_raw_table(root: Path, spec: dict, *, dataset: str) -> RawTable:
    """Read one index file of a source/join spec into text cells with cleaned, unique headers."""
    rel = spec.get("file")
    if not rel:
        raise TableConfigError(f"dataset {dataset!r}: a table source needs `file` (or use `listing`)")
    path = Path(root) / rel
    if not path.is_file():
        raise FileNotFoundError(f"dataset {dataset!r}: index file {path} not found (is data_root right?)")
    fmt = spec.get("format") or _TABLE_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise TableConfigError(f"dataset {dataset!r}: cannot tell the format of {rel}; set `format:` "
                               f"({sorted(set(_TABLE_SUFFIXES.values()))})")
    ascii_only = bool(spec.get("header_ascii", False))
    if fmt in ("csv", "tsv"):
        rows, header, first = _read_delimited(path, spec, fmt, dataset)
    elif fmt == "xlsx":
        rows, header, first = _read_xlsx(path, spec, dataset)
    elif fmt == "parquet":
        df = pd.read_parquet(path)
        header = list(df.columns)
        rows = [list(r) for r in df.itertuples(index=False, name=None)]
        first = 1
    elif fmt == "json":
        rows, header = _read_json(path, dataset)
        first = 1
    else:
        raise TableConfigError(f"dataset {dataset!r}: unknown table format {fmt!r} for {rel}")
    names = [_header(h, i, ascii_only) for i, h in enumerate(header)]
    rename = spec.get("rename") or {}
    names = [rename.get(n, n) for n in names]
    text_rows = [[cell_text(v) for v in r] + [""] * (len(names) - len(r)) for r in rows]
    width = len(names)
    if any(len(r) > width for r in text_rows):
        raise TableConfigError(f"{path}: some rows have more cells than the {width} header columns")
    frame = pd.DataFrame(text_rows, columns=range(width), dtype=object) if text_rows else \
        pd.DataFrame(columns=range(width), dtype=object)
    frame.index = range(first, first + len(frame))
    # Drop unnamed columns that are blank throughout (trailing empty columns of exported sheets).
    keep = [i for i, n in enumerate(names)
            if not (n.startswith("column ") and frame[i].eq("").all())]
    frame = frame[keep]
    names = [names[i] for i in keep]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TableConfigError(f"{path}: header names {dupes} occur more than once; rename them with `rename:`")
    frame.columns = names
    blank = frame.eq("").all(axis=1) if len(frame.columns) else pd.Series(True, index=frame.index)
    n_blank = int(blank.sum())
    frame = frame[~blank]
    return RawTable(name=spec.get("name") or Path(rel).stem, file=str(rel), frame=frame, first_row=first,
                    blank_rows=n_blank)


def _read_delimited(path: Path, spec: dict, fmt: str, dataset: str):
    sep = spec.get("sep", "\t" if fmt == "tsv" else ",")
    encoding = spec.get("encoding", "utf-8-sig")
    header_row = int(spec.get("header_row", 1))
    try:
        df = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, header=None, encoding=encoding,
                         skiprows=header_row - 1, engine="python" if len(sep) > 1 else "c",
                         skip_blank_lines=False)
    except UnicodeDecodeError as err:
        raise TableConfigError(f"dataset {dataset!r}: {path} is not {encoding} text ({err}); set "
                               f"`encoding:` on the source (e.g. latin-1)") from err
    if df.empty:
        return [], [], header_row + 1
    header = list(df.iloc[0])
    rows = df.iloc[1:].values.tolist()
    return rows, header, header_row + 1


def _read_xlsx(path: Path, spec: dict, dataset: str):
    import openpyxl

    wb = openpyxl.load_workbook(path, read_only=True, data_only=True)
    try:
        sheet_name = spec.get("sheet")
        if sheet_name is None:
            ws = wb.worksheets[0]
        elif sheet_name in wb.sheetnames:
            ws = wb[sheet_name]
        else:
            raise TableConfigError(f"dataset {dataset!r}: {path} has no sheet {sheet_name!r}; "
                                   f"sheets: {wb.sheetnames}")
        all_rows = [list(r) for r in ws.iter_rows(values_only=True)]
    finally:
        wb.close()
    header_rows = spec.get("header_rows") or [int(spec.get("header_row", 1))]
    header_rows = [int(h) for h in header_rows]
    if max(header_rows) > len(all_rows):
        raise TableConfigError(f"{path}: header row {max(header_rows)} is beyond the sheet's {len(all_rows)} rows")
    width = max((len(r) for r in all_rows), default=0)
    grid = [r + [None] * (width - len(r)) for r in all_rows]
    if len(header_rows) == 1:
        header = grid[header_rows[0] - 1]
    else:  # multi-row header: parents forward-filled across merged cells, joined as parent/child
        parts = [grid[h - 1] for h in header_rows]
        header = []
        parents = [None] * len(parts)
        for col in range(width):
            names = []
            for level, row in enumerate(parts):
                cell = cell_text(row[col])
                if cell:
                    parents[level] = cell
                    for deeper in range(level + 1, len(parts)):
                        parents[deeper] = None
                elif level < len(parts) - 1:
                    cell = parents[level] or ""
                if cell:
                    names.append(cell)
            header.append("/".join(names) if names else None)
    first = max(header_rows) + 1
    return grid[first - 1:], header, first


def _read_json(path: Path, dataset: str):
    data = json.loads(path.read_text())
    records = list(data.values()) if isinstance(data, dict) else data
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise TableConfigError(f"dataset {dataset!r}: {path} is neither a list of records nor a mapping of "
                               f"records")
    header: list[str] = []
    for r in records:
        for k in r:
            if k not in header:
                header.append(k)
    rows = [[r.get(k) for k in header] for r in records]
    return rows, header


def list_files(root: Path, spec: dict, *, dataset: str) -> RawTable:
    """A listing source: the files under ``glob``, columns from the named groups of ``regex`` on the
    relative path (``path`` is the relative path itself). A file the regex does not match is an error."""
    glob = spec.get("glob")
    if not glob:
        raise TableConfigError(f"dataset {dataset!r}: a listing needs `glob`")
    pattern = re.compile(spec.get("regex", r"(?P<path>.*)"))
    ignore = [re.compile(p) for p in spec.get("ignore", [])]
    rows, unmatched = [], []
    for path in sorted(Path(root).glob(glob)):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if any(p.search(rel) for p in ignore):
            continue
        m = pattern.fullmatch(rel)
        if m is None:
            unmatched.append(rel)
            continue
        rows.append({"path": rel, **{k: (v or "") for k, v in m.groupdict().items()}})
    if unmatched:
        listed = "\n".join(f"  {u}" for u in unmatched[:_MAX_LISTED])
        raise TableConfigError(f"dataset {dataset!r}: {len(unmatched)} file(s) under {glob!r} do not match "
                               f"the listing regex {pattern.pattern!r}:\n{listed}")
    frame = pd.DataFrame(rows, dtype=object)
    if frame.empty:
        frame = pd.DataFrame(columns=["path", *pattern.groupindex], dtype=object)
    frame.index = range(1, len(frame) + 1)
    return RawTable(name=spec.get("name", "listing"), file=f"listing {glob}", frame=frame, first_row=1)


# ----------------------------------------------------------------------------------------------- fields
class _Row(dict):
    """Row for ``str.format_map``: a missing column is an error naming the available ones."""

    def __missing__(self, key):
        raise TableConfigError(f"template field {{{key}}} is not a column; columns: "
                               f"{sorted(k for k in self if not k.startswith('_'))}")


def apply_fields(frame: pd.DataFrame, fields: dict, *, where: str) -> pd.DataFrame:
    frame = frame.copy()
    for name, spec in (fields or {}).items():
        if not isinstance(spec, dict):
            raise TableConfigError(f"{where}: field {name!r} must be a mapping")
        if "template" in spec:
            template = spec["template"]
            frame[name] = [template.format_map(_Row(r)) for r in frame.to_dict("records")]
        elif "regex" in spec:
            col = _need(frame, spec.get("column"), where, f"field {name!r}")
            rx = re.compile(spec["regex"])
            group = "value" if "value" in rx.groupindex else 1

            def extract(v, rx=rx, group=group):
                m = rx.search(v)
                return (m.group(group) or "") if m else ""
            frame[name] = frame[col].map(extract)
        elif "map" in spec:
            col = _need(frame, spec.get("column"), where, f"field {name!r}")
            mapping = {str(k): str(v) for k, v in spec["map"].items()}
            default = spec.get("default")
            unknown = sorted(set(frame[col]) - set(mapping)) if default is None else []
            if unknown:
                raise TableConfigError(f"{where}: field {name!r}: values {unknown[:_MAX_LISTED]} of {col!r} "
                                       f"have no entry in `map`")
            frame[name] = frame[col].map(lambda v: mapping.get(v, default))  # noqa: B023 (called within the iteration)
        elif "min_of" in spec:
            cols = [_need(frame, c, where, f"field {name!r}") for c in spec["min_of"]]
            frame[name] = [min((v for v in vals if v), default="") for vals in frame[cols].itertuples(index=False)]
        elif spec.get("row_number"):  # 1-based position among the source's data rows
            frame[name] = [str(i) for i in range(1, len(frame) + 1)]
        else:
            raise TableConfigError(f"{where}: field {name!r} needs one of template, regex, map, min_of, "
                                   f"row_number")
    return frame


def _need(frame: pd.DataFrame, column: str | None, where: str, what: str) -> str:
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
        _need(frame, c, where, "unpivot")
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


# ----------------------------------------------------------------------------------------------- adapter
@dataclass
class Plan:
    """What the adapter would put in the manifest before hashing: the rows, exclusions, label columns."""
    rows: pd.DataFrame
    exclusions: Exclusions
    label_columns: list[str]


def _config(entry: dict) -> dict:
    cfg = entry.get("table")
    if not isinstance(cfg, dict):
        raise TableConfigError(f"dataset {entry.get('name', '?')!r}: adapter `table` needs a `table:` section")
    return cfg


def label_classes(entry: dict) -> dict[str, list[str]]:
    """``manifest label column -> the classes its codes can produce`` (for registry checks)."""
    out = {}
    for name, spec in (_config(entry).get("labels") or {}).items():
        classes: list[str] = []
        for v in (spec.get("codes") or {}).values():
            if str(v) not in classes:
                classes.append(str(v))
        out[name] = classes
    return out


def _sources(root: Path, cfg: dict, excl: Exclusions, dataset: str) -> pd.DataFrame:
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


def _joins(root: Path, frame: pd.DataFrame, cfg: dict, excl: Exclusions, dataset: str
           ) -> tuple[pd.DataFrame, dict[str, tuple[str, str]]]:
    """Apply ``join`` specs; returns the frame and, per joined column, (file, marker column that is "1" on
    rows without a match)."""
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
            _need(frame, left_col, f"dataset {dataset!r}", f"join on {left_col!r}")
            _need(right, right_col, where, f"join on {right_col!r}")
        keys = list(on.values())
        dupes = right[right.duplicated(keys, keep=False)]
        if len(dupes):
            listed = "; ".join(f"{dict(zip(keys, k))} at rows {sorted(g['_row'].tolist())}"
                               for k, g in list(dupes.groupby(keys))[:_MAX_LISTED])
            raise ValueError(f"{where}: {dupes.groupby(keys).ngroups} key(s) occur more than once, so the "
                             f"joined values are ambiguous: {listed}")
        cols = spec.get("columns")
        if isinstance(cols, dict):
            take = cols
        else:
            take = {c: c for c in (cols or [c for c in right.columns if c not in keys and not c.startswith("_")])}
        for c in take:
            _need(right, c, where, "join column")
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
        frame = merged
    return frame, missing_by_column


def _filter(frame: pd.DataFrame, spec: dict | None, excl: Exclusions, dataset: str
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kept rows, filtered-out rows); every filtered-out row is recorded with the rule it failed."""
    if not spec:
        return frame, frame.iloc[0:0]
    keep = pd.Series(True, index=frame.index)
    reasons = pd.Series("", index=frame.index)
    for col, rule in spec.items():
        _need(frame, col, f"dataset {dataset!r}", "filter")
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


class _Coded:
    """A metadata field read from a column through optional codes (unknown codes -> missing, recorded)."""

    def __init__(self, field: str, spec: Any, frame: pd.DataFrame, dataset: str, allowed=None,
                 string_is_value: bool = False):
        self.field = field
        if isinstance(spec, str):
            spec = {"value": spec} if string_is_value else {"column": spec}
        self.spec = spec or {}
        self.value = self.spec.get("value")
        self.column = self.spec.get("column")
        if self.column is not None:
            _need(frame, self.column, f"dataset {dataset!r}", f"`{field}`")
        case = self.spec.get("case")
        self.lower = case == "lower"
        codes = self.spec.get("codes")
        self.codes = None if codes is None else {self._key(cell_text(k)): cell_text(v) for k, v in codes.items()}
        self.missing = {self._key(cell_text(m)) for m in self.spec.get("missing", [""])}
        if allowed is not None and self.codes is not None:
            bad = sorted(set(self.codes.values()) - set(allowed))
            if bad:
                raise TableConfigError(f"dataset {dataset!r}: `{field}` codes map to {bad}; allowed {list(allowed)}")
        if self.value is not None and allowed is not None and self.value not in allowed:
            raise TableConfigError(f"dataset {dataset!r}: `{field}` value {self.value!r}; allowed {list(allowed)}")

    def _key(self, v: str) -> str:
        return v.lower() if self.lower else v

    def __bool__(self):
        return self.value is not None or self.column is not None

    def read(self, row: dict, excl: Exclusions, src: str, image_id: str) -> str | None:
        if self.value is not None:
            return str(self.value)
        if self.column is None:
            return None
        raw = row[self.column]
        key = self._key(raw)
        if key in self.missing:
            return None
        if self.codes is None:
            return raw
        if key in self.codes:
            return self.codes[key]
        excl.add(src, image_id, "normalised", f"unknown {self.field} code {raw!r} in {self.column} read as missing")
        return None


def _age(row: dict, spec: dict, excl: Exclusions, src: str, image_id: str) -> float | None:
    raw = row[spec["column"]]
    if raw in {cell_text(m) for m in spec.get("missing", [""])}:
        return None
    try:
        age = float(raw.replace(",", "."))
    except ValueError:
        excl.add(src, image_id, "normalised", f"age {raw!r} in {spec['column']} is not a number: read as missing")
        return None
    lo, hi = spec.get("range", [0, 120])
    if not lo <= age <= hi:
        excl.add(src, image_id, "normalised", f"age {raw!r} outside [{lo}, {hi}]: read as missing")
        return None
    return age


def plan(root: Path, entry: dict) -> Plan:
    """Read the raw layout into manifest rows (image files checked, not hashed) and exclusions."""
    root = Path(root)
    dataset = entry.get("name", "table")
    cfg = _config(entry)
    excl = Exclusions(dataset)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset {dataset!r}: raw folder {root} not found (is data_root right?)")
    frame = _sources(root, cfg, excl, dataset)
    frame, join_missing = _joins(root, frame, cfg, excl, dataset)
    frame = apply_fields(frame, cfg.get("fields"), where=f"dataset {dataset!r}")
    frame, filtered = _filter(frame, cfg.get("filter"), excl, dataset)

    image_spec = cfg.get("image") or {}
    resolve = _image_resolver(root, image_spec, frame, dataset)
    id_template = cfg.get("image_id")
    meta = {
        "modality": _Coded("modality", cfg.get("modality"), frame, dataset,
                           allowed=("cfp", "oct", "slo", "uwf"), string_is_value=True),
        "eye": _Coded("eye", cfg.get("eye"), frame, dataset, allowed=EYES),
        "sex": _Coded("sex", cfg.get("sex"), frame, dataset, allowed=SEXES),
        "quality": _Coded("quality", cfg.get("quality"), frame, dataset),
        "site": _Coded("site", cfg.get("site"), frame, dataset),
        OFFICIAL_SPLIT: _Coded("partition", cfg.get("partition"), frame, dataset, allowed=PARTITIONS),
    }
    if not meta["modality"]:
        raise TableConfigError(f"dataset {dataset!r}: `table.modality` is required (a value or a column)")
    age_spec = cfg.get("age")
    if isinstance(age_spec, str):
        age_spec = {"column": age_spec}
    if age_spec:
        _need(frame, age_spec.get("column"), f"dataset {dataset!r}", "`age`")
    patient = cfg.get("patient") or {}
    if not patient:
        raise TableConfigError(f"dataset {dataset!r}: `table.patient` is required (column, template, or "
                               f"per_image: true when the dataset publishes no patient ids)")
    if patient.get("column"):
        _need(frame, patient["column"], f"dataset {dataset!r}", "`patient`")

    label_specs = cfg.get("labels") or {}
    codings, label_columns = {}, list(label_specs)
    for name, spec in label_specs.items():
        col = spec.get("column")
        if not col:
            raise TableConfigError(f"dataset {dataset!r}: label {name!r} needs `column`")
        lower = spec.get("case") == "lower"
        key = (lambda v: v.lower()) if lower else (lambda v: v)
        codes = {key(cell_text(k)): str(v) for k, v in (spec.get("codes") or {}).items()}
        missing = {key(cell_text(k)): str(v) for k, v in (spec.get("missing") or {}).items()}
        codings[name] = (LabelCoding(name, col, codes, missing), lower, spec)
        _need(frame, col, f"dataset {dataset!r}", f"label {name!r}")
    labels = LabelReader.for_entry(excl, entry)

    rows, seen = [], {}
    if patient.get("per_image"):
        excl.add("(dataset)", None, "normalised",
                 "the dataset publishes no patient ids: each image is its own patient (eyes or repeat images of "
                 "one person cannot be kept together by the splits)")
    for rec in frame.to_dict("records"):
        src = f"{rec['_file']}:row {rec['_row']}"
        rel, why = resolve(rec)
        if rel is None:
            excl.add(src, id_template.format_map(_Row(rec)) if id_template else None, "image", why)
            continue
        image_id = id_template.format_map(_Row(rec)) if id_template else Path(rel).with_suffix("").as_posix()
        if rel in seen:
            raise ValueError(f"dataset {dataset!r}: image {rel} is named by two rows ({seen[rel]} and {src}); "
                             f"which labels apply is ambiguous")
        seen[rel] = src
        row = {"image_id": image_id, "path": rel, "dataset": dataset}
        for field, coded in meta.items():
            row[field] = coded.read(rec, excl, src, image_id)
        if row["modality"] is None:
            excl.add(src, image_id, "image", "no modality for this row")
            continue
        if patient.get("per_image"):
            row["patient_id"] = image_id
        elif patient.get("template"):
            row["patient_id"] = patient["template"].format_map(_Row(rec))
        else:
            row["patient_id"] = rec[patient["column"]]
        if not row["patient_id"]:
            if patient.get("fallback") == "per_image":
                row["patient_id"] = image_id
                excl.add(src, image_id, "normalised", "no patient id for this image: it is its own patient")
            else:
                excl.add(src, image_id, "image", "patient id empty")
                continue
        row["age"] = _age(rec, age_spec, excl, src, image_id) if age_spec else None
        for name, (coding, lower, spec) in codings.items():
            sources = spec.get("sources")
            if sources is not None and rec["_source"] not in sources:
                excl.add(src, image_id, f"label:{name}",
                         spec.get("unlabelled_reason", f"not graded in source {rec['_source']!r}"))
                row[name] = None
                continue
            col = coding.raw_column
            if col in join_missing and rec[join_missing[col][1]]:
                excl.add(src, image_id, f"label:{name}", f"no row in {join_missing[col][0]} for this image")
                row[name] = None
                continue
            raw = rec[col].lower() if lower else rec[col]
            row[name] = labels.read(coding, raw, source=src, image_id=image_id)
        rows.append(row)
    labels.finish()
    out_cols = label_columns + ([OFFICIAL_SPLIT] if meta[OFFICIAL_SPLIT] else [])
    df = pd.DataFrame(rows, columns=["image_id", "path", "dataset", "modality", *MANIFEST_META, OFFICIAL_SPLIT,
                                     *label_columns])
    if not meta[OFFICIAL_SPLIT]:
        df = df.drop(columns=OFFICIAL_SPLIT)
    named = set(seen)  # images of filtered-out rows are named by the index, just not selected
    for rec in filtered.to_dict("records"):
        rel, _ = resolve(rec)
        if rel is not None:
            named.add(rel)
    for pattern in cfg.get("unlisted") or []:
        for p in sorted(root.glob(pattern)):
            if p.is_file():
                rel = p.relative_to(root).as_posix()
                if rel not in named:
                    excl.add(rel, None, "image", "image not named by any index row: no labels or metadata")
    return Plan(rows=df, exclusions=excl, label_columns=out_cols)


def _image_resolver(root: Path, spec: dict, frame: pd.DataFrame, dataset: str):
    """``rec -> (relative path or None, reason)`` for the image of one row."""
    where = f"dataset {dataset!r}, image"
    base = spec.get("base", "")
    extensions = list(spec.get("extensions") or [""])
    no_image = {cell_text(v) for v in spec.get("no_image", [])}
    if "column" in spec:
        _need(frame, spec["column"], f"dataset {dataset!r}", "`image`")

        def name_of(rec):
            return rec[spec["column"]]
    elif "template" in spec:
        def name_of(rec):
            return spec["template"].format_map(_Row(rec))
    elif "index" in spec:
        lookup = index_files(root, spec["index"], key=lambda p: p.stem)
        key_template = spec.get("key")
        if not key_template:
            raise TableConfigError(f"{where}: `index` needs `key` (a template giving the file stem)")

        def resolve_indexed(rec):
            key = key_template.format_map(_Row(rec))
            if key in no_image:
                return None, f"no image for this row ({key!r})"
            rel = lookup.get(key)
            if rel is None:
                return None, f"image file not found: no file with stem {key!r} under {spec['index']!r}"
            return rel.as_posix(), ""
        return resolve_indexed
    elif "path" in frame.columns:  # listing source: the file itself
        def name_of(rec):
            return rec["path"]
    else:
        raise TableConfigError(f"{where}: give `column`, `template` or `index` + `key`")

    def resolve(rec):
        name = name_of(rec)
        if name in no_image or not name:
            return None, f"no image for this row ({name!r})"
        tried = []
        for ext in extensions:
            rel = (Path(base) / f"{name}{ext}").as_posix() if base else f"{name}{ext}"
            tried.append(rel)
            if (root / rel).is_file():
                return rel, ""
        return None, f"image file not found: {' or '.join(tried)}"
    return resolve


def adapt_table(root: Path, entry: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    p = plan(root, entry)
    manifest = finish_manifest(p.rows, Path(root), p.label_columns)
    return manifest, p.exclusions.frame()

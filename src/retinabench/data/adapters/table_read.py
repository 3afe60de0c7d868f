"""The table adapter's readers: one index file (CSV/TSV/TXT, XLSX, Parquet, JSON) or one listing of image files
into text cells with cleaned, unique headers (docs/datasets.md, "The table adapter")."""
from __future__ import annotations

import json
import math
import re
import string
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from retinabench.data.adapters.index_text import IndexFileError, read_index_csv, read_index_text, require_nonempty
from retinabench.data.adapters.root_wall import inside_root

_TABLE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".txt": "csv", ".xlsx": "xlsx", ".xlsm": "xlsx",
                   ".parquet": "parquet", ".json": "json"}
MAX_LISTED = 20


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
    notes: list[str] = field(default_factory=list)  # files or rows skipped on purpose (recorded as normalised)


def read_raw_table(root: Path, spec: dict, *, dataset: str) -> RawTable:
    """Read one index file of a source/join spec into text cells with cleaned, unique headers."""
    rel = spec.get("file")
    if not rel:
        raise TableConfigError(f"dataset {dataset!r}: a table source needs `file` (or use `listing`)")
    path = inside_root(root, rel, dataset=dataset, what=f"the `file:` of a source or join ({rel!r})")
    if not path.is_file():
        raise FileNotFoundError(f"dataset {dataset!r}: index file {path} not found (is data_root right?)")
    fmt = spec.get("format") or _TABLE_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise TableConfigError(f"dataset {dataset!r}: cannot tell the format of {rel}; set `format:` "
                               f"({sorted(set(_TABLE_SUFFIXES.values()))})")
    ascii_only = bool(spec.get("header_ascii", False))
    if fmt in ("xlsx", "parquet"):  # text formats are checked on their decoded text
        require_nonempty(path, dataset=dataset)
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
    header_row = int(spec.get("header_row", 1))
    try:
        df = read_index_csv(path, dataset=dataset, encoding=spec.get("encoding"), sep=sep, dtype=str,
                            keep_default_na=False, header=None, skiprows=header_row - 1,
                            engine="python" if len(sep) > 1 else "c", skip_blank_lines=False)
    except pd.errors.EmptyDataError:
        raise IndexFileError(f"dataset {dataset!r}: index file {path} has no line {header_row} (`header_row`) to "
                             f"read the column names from") from None
    if df.empty:
        return [], [], header_row + 1
    header = list(df.iloc[0])
    rows = df.iloc[1:].values.tolist()
    return rows, header, header_row + 1


def _read_xlsx(path: Path, spec: dict, dataset: str):
    import openpyxl

    try:
        wb = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except zipfile.BadZipFile:
        raise IndexFileError(f"dataset {dataset!r}: index file {path} is not an XLSX workbook (not a zip archive): "
                             f"re-download it, or set `format:` if it is another kind of table") from None
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
        parents: list[str | None] = [None] * len(parts)
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
    try:
        data = json.loads(read_index_text(path, dataset=dataset))
    except json.JSONDecodeError as err:
        raise IndexFileError(f"dataset {dataset!r}: index file {path} is not valid JSON: {err}") from None
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
    rows, unmatched, ignored = [], [], []
    for path in sorted(Path(root).glob(glob)):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if any(p.search(rel) for p in ignore):
            ignored.append(rel)
            continue
        m = pattern.fullmatch(rel)
        if m is None:
            unmatched.append(rel)
            continue
        rows.append({"path": rel, **{k: (v or "") for k, v in m.groupdict().items()}})
    if unmatched:
        listed = "\n".join(f"  {u}" for u in unmatched[:MAX_LISTED])
        raise TableConfigError(f"dataset {dataset!r}: {len(unmatched)} file(s) under {glob!r} do not match "
                               f"the listing regex {pattern.pattern!r}:\n{listed}")
    frame = pd.DataFrame(rows, dtype=object)
    if frame.empty:
        frame = pd.DataFrame(columns=["path", *pattern.groupindex], dtype=object)
    frame.index = range(1, len(frame) + 1)
    notes = [f"{len(ignored)} file(s) skipped by the listing's `ignore` patterns "
             f"{[p.pattern for p in ignore]}, e.g. {ignored[:3]}"] if ignored else []
    return RawTable(name=spec.get("name", "listing"), file=f"listing {glob}", frame=frame, first_row=1,
                    notes=notes)

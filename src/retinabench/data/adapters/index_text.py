"""Reading an index file's text: the encoding decided once, and clear errors for undecodable or empty files.

Encoding: an ``encoding:`` given on the source wins. Otherwise the byte-order mark decides (UTF-8 with BOM, or
UTF-16 as Excel's "Unicode text" export writes it) and a file without one is read as UTF-8. Single-byte
encodings are never guessed: every byte sequence decodes as Latin-1 or cp1252, so a guess would silently turn
names and codes into other text. A file that is not valid text in its encoding is an error naming the file,
the encoding, the byte offset and line, and the ``encoding:`` to set.
"""
from __future__ import annotations

import codecs
import io
from pathlib import Path

import pandas as pd

_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


class IndexFileError(ValueError):
    """An index file that cannot be read as a table: empty, or not text in its encoding."""


def detect_encoding(data: bytes) -> str:
    """The encoding a file without an ``encoding:`` option is read in (see the module doc)."""
    return next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8-sig")


def require_nonempty(path: Path, *, dataset: str) -> None:
    size = Path(path).stat().st_size
    if size == 0:
        raise IndexFileError(_empty(path, dataset, size))


def _empty(path: Path, dataset: str, size: int) -> str:
    what = "0 bytes" if size == 0 else f"{size} bytes of whitespace only"
    return (f"dataset {dataset!r}: index file {path} is empty ({what}): it has no header and no rows. Re-extract "
            f"it from the download (an interrupted copy leaves empty files), or drop it from the entry's sources")


def read_index_text(path: Path, encoding: str | None = None, *, dataset: str, configurable: bool = True) -> str:
    """The decoded text of ``path`` (BOM removed); an :class:`IndexFileError` when it is empty or undecodable.
    ``configurable``: the adapter reading it has an ``encoding:`` option (the table adapter) to suggest."""
    path = Path(path)
    data = path.read_bytes()
    enc = encoding or detect_encoding(data)
    try:
        text = data.decode(enc)
    except LookupError:
        raise IndexFileError(f"dataset {dataset!r}: `encoding: {enc}` for {path} is not an encoding Python knows "
                             f"(e.g. utf-8, latin-1, cp1252, utf-16)") from None
    except UnicodeDecodeError as err:
        raise IndexFileError(_undecodable(path, data, enc, err, dataset, configurable)) from None
    text = text.lstrip("\ufeff")
    if not text.strip():
        raise IndexFileError(_empty(path, dataset, len(data)))
    return text


def _undecodable(path: Path, data: bytes, enc: str, err: UnicodeDecodeError, dataset: str, configurable: bool
                 ) -> str:
    offset = err.start + (len(codecs.BOM_UTF8) if enc == "utf-8-sig" and data.startswith(codecs.BOM_UTF8) else 0)
    line = data.count(b"\n", 0, offset) + 1
    start = data.rfind(b"\n", 0, offset) + 1
    end = data.find(b"\n", offset)
    as_latin1 = data[start:end if end >= 0 else len(data)].decode("latin-1").rstrip("\r")
    fix = ("Set `encoding:` on this source to the file's encoding, e.g. `encoding: latin-1` (Western European "
           "exports; `cp1252` for Windows ones)" if configurable else
           "This adapter reads its index files as UTF-8 (as published): re-save the file as UTF-8, or check that it "
           "is the file the dataset's publisher distributes")
    return (f"dataset {dataset!r}: index file {path} is not {enc} text: byte {offset} (line {line}) is "
            f"0x{data[offset]:02x} ({err.reason}); read as Latin-1 that line is {as_latin1[:120]!r}. {fix}")


def read_index_csv(path: Path, *, dataset: str, encoding: str | None = None, configurable: bool = True,
                   **read_csv) -> pd.DataFrame:
    """``pandas.read_csv`` on the file's text as :func:`read_index_text` decodes it."""
    text = read_index_text(path, encoding, dataset=dataset, configurable=configurable)
    return pd.read_csv(io.StringIO(text), **read_csv)

"""One Parquet schema per artifact kind; writers validate against it so a malformed table never lands."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

MODALITIES = ("cfp", "oct", "slo", "uwf")
SPLITS = ("train", "val", "test")

# Fixed columns; label columns (one per task label the dataset supports) are appended as nullable strings.
MANIFEST = pa.schema([
    ("image_id", pa.string()), ("path", pa.string()), ("dataset", pa.string()), ("modality", pa.string()),
    ("patient_id", pa.string()), ("eye", pa.string()), ("age", pa.float64()), ("sex", pa.string()),
    ("quality", pa.string()), ("site", pa.string()), ("sha256", pa.string()),
])
EXCLUSIONS = pa.schema([
    ("dataset", pa.string()), ("source", pa.string()), ("image_id", pa.string()), ("scope", pa.string()),
    ("reason", pa.string()),
])
SPLIT = pa.schema([
    ("image_id", pa.string()), ("patient_id", pa.string()), ("dataset", pa.string()), ("task", pa.string()),
    ("label", pa.string()), ("y", pa.int64()), ("split", pa.string()), ("balanced", pa.bool_()),
])
IMAGE_INDEX = pa.schema([("image_id", pa.string()), ("row", pa.int64())])
# The one train/val/test assignment of a dataset (every task of it uses it): `group_id` is the connected component
# of patient id ∪ duplicate cluster the image was placed with; `placed_by` is "hash" or "class presence".
DATASET_SPLIT = pa.schema([
    ("image_id", pa.string()), ("patient_id", pa.string()), ("dataset", pa.string()), ("group_id", pa.string()),
    ("split", pa.string()), ("placed_by", pa.string()),
])
# Decode pass of the manifest job: one row per manifest image; `phash` is the 256-bit DCT perceptual hash (hex).
IMAGE_HASHES = pa.schema([
    ("image_id", pa.string()), ("sha256", pa.string()), ("width", pa.int64()), ("height", pa.int64()),
    ("mode", pa.string()), ("phash", pa.string()),
])
# Duplicate clusters of one dataset, one row per member image (clusters of >= 2 images only).
DUPLICATES = pa.schema([
    ("cluster_id", pa.string()), ("image_id", pa.string()), ("patient_id", pa.string()), ("sha256", pa.string()),
    ("kind", pa.string()), ("distance", pa.int64()), ("nearest", pa.string()), ("n_images", pa.int64()),
    ("n_patients", pa.int64()),
])
# Pairs of images of two different datasets with identical bytes (exact) or perceptual hashes within the threshold.
CROSS_DUPLICATES = pa.schema([
    ("dataset_a", pa.string()), ("image_a", pa.string()), ("split_a", pa.string()),
    ("dataset_b", pa.string()), ("image_b", pa.string()), ("split_b", pa.string()),
    ("kind", pa.string()), ("distance", pa.int64()),
])
# Raw files a manifest was built from: every regular file under the raw root with its size, mtime and (for the
# files the job read: images, index files) sha256.
RAW_FILES = pa.schema([
    ("path", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()), ("sha256", pa.string()),
])
# Predictions: + one float64 column p_<class> per class, in the task's class order; protocols may add extras.
PREDICTIONS = pa.schema([
    ("image_id", pa.string()), ("dataset", pa.string()), ("task", pa.string()), ("encoder", pa.string()),
    ("protocol", pa.string()), ("seed", pa.int64()), ("regime", pa.string()), ("split", pa.string()),
    ("y_true", pa.int64()), ("y_pred", pa.int64()),
])
METRICS = pa.schema([
    ("dataset", pa.string()), ("task", pa.string()), ("encoder", pa.string()), ("protocol", pa.string()),
    ("seed", pa.int64()), ("regime", pa.string()), ("split", pa.string()), ("metric", pa.string()),
    ("value", pa.float64()), ("n", pa.int64()),
])
TRAINING_LOG = pa.schema([
    ("encoder", pa.string()), ("task", pa.string()), ("protocol", pa.string()), ("seed", pa.int64()),
    ("train_regime", pa.string()), ("epoch", pa.int64()), ("step", pa.int64()), ("lr", pa.float64()),
    ("train_loss", pa.float64()), ("val_loss", pa.float64()), ("best", pa.bool_()),
])
# Protocol sensitivity (retinabench.reliability.sensitivity): both values of a named convention on the same rows.
PROTOCOL_SENSITIVITY = pa.schema([
    ("convention", pa.string()), ("variant_a", pa.string()), ("variant_b", pa.string()), ("source", pa.string()),
    ("encoder", pa.string()), ("protocol", pa.string()), ("task", pa.string()), ("dataset", pa.string()),
    ("metric", pa.string()), ("attribute", pa.string()), ("value_a", pa.float64()), ("value_b", pa.float64()),
    ("delta", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("p_value", pa.float64()),
    ("n_a", pa.int64()), ("n_b", pa.int64()), ("n_units", pa.int64()), ("conclusion", pa.string()),
    ("call_a", pa.string()), ("call_b", pa.string()), ("conclusion_changes", pa.bool_()), ("skipped", pa.bool_()),
    ("reason", pa.string()),
])

KINDS = {"manifest": MANIFEST, "exclusions": EXCLUSIONS, "split": SPLIT, "image_index": IMAGE_INDEX,
         "predictions": PREDICTIONS, "metrics": METRICS, "training_log": TRAINING_LOG,
         "dataset_split": DATASET_SPLIT, "image_hashes": IMAGE_HASHES, "duplicates": DUPLICATES,
         "cross_duplicates": CROSS_DUPLICATES, "raw_files": RAW_FILES,
         "protocol_sensitivity": PROTOCOL_SENSITIVITY}
# Kinds whose tables may carry columns beyond the fixed ones, and the type those extras must have.
_OPEN_KINDS = {"manifest": pa.string(), "predictions": None}


class SchemaError(ValueError):
    pass


def conform(df: pd.DataFrame, kind: str, *, where: str = "") -> pa.Table:
    """Arrow table of ``df`` in the fixed column order/types of ``kind``; extra columns only where allowed."""
    schema = KINDS[kind]
    missing = [f.name for f in schema if f.name not in df.columns]
    if missing:
        raise SchemaError(f"{kind} table {where}: missing columns {missing}")
    extra = [c for c in df.columns if c not in schema.names]
    if extra and kind not in _OPEN_KINDS:
        raise SchemaError(f"{kind} table {where}: unexpected columns {extra}")
    fields = list(schema)
    for col in extra:
        typ = _OPEN_KINDS[kind]
        if typ is None:  # predictions: probabilities are float, protocol extras keep their own type
            typ = pa.float64() if col.startswith("p_") else pa.Array.from_pandas(df[col]).type
        fields.append(pa.field(col, typ))
    target = pa.schema(fields)
    try:
        return pa.Table.from_pandas(df[[f.name for f in fields]], schema=target, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise SchemaError(f"{kind} table {where}: {err}") from err


def write_table(df: pd.DataFrame, path: str | os.PathLike, kind: str) -> Path:
    from retinabench.atomic import atomic_write
    path = Path(path)
    table = conform(df, kind, where=str(path))
    # atomic, under a temporary name of this writer's own: a killed job never leaves a half-written artifact
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_table(path: str | os.PathLike, kind: str | None = None, columns: Iterable[str] | None = None) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{kind or 'table'} {path} does not exist")
    df = pq.read_table(path, columns=list(columns) if columns else None).to_pandas()
    if kind is not None and columns is None:
        missing = [n for n in KINDS[kind].names if n not in df.columns]
        if missing:
            raise SchemaError(f"{path}: not a {kind} table, missing columns {missing}")
    return df


def probability_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("p_")]

"""Embed every cached image of a dataset with a frozen encoder, streaming batches to Parquet.

Memory stays flat in dataset size: the image cache is memory-mapped, one batch is in flight, and each batch's
embeddings are appended to the Parquet file as a row group. Output schema: ``image_id`` + ``embedding``
(fixed-size list of float32). Rows follow the image cache order.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from retinabench.data.image_cache import open_image_cache
from retinabench.models.loaders import Encoder


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def to_model_input(batch_u8: np.ndarray, encoder: Encoder, device: torch.device) -> torch.Tensor:
    """uint8 NHWC -> normalised float NCHW at the encoder's input size."""
    # A copy: cache slices are read-only memory maps, which torch must not wrap.
    x = torch.from_numpy(np.array(batch_u8, copy=True)).to(device, non_blocking=True)
    x = x.permute(0, 3, 1, 2).float().div_(255.0)
    if x.shape[-1] != encoder.input_size or x.shape[-2] != encoder.input_size:
        x = F.interpolate(x, size=(encoder.input_size, encoder.input_size), mode="bicubic", align_corners=False)
    mean = torch.tensor(encoder.mean, device=device).view(1, 3, 1, 1)
    std = torch.tensor(encoder.std, device=device).view(1, 3, 1, 1)
    return (x - mean) / std


def features_schema(dim: int) -> pa.Schema:
    return pa.schema([("image_id", pa.string()), ("embedding", pa.list_(pa.float32(), dim))])


def extract_features(encoder: Encoder, cache_array: str | os.PathLike, cache_index: str | os.PathLike,
                     out_path: str | os.PathLike, *, batch_size: int = 64, device: str = "auto",
                     progress: bool = True) -> dict:
    images, index = open_image_cache(cache_array, cache_index)
    dev = pick_device(device)
    module = encoder.module.to(dev).eval()
    amp = dev.type == "cuda"
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    schema = features_schema(encoder.embed_dim)
    n = images.shape[0]
    from tqdm import tqdm
    bar = tqdm(total=n, desc=f"features {encoder.name}", unit="img", disable=not progress, mininterval=5)
    ids = index["image_id"].to_numpy()
    with pq.ParquetWriter(tmp, schema) as writer, torch.inference_mode():
        for start in range(0, n, batch_size):
            x = to_model_input(images[start:start + batch_size], encoder, dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                emb = module(x)
            emb = emb.float().cpu().numpy()
            if not np.isfinite(emb).all():
                raise FloatingPointError(f"encoder {encoder.name}: non-finite embedding in images "
                                         f"{start}..{start + len(emb) - 1} of {cache_array}")
            flat = pa.array(emb.reshape(-1), type=pa.float32())
            col = pa.FixedSizeListArray.from_arrays(flat, encoder.embed_dim)
            writer.write_table(pa.table({"image_id": pa.array(ids[start:start + len(emb)], pa.string()),
                                         "embedding": col}, schema=schema))
            bar.update(len(emb))
    bar.close()
    tmp.replace(out_path)
    return {"n_images": int(n), "dim": encoder.embed_dim, "device": str(dev), "batch_size": batch_size}


def load_features(path: str | os.PathLike) -> tuple[pd.Index, np.ndarray]:
    table = pq.read_table(path)
    if table.schema.names != ["image_id", "embedding"]:
        raise ValueError(f"{path}: not a features table (columns {table.schema.names})")
    emb_type = table.schema.field("embedding").type
    dim = emb_type.list_size
    values = table.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return pd.Index(table.column("image_id").to_pylist()), values.reshape(-1, dim).astype(np.float32, copy=False)

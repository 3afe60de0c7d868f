"""Embed every cached image of a dataset with a frozen encoder, streaming batches to Parquet.

Memory stays flat in dataset size: the image cache is memory-mapped, one batch is in flight, and each batch's
embeddings are appended to the Parquet file as a row group. Output schema: ``image_id`` + ``embedding``
(fixed-size list of float32). Rows follow the image cache order.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from retinabench.atomic import atomic_path
from retinabench.data.image_cache import open_image_cache
from retinabench.models.encoder import Encoder


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


class InputSpec(Protocol):
    """What the input transform reads of a model: an :class:`Encoder` or a dual encoder's image tower."""

    @property
    def input_size(self) -> int: ...
    @property
    def mean(self) -> tuple: ...
    @property
    def std(self) -> tuple: ...


def to_model_input(batch_u8: np.ndarray, encoder: InputSpec, device: torch.device) -> torch.Tensor:
    """uint8 NHWC -> normalised float NCHW at the encoder's input size.

    The result keeps the cache's NHWC memory order (a channels_last tensor): convolutions read it without a copy.
    The uint8 batch crosses to the device before it is widened to float (4x less to transfer)."""
    # A copy: cache slices are read-only memory maps, which torch must not wrap.
    x = torch.from_numpy(np.array(batch_u8, copy=True))
    if device.type == "cuda":
        x = x.pin_memory()
    x = x.to(device, non_blocking=True)
    x = x.permute(0, 3, 1, 2).float().div_(255.0)
    if x.shape[-1] != encoder.input_size or x.shape[-2] != encoder.input_size:
        x = F.interpolate(x, size=(encoder.input_size, encoder.input_size), mode="bicubic", align_corners=False)
    mean = torch.tensor(encoder.mean, device=device).view(1, 3, 1, 1)
    std = torch.tensor(encoder.std, device=device).view(1, 3, 1, 1)
    return (x - mean) / std


def is_convnet(module: torch.nn.Module) -> bool:
    """Whether most parameters sit in 2-d convolutions (a CNN, which channels_last speeds up; a ViT's only
    convolution is its patch embedding)."""
    conv = sum(p.numel() for m in module.modules() if isinstance(m, torch.nn.Conv2d) for p in m.parameters(False))
    total = sum(p.numel() for p in module.parameters())
    return total > 0 and conv > total / 2


def prepare_module(module: torch.nn.Module, device: torch.device, channels_last: bool | str = "auto"):
    """The module on ``device`` in eval mode, in channels_last memory format where that is faster (CNNs: on CPU
    and CUDA alike; ViTs are left as they are, where it is slower). Returns the module and whether it converted."""
    module = module.to(device).eval()
    use_cl = is_convnet(module) if channels_last == "auto" else bool(channels_last)
    if use_cl:
        module = module.to(memory_format=torch.channels_last)
    return module, use_cl


# -- the probe embedding (features.probe_embedding) ----------------------------------------------------------------
class _L2Normalised(torch.nn.Module):
    """``embed(x)`` L2-normalised row by row; ``module`` is held so that ``.to`` / ``.eval`` reach it."""

    def __init__(self, module: torch.nn.Module, embed):
        super().__init__()
        self.module, self.embed = module, embed

    def forward(self, x):
        return F.normalize(self.embed(x).float(), p=2.0, dim=-1)


def build_probe_encoder(entry: dict, probe_embedding: str = "pre_projection", weights=None) -> Encoder:
    """The encoder whose embeddings the probes see (``features.probe_embedding``):

    * ``pre_projection`` (ours): :func:`~retinabench.models.encoder.build_encoder`, the entry's pooling (a dual
      encoder's image tower before its projection, or the entry's ``projected`` variant where it declares one);
    * ``projected_l2`` (FOCUS, whose ``get_image_embeddings`` return ``get_image_features`` / the CLIP image
      embedding divided by its norm): an entry with the zeroshot interface embeds through its whole dual
      encoder's image tower into the joint image-text space; any other entry (no joint space) keeps its pooling.
      Every embedding is then L2-normalised (FOCUS normalises its vision encoders' embeddings too)."""
    from retinabench.models.encoder import build_encoder
    if probe_embedding == "pre_projection":
        return build_encoder(entry, weights)
    if probe_embedding != "projected_l2":
        raise ValueError(f"features.probe_embedding must be pre_projection or projected_l2, got {probe_embedding!r}")
    from retinabench.models.strict import probe_embed_dim
    if "zeroshot" in (entry.get("interfaces") or []):
        from retinabench.models.dual_encoder import load_dual_encoder
        dual = load_dual_encoder(entry, weights)
        module = _L2Normalised(dual.module, dual.encode_image).eval()
        dim = probe_embed_dim(module, dict(entry, embed_dim=None))  # the joint space's dimension
        record = {**dual.weights, "probe_embedding": "projected_l2: joint image-text space, L2-normalised"}
        return Encoder(entry["name"], module, tuple(dual.mean), tuple(dual.std), dual.input_size, dim, record,
                       "projected")
    enc = build_encoder(entry, weights)
    enc.module = _L2Normalised(enc.module, enc.module).eval()
    enc.weights = {**enc.weights, "probe_embedding": "projected_l2: no joint space, the entry's pooling "
                                                     "L2-normalised"}
    return enc


def features_schema(dim: int) -> pa.Schema:
    return pa.schema([("image_id", pa.string()), ("embedding", pa.list_(pa.float32(), dim))])


def extract_features(encoder: Encoder, cache_array: str | os.PathLike, cache_index: str | os.PathLike,
                     out_path: str | os.PathLike, *, batch_size: int = 64, device: str = "auto",
                     progress: bool = True, channels_last: bool | str = "auto") -> dict:
    images, index = open_image_cache(cache_array, cache_index)
    dev = pick_device(device)
    module, used_cl = prepare_module(encoder.module, dev, channels_last)
    amp = dev.type == "cuda"
    if amp:
        torch.backends.cudnn.benchmark = True
    out_path = Path(out_path)
    schema = features_schema(encoder.embed_dim)
    n = images.shape[0]
    from tqdm import tqdm
    bar = tqdm(total=n, desc=f"features {encoder.name}", unit="img", disable=not progress, mininterval=5)
    ids = index["image_id"].to_numpy()
    with atomic_path(out_path) as tmp:  # a failed extraction leaves no partial table behind
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
    return {"n_images": int(n), "dim": encoder.embed_dim, "input_size": encoder.input_size, "device": str(dev),
            "batch_size": batch_size,
            "precision": "bf16 autocast" if amp else "fp32", "channels_last": used_cl}


def load_features(path: str | os.PathLike) -> tuple[pd.Index, np.ndarray]:
    table = pq.read_table(path)
    if table.schema.names != ["image_id", "embedding"]:
        raise ValueError(f"{path}: not a features table (columns {table.schema.names})")
    emb_type = table.schema.field("embedding").type
    dim = emb_type.list_size
    values = table.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return pd.Index(table.column("image_id").to_pylist()), values.reshape(-1, dim).astype(np.float32, copy=False)

"""Pieces shared by trainable protocols: class weights, the warm-up + cosine schedule, prediction frames."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch


def class_weights(y: np.ndarray, n_classes: int) -> np.ndarray:
    """w_c = 1 / log(n_c + 1), normalised to sum to 1 (the paper's unbalanced-regime loss weights)."""
    counts = np.bincount(np.asarray(y), minlength=n_classes).astype(float)
    if (counts == 0).any():
        raise ValueError(f"class weights: classes {np.flatnonzero(counts == 0).tolist()} have no training samples")
    w = 1.0 / np.log(counts + 1.0)
    return w / w.sum()


def warmup_cosine(total_steps: int, warmup_frac: float = 0.1):
    """LR multiplier: linear warm-up over the first ``warmup_frac`` of steps, then cosine decay to 0."""
    warmup = max(1, int(round(total_steps * warmup_frac)))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_frac: float = 0.1):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps, warmup_frac))


def predictions_frame(image_ids, y_true, proba: np.ndarray, classes: list[str], *, dataset: str, task: str,
                      encoder: str, protocol: str, seed: int, regime: str, split: str) -> pd.DataFrame:
    proba = np.asarray(proba, dtype=np.float64)
    if proba.shape != (len(image_ids), len(classes)):
        raise ValueError(f"{protocol}: probabilities of shape {proba.shape}, expected ({len(image_ids)}, {len(classes)})")
    if not np.allclose(proba.sum(axis=1), 1.0, atol=1e-5):
        raise ValueError(f"{protocol}: class probabilities do not sum to 1")
    df = pd.DataFrame({"image_id": list(image_ids), "dataset": dataset, "task": task, "encoder": encoder,
                       "protocol": protocol, "seed": int(seed), "regime": regime, "split": split,
                       "y_true": np.asarray(y_true, dtype="int64"), "y_pred": proba.argmax(axis=1).astype("int64")})
    for k, cls in enumerate(classes):
        df[f"p_{cls}"] = proba[:, k]
    return df

"""Weighted kNN on cached features (DINO-style): cosine similarity, top-k neighbours, votes exp(sim / T).

The votes, summed per class and normalised, are class probabilities, so AUROC and ECE apply.
"""
from __future__ import annotations

import numpy as np
import torch

from retinabench.settings.protocols import AUTO_K, KnnSettings


def resolve_k(k: int | str, n_train: int) -> int:
    """The neighbour count used (``k`` as the ``knn:`` section types it: a positive integer or ``auto``):
    ``auto`` is ``min(AUTO_K, n_train)``; a number larger than the training set is an error (capping it silently
    would report a different protocol than the one configured)."""
    if isinstance(k, str):
        if k != "auto":
            raise ValueError(f"knn: k = {k!r}; a positive integer or auto")
        return max(1, min(AUTO_K, n_train))
    if k > n_train:
        raise ValueError(f"knn: k = {k} but the training set has {n_train} images; lower knn.k or set k: auto")
    return int(k)


def knn_predict_proba(train_x: np.ndarray, train_y: np.ndarray, query_x: np.ndarray, n_classes: int, *,
                      k: int | str, temperature: float, chunk: int = 4096) -> np.ndarray:
    tr = torch.nn.functional.normalize(torch.as_tensor(train_x, dtype=torch.float32), dim=1)
    ty = torch.as_tensor(np.array(train_y), dtype=torch.long)
    k = resolve_k(k, tr.shape[0])
    out = []
    for start in range(0, len(query_x), chunk):
        q = torch.nn.functional.normalize(torch.as_tensor(query_x[start:start + chunk], dtype=torch.float32), dim=1)
        sim, idx = (q @ tr.T).topk(k, dim=1)
        votes = torch.exp((sim - sim[:, :1]) / temperature)  # shift by the max: same ratios, no overflow
        proba = torch.zeros(q.shape[0], n_classes).scatter_add_(1, ty[idx], votes)
        out.append((proba / proba.sum(dim=1, keepdim=True)).numpy())
    return np.concatenate(out).astype(np.float64)


# -- the protocol registry's interface (retinabench.protocols.registry) ------------------------------------------
def fit(train_x, train_y, val_x, val_y, n_classes: int, *, seed: int, balanced: bool, settings: KnnSettings):
    """kNN keeps its training set; ``k`` and ``temperature`` from the ``knn:`` section. No training log."""
    return {"x": train_x, "y": train_y, "n_classes": n_classes, "k": settings.k,
            "temperature": settings.temperature}, None


def predict(model: dict, x: np.ndarray) -> np.ndarray:
    return knn_predict_proba(model["x"], model["y"], x, model["n_classes"], k=model["k"],
                             temperature=model["temperature"])

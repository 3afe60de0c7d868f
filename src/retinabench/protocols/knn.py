"""Weighted kNN on cached features (DINO-style): cosine similarity, top-k neighbours, votes exp(sim / T).

The votes, summed per class and normalised, are class probabilities, so AUROC and ECE apply.
"""
from __future__ import annotations

import numpy as np
import torch


AUTO_K = 20  # `k: auto` -> min(AUTO_K, training images)


def resolve_k(k: int | str, n_train: int) -> int:
    """The neighbour count used: ``auto`` is ``min(20, n_train)``; a number larger than the training set is an
    error (capping it silently would report a different protocol than the one configured)."""
    if k == "auto":
        return max(1, min(AUTO_K, n_train))
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"knn: k must be a positive integer or 'auto', got {k!r}")
    if k > n_train:
        raise ValueError(f"knn: k = {k} but the training set has {n_train} images; lower knn.k or set k: auto")
    return int(k)


def knn_predict_proba(train_x: np.ndarray, train_y: np.ndarray, query_x: np.ndarray, n_classes: int, *,
                      k: int | str = 20, temperature: float = 0.07, chunk: int = 4096) -> np.ndarray:
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
def fit(train_x, train_y, val_x, val_y, n_classes: int, *, seed: int, balanced: bool, settings: dict):
    """kNN keeps its training set; ``k`` and ``temperature`` from the ``knn:`` section. No training log."""
    return {"x": train_x, "y": train_y, "n_classes": n_classes, "k": settings.get("k", 20),
            "temperature": settings.get("temperature", 0.07)}, None


def predict(model: dict, x: np.ndarray) -> np.ndarray:
    return knn_predict_proba(model["x"], model["y"], x, model["n_classes"], k=model["k"],
                             temperature=model["temperature"])

"""Weighted kNN on cached features (DINO-style): cosine similarity, top-k neighbours, votes exp(sim / T).

The votes, summed per class and normalised, are class probabilities, so AUROC and ECE apply.
"""
from __future__ import annotations

import numpy as np
import torch


def knn_predict_proba(train_x: np.ndarray, train_y: np.ndarray, query_x: np.ndarray, n_classes: int, *,
                      k: int = 20, temperature: float = 0.07, chunk: int = 4096) -> np.ndarray:
    tr = torch.nn.functional.normalize(torch.as_tensor(train_x, dtype=torch.float32), dim=1)
    ty = torch.as_tensor(np.array(train_y), dtype=torch.long)
    k = min(k, tr.shape[0])
    out = []
    for start in range(0, len(query_x), chunk):
        q = torch.nn.functional.normalize(torch.as_tensor(query_x[start:start + chunk], dtype=torch.float32), dim=1)
        sim, idx = (q @ tr.T).topk(k, dim=1)
        votes = torch.exp((sim - sim[:, :1]) / temperature)  # shift by the max: same ratios, no overflow
        proba = torch.zeros(q.shape[0], n_classes).scatter_add_(1, ty[idx], votes)
        out.append((proba / proba.sum(dim=1, keepdim=True)).numpy())
    return np.concatenate(out).astype(np.float64)

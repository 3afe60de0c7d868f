"""Nearest-centroid (prototype) probe on cached features: each class is the mean of its L2-normalised training
features (renormalised), an image's class probabilities are softmax(cos(image, prototype) / T).

A training-free baseline between kNN and the linear probe (the prototype classifier of few-shot learning and of
"nearest class mean" evaluations of foundation models): one parameter-free vector per class, so it is robust on
tiny training sets, and it is insensitive to class imbalance in the training set (a class's prototype does not
depend on how many images it has; the prior is uniform). Deterministic: one run (seed 0). ``temperature`` (config
``centroid:``) only sharpens the probabilities (accuracy and AUROC do not depend on it; calibration does).
"""
from __future__ import annotations

import numpy as np

from retinabench.settings.protocols import CentroidSettings


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


def fit(train_x, train_y, val_x, val_y, n_classes: int, *, seed: int, balanced: bool, settings: CentroidSettings):
    """Class prototypes [n_classes, dim]; a class without training images is an error naming it."""
    x, y = _unit(train_x), np.asarray(train_y)
    missing = [c for c in range(n_classes) if not (y == c).any()]
    if missing:
        raise ValueError(f"centroid probe: classes {missing} have no training images")
    prototypes = _unit(np.stack([x[y == c].mean(axis=0) for c in range(n_classes)]))
    return {"prototypes": prototypes, "temperature": settings.temperature}, None


def predict(model: dict, x: np.ndarray) -> np.ndarray:
    logits = _unit(x) @ model["prototypes"].T / model["temperature"]
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)

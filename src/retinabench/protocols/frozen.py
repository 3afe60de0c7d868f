"""Frozen-feature protocols (kNN, linear probe, logistic probe) for one (encoder, task): all seeds and regimes.

One job runs everything for an (encoder, task) pair so that the full grid stays at a few thousand Snakemake
jobs and Python/torch start-up is paid once per pair, not once per seed × regime × protocol.
Regime ``a-b``: ``a`` = training data (u: all, b: class-balanced undersample; the validation set used for model
selection follows the same choice), ``b`` = test data (u: all, b: balanced undersample). kNN and the logistic
probe are deterministic given the data, so they run once (seed 0); the linear probe runs every seed.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retinabench.data.splits import regime_rows
from retinabench.protocols.common import predictions_frame
from retinabench.protocols.knn import knn_predict_proba
from retinabench.protocols.linear import LinearConfig, linear_predict_proba, train_linear_probe
from retinabench.protocols.logreg import logreg_predict_proba

FROZEN_PROTOCOLS = ("knn", "linear", "logreg")
DETERMINISTIC = {"knn", "logreg"}


def _rows(split: pd.DataFrame, id_to_row: dict, part: str, balanced: bool):
    rows = regime_rows(split, part, balanced)
    missing = [i for i in rows["image_id"] if i not in id_to_row]
    if missing:
        raise KeyError(f"{len(missing)} images of the {part} split have no features, e.g. {missing[:3]}")
    return rows, np.fromiter((id_to_row[i] for i in rows["image_id"]), dtype=np.int64, count=len(rows))


def run_frozen(ids: pd.Index, feats: np.ndarray, split: pd.DataFrame, task: dict, encoder: str, *,
               protocols: list[str], seeds: list[int], regimes: list[str], cfg: dict[str, Any]
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    unknown = sorted(set(protocols) - set(FROZEN_PROTOCOLS))
    if unknown:
        raise ValueError(f"unknown frozen protocols {unknown}; expected a subset of {FROZEN_PROTOCOLS}")
    classes = list(task["classes"])
    n_classes = len(classes)
    id_to_row = {image_id: i for i, image_id in enumerate(ids)}
    lin_cfg = LinearConfig(**cfg.get("linear", {}))
    knn_cfg = cfg.get("knn", {})
    log_cfg = cfg.get("logreg", {})
    preds, logs = [], []
    train_regimes = sorted({r.split("-")[0] for r in regimes})
    from retinabench.progress import Progress
    bar = Progress(len(train_regimes) * sum(1 if p in DETERMINISTIC else len(seeds) for p in protocols),
                   f"frozen probes {encoder}/{task['name']}", unit="fits")
    for train_regime in train_regimes:
        bal = train_regime == "b"
        tr, tr_idx = _rows(split, id_to_row, "train", bal)
        va, va_idx = _rows(split, id_to_row, "val", bal)
        tests = {r: _rows(split, id_to_row, "test", r.split("-")[1] == "b")
                 for r in regimes if r.startswith(train_regime + "-")}
        xtr, ytr = feats[tr_idx], tr["y"].to_numpy()
        queries = [("val", va, va_idx)] + [(r, rows, idx) for r, (rows, idx) in tests.items()]
        for protocol in protocols:
            for seed in ([0] if protocol in DETERMINISTIC else seeds):
                if protocol == "knn":
                    probas = [knn_predict_proba(xtr, ytr, feats[idx], n_classes, k=knn_cfg.get("k", 20),
                                                temperature=knn_cfg.get("temperature", 0.07))
                              for _, _, idx in queries]
                elif protocol == "logreg":
                    probas = logreg_predict_proba(xtr, ytr, [feats[idx] for _, _, idx in queries], n_classes,
                                                  C=log_cfg.get("C", 1.0), max_iter=log_cfg.get("max_iter", 1000),
                                                  seed=seed)
                else:
                    head, log = train_linear_probe(xtr, ytr, feats[va_idx], va["y"].to_numpy(), n_classes,
                                                   seed=seed, weighted=not bal, cfg=lin_cfg)
                    probas = [linear_predict_proba(head, feats[idx]) for _, _, idx in queries]
                    logs.append(pd.DataFrame(log).assign(encoder=encoder, task=task["name"], protocol=protocol,
                                                         seed=seed, train_regime=train_regime))
                (_, va_rows, _), proba_val = queries[0], probas[0]
                for (regime, rows, _), proba in zip(queries[1:], probas[1:]):
                    common = dict(dataset=task["dataset"], task=task["name"], encoder=encoder, protocol=protocol,
                                  seed=seed, regime=regime)
                    preds.append(predictions_frame(va_rows["image_id"], va_rows["y"], proba_val, classes,
                                                   split="val", **common))
                    preds.append(predictions_frame(rows["image_id"], rows["y"], proba, classes, split="test",
                                                   **common))
                bar.update(note=f"{protocol} seed {seed}, training data {train_regime}")
    log_df = pd.concat(logs, ignore_index=True) if logs else pd.DataFrame(
        columns=["encoder", "task", "protocol", "seed", "train_regime", "epoch", "step", "lr", "train_loss",
                 "val_loss", "best"])
    return pd.concat(preds, ignore_index=True), log_df

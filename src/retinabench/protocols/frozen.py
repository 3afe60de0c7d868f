"""Frozen-feature protocols (every `features` protocol of retinabench.protocols.registry: kNN, linear, logistic,
centroid probes) for one (encoder, task): all seeds and regimes.

One job runs everything for an (encoder, task) pair so that the full grid stays at a few thousand Snakemake
jobs and Python/torch start-up is paid once per pair, not once per seed × regime × protocol.
Regime ``a-b``: ``a`` = training data (u: all, b: class-balanced undersample; the validation set used for model
selection follows the same choice), ``b`` = test data (u: all, b: balanced undersample). Deterministic protocols
(kNN, logistic, centroid) run once (seed 0); the others (the linear probe) run every seed.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from retinabench.data.splits import regime_rows
from retinabench.protocols.common import predictions_frame
from retinabench.protocols.registry import PROTOCOLS, frozen_protocols
from retinabench.regimes import Regime, is_balanced, train_sides, trained_on

FROZEN_PROTOCOLS = tuple(frozen_protocols())  # every `features` protocol of the registry


def _rows(split: pd.DataFrame, id_to_row: dict, part: str, balanced: bool):
    rows = regime_rows(split, part, balanced)
    missing = [i for i in rows["image_id"] if i not in id_to_row]
    if missing:
        raise KeyError(f"{len(missing)} images of the {part} split have no features, e.g. {missing[:3]}")
    return rows, np.fromiter((id_to_row[i] for i in rows["image_id"]), dtype=np.int64, count=len(rows))


def run_frozen(ids: pd.Index, feats: np.ndarray, split: pd.DataFrame, task: dict, encoder: str, *,
               protocols: list[str], seeds: list[int], regimes: list[str], cfg: Mapping[str, Any]
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``cfg``: the protocols' config sections by section name (a config, or the job's params), each typed by
    its settings model here."""
    PROTOCOLS.check(protocols, "features", "frozen protocols")
    specs = [PROTOCOLS.get(name) for name in protocols]
    settings = {spec.name: spec.settings(cfg) for spec in specs}
    classes = list(task["classes"])
    n_classes = len(classes)
    id_to_row = {image_id: i for i, image_id in enumerate(ids)}
    preds, logs = [], []
    train_regimes = train_sides(regimes)
    from retinabench.progress import Progress
    bar = Progress(len(train_regimes) * sum(1 if spec.deterministic else len(seeds) for spec in specs),
                   f"frozen probes {encoder}/{task['name']}", unit="fits")
    for train_regime in train_regimes:
        bal = is_balanced(train_regime)
        tr, tr_idx = _rows(split, id_to_row, "train", bal)
        va, va_idx = _rows(split, id_to_row, "val", bal)
        tests = {r: _rows(split, id_to_row, "test", Regime.parse(r).test_balanced)
                 for r in trained_on(regimes, train_regime)}
        xtr, ytr = feats[tr_idx], tr["y"].to_numpy()
        queries = [("val", va, va_idx)] + [(r, rows, idx) for r, (rows, idx) in tests.items()]
        for spec in specs:
            protocol = spec.name
            for seed in ([0] if spec.deterministic else seeds):
                model, log = spec.fit(xtr, ytr, feats[va_idx], va["y"].to_numpy(), n_classes, seed=seed,
                                      balanced=bal, settings=settings[protocol])
                probas = [spec.predict(model, feats[idx]) for _, _, idx in queries]
                if log is not None:
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

"""Cross-dataset transfer: a probe trained on one dataset's task, evaluated on every dataset of the same harmonised
task (same harmonised id and modality, retinabench.data.derived), including its own (in-distribution, ID).

Per (source task, protocol, seed, regime) the predictions hold the source's validation rows (``split=val``,
where thresholds and temperatures are fitted) and the test rows of every target (``split=test``, dataset/task =
the target's). Extra columns ``train_dataset`` / ``train_task`` name the source; OOD = train_dataset differs
from dataset. The probes are the frozen protocols' own (kNN, linear, logistic) on cached features, trained
exactly as retinabench.protocols.frozen trains them, so ID rows here match the frozen protocol's.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from retinabench.data.splits import regime_rows
from retinabench.protocols.common import predictions_frame
from retinabench.protocols.registry import PROTOCOLS
from retinabench.regimes import Regime, is_balanced, train_sides, trained_on


def _rows(split: pd.DataFrame, ids: pd.Index, part: str, balanced: bool, where: str):
    rows = regime_rows(split, part, balanced)
    pos = ids.get_indexer(rows["image_id"])
    if (pos < 0).any():
        missing = rows["image_id"][pos < 0].tolist()
        raise KeyError(f"transfer: {len(missing)} {part} images of {where} have no features, e.g. {missing[:3]}")
    return rows, pos


def run_transfer(tasks: list[dict], features: dict[str, tuple[pd.Index, np.ndarray]],
                 splits: dict[str, pd.DataFrame], encoder: str, *, protocols: list[str], seeds: list[int],
                 regimes: list[str], cfg: Mapping[str, Any]) -> pd.DataFrame:
    """Predictions (schema PREDICTIONS + train_dataset, train_task) of every source -> target pair of ``tasks``.

    ``features``: dataset -> (image ids, array); ``splits``: task name -> split table; ``cfg``: the protocols'
    config sections by section name (typed by their settings models here).
    """
    if len(tasks) < 2:
        raise ValueError(f"transfer needs at least two tasks of one harmonised group, got {[t['name'] for t in tasks]}")
    classes = list(tasks[0]["classes"])
    for t in tasks:
        if list(t["classes"]) != classes:
            raise ValueError(f"transfer: task {t['name']!r} has classes {t['classes']}, {tasks[0]['name']!r} has "
                             f"{classes}; tasks of one harmonised group must share classes")
        for key, table in (("features", features), ("splits", splits)):
            name = t["dataset"] if key == "features" else t["name"]
            if name not in table:
                raise KeyError(f"transfer: no {key} for {name!r} (task {t['name']!r})")
    PROTOCOLS.check(protocols, "features", "transfer protocols")
    settings = {name: PROTOCOLS.get(name).settings(cfg) for name in protocols}
    dims = {d: f.shape[1] for d, (_, f) in features.items()}
    if len(set(dims.values())) > 1:
        raise ValueError(f"transfer: feature dimensions differ between datasets {dims} (different encoders?)")
    n_classes = len(classes)
    out = []
    for src in tasks:
        ids, feats = features[src["dataset"]]
        for train_regime in train_sides(regimes):
            bal = is_balanced(train_regime)
            tr, tr_idx = _rows(splits[src["name"]], ids, "train", bal, src["name"])
            va, va_idx = _rows(splits[src["name"]], ids, "val", bal, src["name"])
            queries = [("val", src, va, feats[va_idx])]
            for r in trained_on(regimes, train_regime):
                for tgt in tasks:
                    tids, tfeats = features[tgt["dataset"]]
                    rows, idx = _rows(splits[tgt["name"]], tids, "test", Regime.parse(r).test_balanced,
                                      tgt["name"])
                    queries.append((r, tgt, rows, tfeats[idx]))
            xtr, ytr = feats[tr_idx], tr["y"].to_numpy()
            for spec in (PROTOCOLS.get(name) for name in protocols):
                protocol = spec.name
                for seed in ([0] if spec.deterministic else seeds):
                    model, _ = spec.fit(xtr, ytr, feats[va_idx], va["y"].to_numpy(), n_classes, seed=seed,
                                        balanced=bal, settings=settings[protocol])
                    probas = [spec.predict(model, q) for *_, q in queries]
                    val_proba = probas[0]
                    for (regime, tgt, rows, _), proba in zip(queries[1:], probas[1:]):
                        common: dict[str, Any] = dict(encoder=encoder, protocol=protocol, seed=seed, regime=regime)
                        # The source's validation rows are repeated under every regime of this training
                        # regime, as the frozen protocol does, so each regime's cell is self-contained.
                        if tgt is src:
                            out.append(predictions_frame(va["image_id"], va["y"], val_proba, classes,
                                                         dataset=src["dataset"], task=src["name"], split="val",
                                                         **common).assign(train_dataset=src["dataset"],
                                                                          train_task=src["name"]))
                        out.append(predictions_frame(rows["image_id"], rows["y"], proba, classes,
                                                     dataset=tgt["dataset"], task=tgt["name"], split="test",
                                                     **common).assign(train_dataset=src["dataset"],
                                                                      train_task=src["name"]))
    return pd.concat(out, ignore_index=True)

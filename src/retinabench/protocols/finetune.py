"""Full fine-tuning (``finetune``) and augmented linear probing (``linear_aug``) from the uint8 image cache.

Protocol (the paper's; every value comes from the config's ``finetune:`` section): the encoder plus one linear
head on its embedding (CLS token for ViTs, pooled output for CNNs, as the encoder entry's ``pooling`` says);
AdamW with two parameter groups (``lr_encoder``, ``lr_classifier``); linear warm-up over the first 10 % of steps
then cosine decay (``protocols.common.make_scheduler``); 25 optimisation steps = one bookkeeping epoch, 100
epochs, batch 64; class weights ``1/log(c+1)`` (normalised) in the unbalanced training regime, none in the
balanced one; the returned weights are those of the epoch with the lowest validation loss. ``linear_aug`` is
the same trainer with the encoder frozen (kept in eval mode, no gradients): the paper's exact linear probe,
beside the fast cached-feature probe ``linear``.

Engineering: device picked automatically (CUDA if present); on CUDA bf16 autocast and channels_last; optional
``torch.compile``. One run (:mod:`retinabench.protocols.finetune_train`: Trainer, fit) checkpoints and resumes
(:mod:`retinabench.protocols.finetune_checkpoints`, also the kept weights the saliency maps load); this module is
the job: every training regime of one (protocol, encoder, task, seed), its predictions, and
:func:`load_finetuned`.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from retinabench.data.image_dataset import CachedImageDataset, SequentialBatchSampler
from retinabench.data.splits import regime_rows
from retinabench.protocols.common import class_weights, predictions_frame
from retinabench.protocols.finetune_checkpoints import (CheckpointError, DivergedError, entry_digest, module_digest,
                                                        read_weights, save_weights)
from retinabench.protocols.finetune_train import Classifier, Trainer, _loader, fit, peak_memory_mb
from retinabench.regimes import Regime, is_balanced, parse_regimes, train_sides, trained_on
from retinabench.settings.base import FINETUNE_PROTOCOLS
from retinabench.settings.finetune import TrainConfig

__all__ = ["CheckpointError", "Classifier", "DivergedError", "FinetuneOutput", "TrainConfig", "Trainer",
           "load_finetuned", "peak_memory_mb", "run_finetune", "save_weights"]


def load_finetuned(path: str | os.PathLike, encoder_entry: dict, task: dict, *, protocol: str,
                   train_regime: str = "u"):
    """Rebuild the classifier a fine-tuning job trained: ``(model, encoder, record)``.

    The encoder is built from its registry entry through the verified loaders (pretrained sha256, strict keys),
    then the trained state is loaded strictly: the whole model for ``finetune``, the head for ``linear_aug``,
    whose rebuilt frozen encoder must hash to the one it was trained on. The model is a non-frozen
    :class:`Classifier` in eval mode, so gradients reach the input (saliency); ``record`` holds the file's sha256,
    best epoch and validation loss. Any mismatch (protocol, encoder, registry entry, task, classes) is an error.
    """
    from retinabench.models.encoder import build_encoder
    record = read_weights(path)
    want = {"protocol": protocol, "encoder": encoder_entry["name"], "task": task["name"],
            "classes": list(task["classes"]), "entry_digest": entry_digest(encoder_entry)}
    wrong = {k: (record.get(k), v) for k, v in want.items() if record.get(k) != v}
    if wrong:
        raise CheckpointError(f"weights file {path} does not belong to this run: " + "; ".join(
            f"{k} is {got!r}, expected {exp!r}" for k, (got, exp) in wrong.items()))
    regimes = record["regimes"]
    if train_regime not in regimes:
        raise CheckpointError(f"weights file {path} has no training regime {train_regime!r} (it has "
                              f"{sorted(regimes)})")
    encoder = build_encoder(encoder_entry, seed=int(record["seed"]))  # a random-init encoder: the run's own init
    if protocol == "linear_aug" and module_digest(encoder.module) != record["frozen_encoder_sha256"]:
        raise CheckpointError(f"weights file {path}: the encoder {encoder_entry['name']!r} built now differs from "
                              "the frozen encoder its head was trained on (weights or loader changed)")
    model = Classifier(encoder.module, encoder.embed_dim, len(task["classes"]), frozen=False)
    state = regimes[train_regime]["state"]
    target = model.head if protocol == "linear_aug" else model
    try:
        target.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"weights file {path}: {err}") from err
    model.eval()
    info = {"path": str(path), "sha256": record["sha256"], "train_regime": train_regime, "seed": record["seed"],
            "best_epoch": regimes[train_regime]["best_epoch"],
            "best_val_loss": regimes[train_regime]["best_val_loss"], "encoder_weights": record["encoder_weights"]}
    return model, encoder, info


# -- one (encoder, task, protocol, seed) job: every training regime ------------------------------------------

def _rows(split: pd.DataFrame, id_to_row: dict, part: str, balanced: bool) -> tuple[pd.DataFrame, np.ndarray]:
    rows = regime_rows(split, part, balanced)
    missing = [i for i in rows["image_id"] if i not in id_to_row]
    if missing:
        raise KeyError(f"{len(missing)} images of the {part} split are not in the image cache, e.g. {missing[:3]}")
    return rows, np.fromiter((id_to_row[i] for i in rows["image_id"]), dtype=np.int64, count=len(rows))


def run_fingerprint(**parts) -> str:
    from retinabench.hashing import package_code_hash
    parts["code"] = package_code_hash("protocols", "data/image_dataset.py", "models")
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _ids_hash(ids) -> str:
    return hashlib.sha256("\n".join(map(str, ids)).encode()).hexdigest()[:16]


@dataclass
class FinetuneOutput:
    predictions: pd.DataFrame
    log: pd.DataFrame
    compute: pd.DataFrame
    weights: dict = field(default_factory=dict)  # with keep_weights: what save_weights stores


def run_finetune(array_path: str | os.PathLike, index: pd.DataFrame, split: pd.DataFrame, task: dict,
                 encoder_entry: dict, *, protocol: str, seed: int, regimes: list[str], cfg: TrainConfig,
                 ckpt_dir: str | os.PathLike | None = None, threads: int = 1, encoder=None,
                 on_epoch_end: Callable[[str, int], None] | None = None,
                 log: Callable[[str], None] = print, keep_weights: bool = False) -> FinetuneOutput:
    """Train ``protocol`` with ``seed`` once per training regime of ``regimes``; predict val and test sets.

    Regime ``a-b`` as for the frozen protocols: ``a`` = training (and validation) data, u: all / b: the balanced
    rows; ``b`` = test data. ``encoder``: an already built Encoder (else built from ``encoder_entry``; a random-init entry's weights from
    ``seed``, so each seed starts from its own initialisation).
    ``keep_weights``: also return each training regime's best weights (``FinetuneOutput.weights``, for
    :func:`save_weights`).
    """
    from retinabench.models.encoder import build_encoder
    if protocol not in FINETUNE_PROTOCOLS:
        raise ValueError(f"unknown fine-tuning protocol {protocol!r}; expected one of {FINETUNE_PROTOCOLS}")
    parse_regimes(regimes, "fine-tuning regimes")
    encoder = encoder or build_encoder(encoder_entry, seed=seed)  # random init: one per seed
    classes, n_classes = list(task["classes"]), len(task["classes"])
    id_to_row = dict(zip(index["image_id"], index["row"].astype(np.int64)))
    st = Path(array_path).stat()  # a rebuilt cache (same name and size, new content) gets a new mtime
    cache_id = {"array": Path(array_path).name, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    preds, logs, computes, kept = [], [], [], {}
    for train_regime in train_sides(regimes):
        bal = is_balanced(train_regime)
        tr, tr_idx = _rows(split, id_to_row, "train", bal)
        va, va_idx = _rows(split, id_to_row, "val", bal)
        weight = None if bal else class_weights(tr["y"].to_numpy(), n_classes)
        trainer = Trainer(encoder, n_classes, protocol=protocol, seed=seed, cfg=cfg, class_weight=weight)
        fp = run_fingerprint(protocol=protocol, seed=seed, train_regime=train_regime, cfg=cfg.result_fields(),
                             encoder={k: v for k, v in encoder_entry.items() if k != "notes"},
                             classes=classes, train=_ids_hash(tr["image_id"]), val=_ids_hash(va["image_id"]),
                             cache=cache_id, device=trainer.device.type, precision=trainer.precision)
        train_ds = CachedImageDataset(array_path, tr_idx, tr["y"].to_numpy(), trainer.loader_transform())
        val_ds = CachedImageDataset(array_path, va_idx, va["y"].to_numpy())
        hook = None if on_epoch_end is None else (lambda epoch, r=train_regime: on_epoch_end(r, epoch))
        res = fit(trainer, train_ds, val_ds, ckpt_dir=Path(ckpt_dir) / train_regime if ckpt_dir else None,
                  fingerprint=fp, threads=threads, on_epoch_end=hook, log=log)
        workers, pin = res.compute["num_workers"], trainer.device.type == "cuda"
        if keep_weights:
            kept[train_regime] = {"state": trainer.trainable_state(), "best_epoch": res.best_epoch,
                                  "best_val_loss": res.best_val_loss}

        def proba(rows_idx, labels):
            ds = CachedImageDataset(array_path, rows_idx, labels)
            logits, _ = trainer.logits(_loader(ds, SequentialBatchSampler(len(ds), cfg.eval_batch_size),  # noqa: B023 (called within the iteration)
                                               num_workers=workers, pin=pin, seed=seed))  # noqa: B023 (called within the iteration)
            return torch.softmax(logits.double(), dim=1).numpy()

        proba_val = proba(va_idx, va["y"].to_numpy())
        # One pass over the test images a regime needs: the balanced test rows are a subset of all test rows.
        test_regimes = trained_on(regimes, train_regime)
        need_all = any(not Regime.parse(r).test_balanced for r in test_regimes)
        te_all, te_idx = _rows(split, id_to_row, "test", not need_all)
        proba_te = proba(te_idx, te_all["y"].to_numpy())
        for regime in test_regimes:
            subset = need_all and Regime.parse(regime).test_balanced
            mask = te_all["balanced"].to_numpy() if subset else np.ones(len(te_all), bool)
            common = dict(dataset=task["dataset"], task=task["name"], encoder=encoder_entry["name"],
                          protocol=protocol, seed=seed, regime=regime)
            preds.append(predictions_frame(va["image_id"], va["y"], proba_val, classes, split="val", **common))
            preds.append(predictions_frame(te_all["image_id"][mask], te_all["y"][mask], proba_te[mask], classes,
                                           split="test", **common))
        logs.append(pd.DataFrame(res.log).assign(encoder=encoder_entry["name"], task=task["name"], protocol=protocol,
                                                 seed=seed, train_regime=train_regime))
        computes.append({"encoder": encoder_entry["name"], "task": task["name"], "protocol": protocol, "seed": seed,
                         "train_regime": train_regime, "n_train": len(tr), "n_val": len(va), **res.compute})
    weights = {}
    if keep_weights:
        weights = {"regimes": kept, "embed_dim": encoder.embed_dim, "encoder_weights": dict(encoder.weights),
                   "frozen_encoder_sha256": module_digest(encoder.module) if protocol == "linear_aug" else None}
    return FinetuneOutput(pd.concat(preds, ignore_index=True), pd.concat(logs, ignore_index=True),
                          pd.DataFrame(computes), weights)

"""Saliency maps of one (encoder, task): the trained models of each fine-tuning protocol on the same test images.

* Images: ``images_per_class`` test images of every class, the same for every encoder and protocol (a seeded hash
  order of the image ids within each class, :func:`select_images`), so a figure's rows are comparable.
* Models: the best-validation weights a fine-tuning job kept (``protocols.finetune.load_finetuned``: verified
  sha256, registry entry, task, classes and, for ``linear_aug``, the frozen encoder), training regime
  ``train_regime`` of seed ``checkpoint_seed``.
* Attribution: integrated gradients in NoiseTunnel for the model's predicted class (:mod:`.attribution`), then
  grayscale -> CLAHE (:mod:`.postprocess`).

Outputs: a table (one row per protocol × image: prediction, weights sha256, settings, IG completeness error) and an
``.npz`` of arrays (input images, raw attributions, scaled grayscale maps, CLAHE maps).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from retinabench.settings.layers import SaliencySettings

SALIENCY_COLUMNS = ["encoder", "task", "protocol", "class_index", "class", "image_id", "y_true", "y_pred",
                    "predicted", "p_predicted", "correct", "map_protocol", "map_image", "weights", "weights_sha256",
                    "checkpoint_seed", "train_regime", "best_epoch", "nt_type", "nt_samples", "stdev", "n_steps",
                    "baseline", "noise_seed", "ig_delta", "attribution_l1"]
MAP_KEYS = ("image", "attribution", "gray", "clahe", "protocols", "image_ids")


def select_images(split: pd.DataFrame, classes: list[str], *, seed: int, per_class: int,
                  part: str = "test") -> tuple[pd.DataFrame, list[str]]:
    """The ``per_class`` images of each class in the ``part`` split that come first in the order of
    sha256(f"{seed}:{image_id}") — deterministic, independent of row order and of any model. Returns the rows
    (``class_index, class, image_id, y_true``) and the classes without any image in that split."""
    rows = split[split["split"] == part]
    picked, missing = [], []
    for c, name in enumerate(classes):
        ids = rows.loc[rows["y"] == c, "image_id"].astype(str).unique()
        if len(ids) == 0:
            missing.append(name)
            continue
        order = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
        picked += [{"class_index": c, "class": name, "image_id": i, "y_true": c} for i in order[:per_class]]
    return pd.DataFrame(picked, columns=["class_index", "class", "image_id", "y_true"]), missing


def run_saliency(array_path: str | os.PathLike, index: pd.DataFrame, split: pd.DataFrame, task: dict,
                 encoder_entry: dict, weights: dict[str, str], settings: SaliencySettings, *,
                 log: Callable[[str], None] = print) -> tuple[pd.DataFrame, dict, list[str]]:
    """Attributions of each protocol's trained model (``weights``: protocol -> weights file) on the selected test
    images, under the ``saliency:`` settings. Returns (table, arrays for :func:`write_maps`, classes without a
    test image)."""
    import torch
    from retinabench.features.extract import pick_device
    from retinabench.protocols.finetune import load_finetuned
    from retinabench.saliency.attribution import (CacheInput, baseline_tensor, integrated_gradients_nt, normalise,
                                                  predict)
    from retinabench.saliency.postprocess import postprocess
    classes = list(task["classes"])
    s = settings
    sel, missing = select_images(split, classes, seed=s.selection_seed, per_class=s.images_per_class)
    for name in missing:
        log(f"saliency {encoder_entry['name']} / {task['name']}: class {name!r} has no test image; its column "
            "stays empty")
    if sel.empty:
        raise ValueError(f"task {task['name']}: no test image in any class; nothing to attribute")
    id_to_row = dict(zip(index["image_id"].astype(str), index["row"].astype(np.int64)))
    absent = [i for i in sel["image_id"] if i not in id_to_row]
    if absent:
        raise KeyError(f"{len(absent)} selected test images are not in the image cache {array_path}: {absent[:3]}")
    cache = np.load(array_path, mmap_mode="r")
    images = np.stack([np.array(cache[id_to_row[i]]) for i in sel["image_id"]])
    dev = pick_device(s.device)
    protocols = list(weights)
    shape = images.shape[1:3]
    attr = np.zeros((len(protocols), len(sel), 3, *shape), np.float32)
    gray = np.zeros((len(protocols), len(sel), *shape), np.float32)
    clahe_maps = np.zeros_like(gray)
    rows = []
    for p, protocol in enumerate(protocols):
        model, encoder, info = load_finetuned(weights[protocol], encoder_entry, task, protocol=protocol,
                                              train_regime=s.train_regime)
        net = CacheInput(model, encoder.input_size).to(dev).eval()
        for k, r in enumerate(sel.to_dict("records")):
            x = normalise(images[k], encoder.mean, encoder.std, dev)
            proba = predict(net, x)
            target = int(np.argmax(proba))
            a, delta = integrated_gradients_nt(
                net, x, target, nt_samples=s.nt_samples, stdev=s.stdev, n_steps=s.n_steps, nt_type=s.nt_type,
                nt_samples_batch_size=s.nt_samples_batch_size, internal_batch_size=s.internal_batch_size,
                baseline=baseline_tensor(s.baseline, x, encoder.mean, encoder.std), seed=s.noise_seed)
            attr[p, k] = a
            gray[p, k], clahe_maps[p, k] = postprocess(a, s)
            rows.append({"encoder": encoder_entry["name"], "task": task["name"], "protocol": protocol,
                         "class_index": r["class_index"], "class": r["class"], "image_id": r["image_id"],
                         "y_true": r["y_true"],
                         "y_pred": target, "predicted": classes[target], "p_predicted": float(proba[target]),
                         "correct": target == r["y_true"], "map_protocol": p, "map_image": k,
                         "weights": str(weights[protocol]), "weights_sha256": info["sha256"],
                         "checkpoint_seed": int(info["seed"]), "train_regime": info["train_regime"],
                         "best_epoch": int(info["best_epoch"]), "nt_type": s.nt_type,
                         "nt_samples": s.nt_samples, "stdev": s.stdev, "n_steps": s.n_steps,
                         "baseline": s.baseline, "noise_seed": s.noise_seed, "ig_delta": delta,
                         "attribution_l1": float(np.abs(a).sum())})
            log(f"{protocol} {r['image_id']} (class {r['class']}): predicted {classes[target]} ({proba[target]:.2f}), "
                f"IG completeness error {delta:.3g}")
        del net, model, encoder
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    maps = {"image": images, "attribution": attr, "gray": gray, "clahe": clahe_maps,
            "protocols": np.array(protocols), "image_ids": sel["image_id"].to_numpy().astype(str)}
    return pd.DataFrame(rows, columns=SALIENCY_COLUMNS), maps, missing


def write_maps(path: str | os.PathLike, maps: dict) -> str:
    """Atomic compressed ``.npz`` of the arrays (keys :data:`MAP_KEYS`)."""
    missing = [k for k in MAP_KEYS if k not in maps]
    if missing:
        raise KeyError(f"saliency maps lack {missing}")
    from retinabench.atomic import atomic_path
    p = Path(path)
    with atomic_path(p) as tmp, open(tmp, "wb") as fh:  # a file object: numpy appends no second .npz
        np.savez_compressed(fh, **{k: maps[k] for k in MAP_KEYS})
    return str(p)


def read_maps(path: str | os.PathLike) -> dict:
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in MAP_KEYS if k not in z.files]
        if missing:
            raise KeyError(f"{path}: not a saliency maps file (missing {missing})")
        maps = {k: z[k] for k in MAP_KEYS}
    p, k = len(maps["protocols"]), len(maps["image_ids"])
    if maps["clahe"].shape[:2] != (p, k) or maps["image"].shape[0] != k:
        raise ValueError(f"{path}: inconsistent shapes {({n: maps[n].shape for n in MAP_KEYS})}")
    return maps

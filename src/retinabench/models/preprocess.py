"""An entry's input pipeline (normalisation statistics, input size) and the check of the model's own pipeline files
(a transformers processor config, a timm pretrained config) against it: against the registry's input size (the
checkpoint's own), also when the run feeds another side (config ``input_size``,
:mod:`retinabench.registry.input_size`)."""
from __future__ import annotations

import json
from pathlib import Path

from retinabench.models.strict import WeightsError
from retinabench.registry.input_size import native_input_size

NORMALIZATIONS = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}


def resolve_normalization(entry: dict) -> tuple[tuple, tuple]:
    norm = entry["normalization"]
    if isinstance(norm, str):
        return NORMALIZATIONS[norm]
    return tuple(norm["mean"]), tuple(norm["std"])


def _close(a, b, tol=1e-4) -> bool:
    return len(a) == len(b) and all(abs(float(x) - float(y)) <= tol for x, y in zip(a, b))


def check_pipeline_files(entry: dict, files: dict[str, Path]) -> list[str]:
    """Compare the model's own pipeline files (HF processor, timm pretrained config) with the entry's
    normalisation and input size; returns what was checked, raises on a disagreement."""
    mean, std = resolve_normalization(entry)
    checked = []
    what = f"encoder {entry['name']!r}"
    for fname in ("preprocessor_config.json", entry.get("pipeline_config")):
        if not fname or fname not in files:
            continue
        cfg = json.loads(files[fname].read_text())
        cfg = cfg.get("pretrained_cfg", cfg)
        m, s = cfg.get("image_mean", cfg.get("mean")), cfg.get("image_std", cfg.get("std"))
        if m is not None and (not _close(m, mean) or not _close(s, std)):
            raise WeightsError(f"{what}: {fname} normalises with mean {m} std {s}; the entry says mean {list(mean)} "
                               f"std {list(std)}")
        if fname == entry.get("pipeline_config"):
            top = json.loads(files[fname].read_text())
            if top.get("architecture") and top["architecture"].split(".")[0] != entry["architecture"]:
                raise WeightsError(f"{what}: {fname} describes {top['architecture']}; the entry builds "
                                   f"{entry['architecture']}")
            declared = entry.get("model_kwargs") or {}
            clash = [(k, declared[k], v) for k, v in (top.get("model_args") or {}).items()
                     if k in declared and isinstance(v, (int, float, bool, str)) and not (
                         v == declared[k] or (isinstance(v, float) and abs(v - float(declared[k])) < 1e-6))]
            if clash:
                raise WeightsError(f"{what}: {fname} model_args disagree with the entry's model_kwargs (key, entry, "
                                   f"file): {clash}")
        if fname == "preprocessor_config.json":
            size = cfg.get("crop_size") or cfg.get("size") or {}
            side = size.get("height", size.get("shortest_edge")) if isinstance(size, dict) else size
            native = native_input_size(entry)  # the checkpoint's pipeline, whatever side the run feeds
            if side is not None and int(side) != native and not entry.get("input_size_differs"):
                raise WeightsError(f"{what}: {fname} feeds {side}px images; the entry's input_size is {native}")
        checked.append(fname)
    return checked

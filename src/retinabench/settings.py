"""Every configurable section's defaults and its merge-and-validate function, in one torch-free module.

The Snakefile (through the planner, retinabench.pipeline.plan), the stages and the domain code all read a
section through these functions, so a default is written once. config/config.yaml documents the same values;
tests/test_settings.py pins that the two agree.
"""
from __future__ import annotations

import copy
import math
from typing import Any

# Settings of the generated phantom dataset (config `phantom:`, overridden per dataset by its registry `options`).
PHANTOM_DEFAULTS: dict[str, Any] = {"n_patients": 80, "seed": 0, "image_size": 256}

# `images:` (the manifest job's decode pass, retinabench.data.image_checks): a raw image whose short side is under
# min_side pixels is excluded with its reason (a 1x1 placeholder or thumbnail is no sample).
IMAGES_DEFAULTS: dict[str, Any] = {"min_side": 32}


def images_settings(config: dict) -> dict:
    """The config's ``images:`` section over the defaults; unknown keys are an error."""
    given = dict(config.get("images") or {})
    unknown = sorted(set(given) - set(IMAGES_DEFAULTS))
    if unknown:
        raise KeyError(f"images: unknown key(s) {unknown}; known: {sorted(IMAGES_DEFAULTS)}")
    out = {**IMAGES_DEFAULTS, **given}
    if isinstance(out["min_side"], bool) or not isinstance(out["min_side"], int) or out["min_side"] < 1:
        raise ValueError(f"images.min_side must be a positive number of pixels, got {out['min_side']!r}")
    return out


AUGMENT_DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "scale": [0.8, 1.2],       # crop area as a fraction of the image area
    "rotation": 5.0,           # degrees, uniform in [-rotation, +rotation]
    "hflip": 0.5,              # probabilities
    "vflip": 0.5,
    "brightness": 0.2,         # factor uniform in [1 - b, 1 + b] (v2.ColorJitter semantics)
    "contrast": 0.2,
    "saturation": 0.1,
    "hue": 0.1,                # shift uniform in [-h, h]
    "where": "auto",           # auto (on the device on CUDA, in the loader on CPU) | loader | device
}

def augment_settings(given: dict | None) -> dict:
    given = dict(given or {})
    unknown = sorted(set(given) - set(AUGMENT_DEFAULTS))
    if unknown:
        raise KeyError(f"finetune.augment: unknown key(s) {unknown}; known: {sorted(AUGMENT_DEFAULTS)}")
    out = {**AUGMENT_DEFAULTS, **given}
    lo, hi = (float(v) for v in out["scale"])
    if not 0 < lo <= hi:
        raise ValueError(f"finetune.augment.scale must be 0 < min <= max, got {out['scale']}")
    if not 0 <= out["hue"] <= 0.5:
        raise ValueError(f"finetune.augment.hue must be in [0, 0.5], got {out['hue']}")
    if out["where"] not in ("auto", "loader", "device"):
        raise ValueError(f"finetune.augment.where must be auto, loader or device, got {out['where']!r}")
    return out


FINETUNE_PROTOCOLS = ("finetune", "linear_aug")

# Defaults of the config's `finetune:` section (config/config.yaml documents the same values).
FINETUNE_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "protocols": list(FINETUNE_PROTOCOLS),
    "encoders": None,            # null: the config's encoders
    "tasks": None,               # null: the config's tasks
    "seeds": None,               # null: the config's seeds
    "regimes": None,             # null: the config's regimes
    "epochs": 100,
    "steps_per_epoch": 25,
    "batch_size": 64,
    "eval_batch_size": 128,
    "lr_encoder": 1.0e-5,        # used only when the sweep is disabled (otherwise the sweep's choice)
    "lr_classifier": 1.0e-3,
    "weight_decay": 1.0e-4,      # as the cached linear probe, so linear vs linear_aug differ only by caching
    "warmup_frac": 0.1,
    "checkpoint_every": 10,      # epochs
    "keep_checkpoints": False,   # delete a job's checkpoints once its outputs are written
    "device": "auto",            # auto | cpu | cuda | cuda:N
    "precision": "auto",         # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
    "channels_last": "auto",     # auto (on CUDA) | true | false
    "compile": False,            # torch.compile the model
    "num_workers": "auto",       # auto: the rule's threads - 1 on CUDA, 0 on CPU (compute owns the cores there)
    "threads": 4,                # the fine-tuning rules' `threads:` (capped by --cores)
    "augment": copy.deepcopy(AUGMENT_DEFAULTS),
}


def finetune_settings(config: dict) -> dict:
    """The config's ``finetune:`` section over the defaults; unknown keys are an error."""
    given = copy.deepcopy(config.get("finetune") or {})
    unknown = sorted(set(given) - set(FINETUNE_DEFAULTS))
    if unknown:
        raise KeyError(f"finetune: unknown key(s) {unknown}; known: {sorted(FINETUNE_DEFAULTS)}")
    out = {**copy.deepcopy(FINETUNE_DEFAULTS), **given}
    out["augment"] = augment_settings(given.get("augment"))
    bad = sorted(set(out["protocols"]) - set(FINETUNE_PROTOCOLS))
    if bad:
        hint = " (LoRA SFT of MLLMs is its own stage: config `lora:`)" if any("lora" in b for b in bad) else ""
        raise ValueError(f"finetune.protocols: unknown {bad}; expected a subset of {list(FINETUNE_PROTOCOLS)}{hint}")
    return out


# stage -> (protocol, the learning rate it sweeps)
SWEEP_STAGES = {1: ("linear_aug", "lr_classifier"), 2: ("finetune", "lr_encoder")}

# Defaults of the config's `sweep:` section (config/config.yaml documents the same values).
SWEEP_DEFAULTS: dict[str, Any] = {
    "enabled": True,             # false: fine-tuning jobs use finetune.lr_encoder / lr_classifier
    "task": None,                # null: the first fine-tuned task
    "sensitivity_task": "auto",  # auto: the second fine-tuned task, if any; null: no sensitivity sweep
    "lr_classifier": [1.0e-4, 1.0e-3, 1.0e-2],
    "lr_encoder": [1.0e-7, 1.0e-6, 1.0e-5, 1.0e-4, 1.0e-3],
    "seeds": [0],
    "regimes": ["u-u"],
    "epochs": None,              # null: finetune.epochs
    "steps_per_epoch": None,     # null: finetune.steps_per_epoch
    "encoders": {},              # per-encoder grids: {name: {lr_classifier: [...], lr_encoder: [...]}}
}


def sweep_settings(config: dict) -> dict:
    given = copy.deepcopy(config.get("sweep") or {})
    unknown = sorted(set(given) - set(SWEEP_DEFAULTS))
    if unknown:
        raise KeyError(f"sweep: unknown key(s) {unknown}; known: {sorted(SWEEP_DEFAULTS)}")
    out = {**copy.deepcopy(SWEEP_DEFAULTS), **given}
    for name, grids in (out["encoders"] or {}).items():
        bad = sorted(set(grids) - {"lr_classifier", "lr_encoder"})
        if bad:
            raise KeyError(f"sweep.encoders.{name}: unknown key(s) {bad}; known: lr_classifier, lr_encoder")
    return out


def sweep_tasks(settings: dict, finetune_tasks: list[str]) -> tuple[str, str | None]:
    """(sweep task, sensitivity task or None) for the fine-tuned tasks ``finetune_tasks``."""
    task = settings["task"] or (finetune_tasks[0] if finetune_tasks else None)
    if task is None:
        raise ValueError("sweep: no task to sweep on (set sweep.task)")
    sens = settings["sensitivity_task"]
    if sens == "auto":
        sens = next((t for t in finetune_tasks if t != task), None)
    if sens == task:
        raise ValueError(f"sweep.sensitivity_task must differ from sweep.task ({task!r})")
    return task, sens


def encoder_grid(settings: dict, encoder: str) -> dict[str, list[float]]:
    """The learning-rate grids of ``encoder``: the sweep's, overridden by ``sweep.encoders.<encoder>``."""
    own = (settings.get("encoders") or {}).get(encoder, {})
    grid = {k: sorted(float(v) for v in own.get(k, settings[k])) for k in ("lr_classifier", "lr_encoder")}
    for k, v in grid.items():
        if not v or any(not (x > 0 and math.isfinite(x)) for x in v) or len(set(v)) != len(v):
            raise ValueError(f"sweep grid {k} of encoder {encoder!r} must be distinct positive numbers, got {v}")
    return grid


# Defaults of the config's `analysis:` section (config/config.yaml documents the same values).
ANALYSIS_DEFAULTS: dict[str, Any] = {
    "alpha": 0.05,
    "split": "test",
    "alternative_metrics": ["balanced_accuracy", "auroc"],
    "protocol": None,
    "fallback_protocol": "linear",
    "subsets": {"modality": ["cfp", "oct"], "family": ["dr_staging", "glaucoma"]},
    "top_k": 8,
    "finetune_protocol": "finetune",
    "linear_protocol": "linear_aug",
    "subgroup_metrics": None,
    "subgroup_pairs": {"age": ["<60", ">=60"], "sex": ["female", "male"]},
    "lr_sweep_metrics": None,
    "lr_reference": None,
}

def analysis_settings(config: dict) -> dict:
    """The `analysis:` section merged over the defaults; unknown keys are an error."""
    given = config.get("analysis") or {}
    unknown = sorted(set(given) - set(ANALYSIS_DEFAULTS))
    if unknown:
        raise KeyError(f"analysis: unknown key(s) {unknown}; known: {sorted(ANALYSIS_DEFAULTS)}")
    return {**copy.deepcopy(ANALYSIS_DEFAULTS), **copy.deepcopy(given)}


# Defaults of the config's `reliability:` section (config/config.yaml documents the same values).
RELIABILITY_DEFAULTS: dict[str, Any] = {
    "n_bins": 10,
    "threshold_rule": "youden",            # youden | f1: the validation-chosen threshold (binary tasks)
    "bootstrap": {"n_boot": 1000, "seed": 0, "level": 0.95, "unit": "patient"},  # unit: patient | image
    "min_group_size": 10,
    "min_quality_group_size": 5,
    "attributes": [
        {"name": "age_median", "column": "age", "cut": "median"},
        {"name": "age", "column": "age", "cut": 60},
        {"name": "sex", "column": "sex", "groups": ["female", "male"]},
    ],
    "quality": [{"name": "quality", "column": "quality", "groups": ["good", "poor"]}],
    "fairness_score_attributes": ["age_median", "sex"],
    "harmonised": {},
    "transfer": {"protocols": ["linear", "logreg"], "seeds": [0], "regimes": ["u-u"]},
    "paired": {"sources": ["frozen", "transfer"], "protocols": None, "regime": "u-u",
               "metrics": ["auroc", "auprc", "accuracy", "f1", "ece"], "pairs": [], "domain": ["modality", "shift"]},
    "figures": {"source": "frozen", "protocol": None, "regime": "u-u", "seed": 0, "threshold": "y_pred",
                "metric": "accuracy"},
}

# Bootstrap resampling unit: `patient` (default; a patient's images are drawn together, so correlated eyes and repeat
# images do not shrink the intervals) or `image` (FOCUS's image-level resampling, for reproducing it).
BOOTSTRAP_UNITS = ("patient", "image")

def reliability_settings(config: dict) -> dict:
    """The `reliability:` section merged over the defaults (nested dicts one level deep); unknown keys fail."""
    given = copy.deepcopy(config.get("reliability") or {})
    out = copy.deepcopy(RELIABILITY_DEFAULTS)
    unknown = sorted(set(given) - set(out))
    if unknown:
        raise KeyError(f"reliability: unknown key(s) {unknown}; known: {sorted(out)}")
    for key, value in given.items():
        if isinstance(out[key], dict) and key != "harmonised":
            bad = sorted(set(value or {}) - set(out[key]))
            if bad:
                raise KeyError(f"reliability.{key}: unknown key(s) {bad}; known: {sorted(out[key])}")
            out[key].update(value or {})
        else:
            out[key] = value
    if out["threshold_rule"] not in ("youden", "f1"):
        raise ValueError(f"reliability.threshold_rule must be youden or f1, got {out['threshold_rule']!r}")
    if out["bootstrap"]["n_boot"] < 1000:
        raise ValueError(f"reliability.bootstrap.n_boot must be >= 1000, got {out['bootstrap']['n_boot']}")
    if out["bootstrap"]["unit"] not in BOOTSTRAP_UNITS:
        raise ValueError(f"reliability.bootstrap.unit must be patient or image, got {out['bootstrap']['unit']!r}")
    domains = out["paired"]["domain"]
    out["paired"]["domain"] = [domains] if isinstance(domains, str) else list(domains)
    for h, entry in out["harmonised"].items():
        bad = sorted(set(entry or {}) - {"definition", "not_supported"})
        if bad:
            raise KeyError(f"reliability.harmonised.{h}: unknown key(s) {bad}; known: definition, not_supported")
    return out




# `saliency:` (retinabench.saliency): integrated gradients in a NoiseTunnel, then grayscale + CLAHE.
SALIENCY_BASELINES = ("zeros", "black")
SALIENCY_NT_TYPES = ("smoothgrad", "smoothgrad_sq", "vargrad")
SALIENCY_SIGNS = ("absolute_value", "positive")
SALIENCY_DEFAULTS: dict = {
    "enabled": False,
    "encoders": None,             # null: fine-tuning's encoders
    "tasks": None,                # null: fine-tuning's tasks
    "protocols": None,            # null: fine-tuning's protocols (finetune, linear_aug)
    "checkpoint_seed": None,      # null: the first fine-tuning seed
    "train_regime": "u",          # u: trained on all training images; b: on the class-balanced undersample
    "images_per_class": 1,
    "selection_seed": 0,
    "nt_type": "smoothgrad",
    "nt_samples": 50,
    "stdev": 0.3,                 # Gaussian noise sd, in normalised input units
    "n_steps": 50,                # integrated-gradients points (Captum's default)
    "baseline": "zeros",          # zeros (normalised; Captum's default) | black
    "nt_samples_batch_size": 1,   # noisy copies per IG call (memory)
    "internal_batch_size": 50,    # IG points per forward pass (memory)
    "noise_seed": 0,
    "sign": "absolute_value",     # grayscale: |sum over channels| | positive
    "clip_percentile": 99.0,
    "clahe": {"clip_limit": 0.01, "kernel_size": None, "nbins": 256},
    "colormap": "inferno",
    "device": "auto",
    "threads": 4,
}
# Keys that select jobs or only change the figure: not part of a saliency job's result.
SALIENCY_NOT_RESULT = ("enabled", "encoders", "tasks", "protocols", "checkpoint_seed", "colormap", "threads")


def saliency_settings(config: dict) -> dict:
    """The config's ``saliency:`` section over the defaults; unknown keys and values are errors."""
    given = copy.deepcopy(config.get("saliency") or {})
    unknown = sorted(set(given) - set(SALIENCY_DEFAULTS))
    if unknown:
        raise KeyError(f"saliency: unknown key(s) {unknown}; known: {sorted(SALIENCY_DEFAULTS)}")
    clahe = {**SALIENCY_DEFAULTS["clahe"], **(given.pop("clahe", None) or {})}
    bad = sorted(set(clahe) - set(SALIENCY_DEFAULTS["clahe"]))
    if bad:
        raise KeyError(f"saliency.clahe: unknown key(s) {bad}; known: {sorted(SALIENCY_DEFAULTS['clahe'])}")
    out = {**copy.deepcopy(SALIENCY_DEFAULTS), **given, "clahe": clahe}
    for key, allowed in (("nt_type", SALIENCY_NT_TYPES), ("baseline", SALIENCY_BASELINES), ("sign", SALIENCY_SIGNS),
                         ("train_regime", ("u", "b"))):
        if out[key] not in allowed:
            raise ValueError(f"saliency.{key} must be one of {list(allowed)}, got {out[key]!r}")
    return out



# `compute:` (retinabench.compute): the per-encoder compute benchmark.
COMPUTE_DEFAULTS: dict = {
    "enabled": False,
    "encoders": None,             # null: the config's encoders
    "task": None,                 # images of this task's split; null: the config's first task
    "device": "auto",             # auto: CUDA if present
    "precision": "auto",          # auto: bf16 autocast on CUDA, fp32 on CPU | bf16 | fp32
    "threads": 4,                 # the jobs' threads (CPU compute threads; on CUDA the host side)
    "inference": {"batch_size": 1, "warmup": 10, "images": None},     # images null: the whole test split
    "training": {"batch_size": 64, "warmup": 3, "steps": 25, "protocols": ["finetune", "linear_aug"],
                 "distinct_batches": 4},
}
# Keys that only select jobs: not part of a benchmark job's result.
COMPUTE_NOT_RESULT = ("enabled", "encoders")


def compute_settings(config: dict) -> dict:
    """The config's ``compute:`` section over the defaults; unknown keys are an error."""
    given = copy.deepcopy(config.get("compute") or {})
    unknown = sorted(set(given) - set(COMPUTE_DEFAULTS))
    if unknown:
        raise KeyError(f"compute: unknown key(s) {unknown}; known: {sorted(COMPUTE_DEFAULTS)}")
    out = {**copy.deepcopy(COMPUTE_DEFAULTS), **given}
    for part in ("inference", "training"):
        sub = given.get(part) or {}
        bad = sorted(set(sub) - set(COMPUTE_DEFAULTS[part]))
        if bad:
            raise KeyError(f"compute.{part}: unknown key(s) {bad}; known: {sorted(COMPUTE_DEFAULTS[part])}")
        out[part] = {**COMPUTE_DEFAULTS[part], **sub}
    wrong = sorted(set(out["training"]["protocols"]) - {"finetune", "linear_aug"})
    if wrong or not out["training"]["protocols"]:
        raise ValueError(f"compute.training.protocols: unknown {wrong}; expected finetune and/or linear_aug")
    if out["precision"] not in ("auto", "bf16", "fp32"):
        raise ValueError(f"compute.precision must be auto, bf16 or fp32, got {out['precision']!r}")
    return out


# `lora:` (retinabench.protocols.lora, workflow/rules/lora.smk): LoRA SFT of MLLMs, one adapter per (MLLM, source
# task), evaluated in-domain and on every other grid task of the same task / harmonised id, paired with the base.
LORA_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "encoders": None,             # null: the MLLMs the mllm interface runs (mllm.encoders / every mllm entry)
    "sources": [],                # source tasks: grid task names or fnmatch patterns (FOCUS: BRSET, mBRSET tasks)
    "test_tasks": "auto",         # auto: every grid task that is the source task or shares its harmonised id
    "gpus": 4,                    # GPUs of a training job (Slurm --gpus); inference jobs take 1
    "processes": "auto",          # training processes: auto = one per visible GPU (<= gpus), 1 on CPU; or an int
    "device": "auto",             # auto: CUDA if present
    "threads": 4,                 # a training job's CPU threads, shared by its processes
    "train": {},                  # retinabench.protocols.lora.LoraSettings (FOCUS defaults), unknown keys fail
    "deltas": {"unit": "patient", "n_boot": 1000, "seed": 0, "level": 0.95,
               "metrics": ["auroc", "auprc", "accuracy", "f1", "ece"],
               "variant": "invalid_wrong"},   # Table 5's hard-decision variant (invalid_wrong | valid_both)
}


def lora_settings(config: dict) -> dict:
    """The config's ``lora:`` section over the defaults; unknown keys (also in ``deltas``) are an error; ``train``
    is checked by :class:`retinabench.protocols.lora.LoraSettings`."""
    given = copy.deepcopy(config.get("lora") or {})
    unknown = sorted(set(given) - set(LORA_DEFAULTS))
    if unknown:
        raise KeyError(f"lora: unknown key(s) {unknown}; known: {sorted(LORA_DEFAULTS)}")
    out = {**copy.deepcopy(LORA_DEFAULTS), **given}
    bad = sorted(set(given.get("deltas") or {}) - set(LORA_DEFAULTS["deltas"]))
    if bad:
        raise KeyError(f"lora.deltas: unknown key(s) {bad}; known: {sorted(LORA_DEFAULTS['deltas'])}")
    out["deltas"] = {**LORA_DEFAULTS["deltas"], **(given.get("deltas") or {})}
    out["train"] = dict(given.get("train") or {})
    if out["deltas"]["unit"] not in BOOTSTRAP_UNITS:
        raise ValueError(f"lora.deltas.unit must be patient or image, got {out['deltas']['unit']!r}")
    if out["deltas"]["variant"] not in ("invalid_wrong", "valid_both"):
        raise ValueError(f"lora.deltas.variant must be invalid_wrong or valid_both, got {out['deltas']['variant']!r}")
    if isinstance(out["sources"], str):
        out["sources"] = [out["sources"]]
    return out

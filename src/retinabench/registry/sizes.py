"""Size classes: what an encoder's size means for its jobs (feature batch size, host memory, runtime, GPU request).

The classes follow parameter count (tiny < 15M <= small < 50M <= base < 150M <= large < 500M <= huge < 1000M <=
giant). Every class runs on one GPU; the feature batch shrinks with size so that the giant class (ViT-G/14,
1.1B parameters, fp32 weights under bf16 autocast) stays far below one H100's 80 GB — :func:`feature_memory_gb`
is the estimate the tests hold each class to, and ``bench/gpu_check.py`` measures it on a GPU.
"""
from __future__ import annotations

SIZE_CLASSES: dict[str, dict] = {
    # mem_mb: host RAM of a features or fine-tuning job (finetune.smk uses it too); runtime: features, min/dataset
    "tiny": {"max_params_m": 15, "feature_batch": 256, "mem_mb": 4000, "runtime": 30, "gpu": 1},
    "small": {"max_params_m": 50, "feature_batch": 256, "mem_mb": 8000, "runtime": 30, "gpu": 1},
    "base": {"max_params_m": 150, "feature_batch": 128, "mem_mb": 16000, "runtime": 60, "gpu": 1},
    "large": {"max_params_m": 500, "feature_batch": 64, "mem_mb": 32000, "runtime": 120, "gpu": 1},
    "huge": {"max_params_m": 1000, "feature_batch": 64, "mem_mb": 64000, "runtime": 180, "gpu": 1},
    "giant": {"max_params_m": float("inf"), "feature_batch": 32, "mem_mb": 96000, "runtime": 240, "gpu": 1},
}
H100_GB = 80.0


def size_class_for(params_m: float) -> str:
    for name, c in SIZE_CLASSES.items():
        if params_m < c["max_params_m"]:
            return name
    return "giant"


def feature_batch_size(entry: dict, features: dict) -> int:
    """``features.batch_size``: ``auto`` -> the size class's batch; an integer -> that batch for every encoder."""
    requested = features["batch_size"]
    return SIZE_CLASSES[entry["size_class"]]["feature_batch"] if requested == "auto" else int(requested)


def feature_memory_gb(params_m: float, batch: int, tokens: int, width: int, mlp_hidden: int) -> float:
    """Upper estimate of GPU memory for frozen feature extraction: fp32 weights + the widest activations of one
    block for the batch in bf16 (inference mode frees each block's activations), doubled for the allocator."""
    weights = params_m * 1e6 * 4
    activations = batch * tokens * (4 * width + mlp_hidden) * 2 * 2
    return (weights + activations) / 1e9

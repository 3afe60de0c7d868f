"""The run's input size (config key ``input_size``): ``native`` leaves every encoder entry at its registry
``input_size``; an integer runs every image encoder at that side (OcularBench: 224).

An entry run at another side than its own gets ``input_size`` = the run's side and ``native_input_size`` = the
registry's. Everything downstream reads ``input_size`` (the encoder's build and its position embeddings, the resize
of the image cache's images in feature extraction and fine-tuning, compute, saliency, zero-shot), and the entry
travels as the jobs' params and into their provenance sidecars: a native and a resized run of one encoder never
share a job's result (Snakemake's params trigger reruns the job when the entry changes). An entry already at the
run's side is left as it is (the same computation, the same artifacts). Entries without an input size (MLLMs:
their processor decides) are untouched. Torch-free, like the rest of :mod:`retinabench.registry`.
"""
from __future__ import annotations

NATIVE = "native"


def at_input_size(entry: dict, input_size: int | str) -> dict:
    """``entry`` as a run at ``input_size`` (``native`` or pixels) builds it (an entry already resized is first
    taken back to its declared side)."""
    if "input_size" not in entry:
        return entry
    native = native_input_size(entry)
    declared = {k: v for k, v in entry.items() if k != "native_input_size"} | {"input_size": native}
    size = native if input_size == NATIVE else int(input_size)
    return declared if size == native else {**declared, "input_size": size, "native_input_size": native}


def native_input_size(entry: dict) -> int:
    """The side the entry's registry declares (its checkpoint's pipeline), whatever the run's side."""
    return int(entry.get("native_input_size", entry["input_size"]))


def resized(entry: dict) -> bool:
    """Whether the entry runs at another side than its registry's (its position embeddings are interpolated)."""
    return "input_size" in entry and int(entry["input_size"]) != native_input_size(entry)


def apply_input_size(encoders: dict[str, dict], input_size: int | str) -> dict[str, dict]:
    """Every entry of ``encoders`` as a run at ``input_size`` builds it."""
    return {name: at_input_size(entry, input_size) for name, entry in encoders.items()}

"""GPU check of the compute benchmark on two real-size architectures (ResNet-50 and ViT-B/16, random init, 224 px).

Runs ``retinabench.compute.benchmark_encoder`` — the code the ``compute_benchmark`` rule runs, in its isolated
worker process — for both encoders on synthetic 224 × 224 images and prints their tables side by side with the
ratios ViT-B / ResNet-50 and fine-tuning / linear probing. Checks that must hold on any device (exit 1 otherwise):

* GFLOPs per image from torch's flop counter: ResNet-50 8.18 (4.09 GMACs), ViT-B/16 35.1 (17.6 GMACs) within 3 %
  (on CUDA this covers the flash / memory-efficient attention kernels, on CPU the CPU flash kernel);
* full fine-tuning holds weights + gradients + two AdamW moments: peak > 3.5 x the resident weights, and more than
  linear probing in both time and memory;
* every timing positive, p90 >= median; on CUDA the memory kind is ``cuda_max_memory_allocated``.

Paper settings (default, for a lent GPU): ``python bench/compute_gpu_check.py`` (batch 1 inference over 200
images after 10 warm-up passes, 25 training steps at batch 64 after 3). CPU dry run with tiny settings:
``python bench/compute_gpu_check.py --device cpu --images 3 --warmup 1 --batch 4 --steps 2 --threads 2``;
``--smoke``: the same code and checks on ViT-Tiny and ResNet-18 at 64 px (tests/bench/test_compute_gpu_check_smoke.py).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_cache  # noqa: E402
from retinabench.compute import benchmark_encoder  # noqa: E402
from retinabench.settings import ComputeSettings, FinetuneSettings  # noqa: E402

ENCODERS = {  # (small, large): reference GFLOPs at `size` px
    "resnet50_random": {"architecture": "resnet50", "pooling": "avg", "gflops": 8.18, "size": 224},
    "vit_base_random": {"architecture": "vit_base_patch16_224", "pooling": "cls", "gflops": 35.1, "size": 224},
}
# --smoke: the same code on two small models at 64 px on the CPU (tests/bench runs it, so the script cannot rot).
SMOKE = {
    "vit_tiny_random": {"architecture": "vit_tiny_patch16_224", "pooling": "cls", "gflops": 0.1879, "size": 64},
    "resnet18_random": {"architecture": "resnet18", "pooling": "avg", "gflops": 0.2961, "size": 64},
}


def entry(name: str, spec: dict) -> dict:
    return {"name": name, "source": "timm", "architecture": spec["architecture"], "init": "random",
            "input_size": spec["size"], "normalization": "imagenet", "pooling": spec["pooling"], "size_class": "base",
            "domain": "none"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--images", type=int, default=200, help="batch-1 inference passes timed")
    ap.add_argument("--warmup", type=int, default=10, help="untimed inference passes (training: min(3, this))")
    ap.add_argument("--batch", type=int, default=64, help="training batch size")
    ap.add_argument("--steps", type=int, default=25, help="timed training steps")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--smoke", action="store_true", help="two small models at 64 px, CPU, tiny settings")
    ap.add_argument("--json", help="also write the table here (records)")
    a = ap.parse_args(argv)
    encoders = ENCODERS
    if a.smoke:
        encoders = SMOKE
        a.device, a.images, a.warmup, a.batch, a.steps, a.threads = "cpu", 3, 1, 4, 2, 1
    small, large = list(encoders)
    settings = ComputeSettings.from_config({"compute": {
        "device": a.device, "precision": a.precision, "threads": a.threads,
        "inference": {"batch_size": 1, "warmup": a.warmup, "images": a.images},
        "training": {"batch_size": a.batch, "warmup": min(3, a.warmup), "steps": a.steps, "distinct_batches": 2}}}).plain()
    n_train = 2 * a.batch
    tables = []
    with tempfile.TemporaryDirectory() as tmp:
        arr, _ = make_cache(Path(tmp), a.images + n_train, size=max(s["size"] for s in encoders.values()))
        for name, spec in encoders.items():
            t0 = time.perf_counter()
            t = benchmark_encoder(entry(name, spec), arr, test_rows=range(a.images),
                                  train_rows=range(a.images, a.images + n_train),
                                  train_labels=np.arange(n_train) % 3, n_classes=3, settings=settings,
                                  train_settings=FinetuneSettings().plain(), task="synthetic")
            print(f"{name}: benchmarked in {time.perf_counter() - t0:.1f} s", flush=True)
            tables.append(t)
    table = pd.concat(tables, ignore_index=True)
    show = table.assign(ms_median=table["seconds_median"] * 1e3, ms_p90=table["seconds_p90"] * 1e3)
    cols = ["encoder", "phase", "device", "dtype", "batch_size", "ms_median", "ms_p90", "images_per_s",
            "peak_mem_mb", "model_mem_mb", "n_params", "n_trainable", "gflops"]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.2f}".format):
        print(show[cols].to_string(index=False))
    r = table.set_index(["encoder", "phase"])
    print(f"device {table['device_name'].iloc[0]}, torch {table['torch'].iloc[0]}, CUDA {table['cuda'].iloc[0]}, "
          f"memory kind {sorted(set(table['peak_mem_kind']))}")
    for phase in ("inference", "finetune", "linear_aug"):
        v, c = r.loc[(large, phase)], r.loc[(small, phase)]
        print(f"{phase:10s} {large} / {small}: time {v['seconds_median'] / c['seconds_median']:.2f}x, "
              f"peak memory {v['peak_mem_mb'] / c['peak_mem_mb']:.2f}x")
    failures = []
    for name, spec in encoders.items():
        ft, lp, inf = (r.loc[(name, p)] for p in ("finetune", "linear_aug", "inference"))
        print(f"{name}: fine-tuning / linear probing: time {ft['seconds_median'] / lp['seconds_median']:.2f}x, "
              f"memory {ft['peak_mem_mb'] / lp['peak_mem_mb']:.2f}x")
        if abs(inf["gflops"] / spec["gflops"] - 1) > 0.03:
            failures.append(f"{name}: {inf['gflops']:.2f} GFLOPs, expected {spec['gflops']}")
        if not ft["peak_mem_mb"] > 3.5 * inf["model_mem_mb"]:
            failures.append(f"{name}: fine-tuning peak {ft['peak_mem_mb']:.0f} MiB is not > 3.5 x the weights "
                            f"({inf['model_mem_mb']:.0f} MiB)")
        if not (ft["peak_mem_mb"] > lp["peak_mem_mb"] and ft["seconds_median"] > lp["seconds_median"]):
            failures.append(f"{name}: fine-tuning is not costlier than linear probing")
    if not ((table["seconds_median"] > 0) & (table["seconds_p90"] >= table["seconds_median"])).all():
        failures.append("a timing is not positive or p90 < median")
    if (table["device"].str.startswith("cuda")).any() and set(table["peak_mem_kind"]) != {"cuda_max_memory_allocated"}:
        failures.append(f"CUDA run with memory kinds {sorted(set(table['peak_mem_kind']))}")
    if a.json:
        Path(a.json).write_text(table.to_json(orient="records"))
    for f in failures:
        print("CHECK FAILED:", f)
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

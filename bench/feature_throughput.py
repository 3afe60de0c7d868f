"""Feature-extraction throughput: the pipeline (memory-mapped uint8 cache -> normalise -> model -> Parquet) vs the
fastest plain ``model(x)`` loop over pre-made, already normalised tensors — same model, batch size and images.

The baseline is the best of three plain loops, all under ``torch.inference_mode``: NCHW-contiguous input,
channels_last input, and a channels_last model on channels_last input. (A baseline fed only NCHW tensors is slower
than the pipeline, whose NHWC cache yields channels_last input for free: that ratio would measure the baseline.)
Goal: pipeline / best plain loop >= 0.9. Models: ViT-B/16 and ViT-L/14 with random weights (and the packaged
EfficientNet-Lite0, a CNN, where channels_last matters most). The CUDA path (bf16, channels_last where it helps)
is measured by ``bench/gpu_check.py``.
"""
from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch

from common import make_cache, set_threads, timed
from retinabench.data.image_cache import open_image_cache
from retinabench.features.extract import extract_features, to_model_input
from retinabench.models import build_encoder

VIT = {"source": "timm", "init": "random", "input_size": 224, "normalization": "imagenet", "pooling": "cls",
       "domain": "none", "method": "random initialisation"}
MODELS = {
    "vit_b16": ({"name": "bench_vit_b16", "architecture": "vit_base_patch16_224", "size_class": "base", **VIT}, 32, 16),
    "vit_l14": ({"name": "bench_vit_l14", "architecture": "vit_large_patch14_dinov2", "size_class": "large", **VIT},
                8, 8),
    "efficientnet_lite0": (None, 128, 32),
}


def bench_one(key: str, n: int, batch: int, repeat: int) -> dict:
    entry, _, _ = MODELS[key]
    if entry is None:
        from common import encoder as packaged
        enc = packaged("efficientnet_lite0_in1k")
    else:
        enc = build_encoder(entry)
    with tempfile.TemporaryDirectory() as tmp:
        arr, index = make_cache(Path(tmp), n)
        out = Path(tmp) / "features.parquet"
        images, _ = open_image_cache(arr, index)
        cpu = torch.device("cpu")
        nchw = [to_model_input(images[s:s + batch], enc, cpu).contiguous() for s in range(0, n, batch)]
        cl = [x.contiguous(memory_format=torch.channels_last) for x in nchw]
        model = enc.module.eval()
        model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)

        def loop(m, batches):
            def run():
                with torch.inference_mode():
                    for x in batches:
                        m(x)
            return run

        plain = {"NCHW input": loop(model, nchw), "channels_last input": loop(model, cl),
                 "channels_last model + input": loop(model_cl, cl)}
        info = {}

        def pipeline():
            info.update(extract_features(enc, arr, index, out, batch_size=batch, device="cpu", progress=False))

        plain["NCHW input"]()  # warm-up (allocator, kernels)
        times = {k: [] for k in [*plain, "pipeline"]}
        for _ in range(repeat):  # interleaved so drift in machine load hits all alike
            for k, fn in plain.items():
                times[k].append(timed(fn))
            times["pipeline"].append(timed(pipeline))
    best = {k: min(v) for k, v in times.items()}
    fastest = min((k for k in plain), key=best.get)
    ratio = best[fastest] / best["pipeline"]
    print(f"feature extraction, {enc.name}, {n} images, batch {batch}, CPU x{torch.get_num_threads()} threads")
    for k in plain:
        print(f"  plain loop, {k:27s}: {best[k]:7.2f} s  ({n / best[k]:6.2f} img/s)" + ("  <- baseline" if k == fastest
                                                                                          else ""))
    print(f"  pipeline, {'channels_last model' if info['channels_last'] else 'model as built':27s}: "
          f"{best['pipeline']:7.2f} s  ({n / best['pipeline']:6.2f} img/s)")
    print(f"  throughput ratio pipeline / fastest plain loop = {ratio:.3f}  (goal >= 0.9)")
    return {"model": key, "ratio": ratio, "baseline": fastest, **{f"s_{k}": v for k, v in best.items()}}


def main(models=("vit_b16", "vit_l14", "efficientnet_lite0"), repeat: int = 2, scale: float = 1.0) -> list[dict]:
    set_threads(2)
    out = []
    for key in models:
        _, n, batch = MODELS[key]
        out.append(bench_one(key, max(batch, int(n * scale)), batch, repeat))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply each model's number of images")
    a = ap.parse_args()
    main(a.models, a.repeat, a.scale)

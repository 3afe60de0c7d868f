"""GPU check of the feature-extraction path (run on a CUDA machine; ``--smoke --device cpu`` runs the same code on
tiny models to keep this script working).

1. Throughput: the pipeline (``extract_features``: uint8 cache -> GPU -> bf16 autocast, channels_last where it
   helps) vs the fastest plain loop on pre-made GPU tensors under inference mode and bf16 autocast (NCHW input,
   channels_last input, channels_last model + input). Goal: ratio >= 0.9. ViT-B/16, ViT-L/14, EfficientNet-Lite0.
2. bf16 vs fp32: the pipeline's bf16 embeddings against an fp32 forward (cosine similarity per image).
3. Memory: peak GPU memory of feature extraction for ViT-G/14 (DINOv2 giant, 1.1B parameters) at the giant size
   class's feature batch, and of one full fine-tuning step (AdamW, bf16 autocast) at batch 64 — both must fit one
   H100 (80 GB); the fine-tuning step is also measured with activation checkpointing.

Prints a table and writes ``$OUT/gpu_check.json`` (or ``--json PATH``).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_cache  # noqa: E402

from retinabench.data.image_cache import open_image_cache  # noqa: E402
from retinabench.features.extract import extract_features, prepare_module, to_model_input  # noqa: E402
from retinabench.models import build_encoder  # noqa: E402
from retinabench.registry.sizes import H100_GB, SIZE_CLASSES  # noqa: E402

BASE = {"source": "timm", "init": "random", "normalization": "imagenet", "domain": "none",
        "method": "random initialisation"}
FULL = {
    "vit_b16": ({**BASE, "name": "gpu_vit_b16", "architecture": "vit_base_patch16_224", "input_size": 224,
                 "pooling": "cls", "size_class": "base"}, 1024, 128),
    "vit_l14": ({**BASE, "name": "gpu_vit_l14", "architecture": "vit_large_patch14_dinov2", "input_size": 224,
                 "pooling": "cls", "size_class": "large"}, 512, 64),
    "efficientnet_lite0": ({**BASE, "name": "gpu_effnet", "architecture": "efficientnet_lite0", "input_size": 224,
                            "pooling": "avg", "size_class": "tiny"}, 2048, 256),
}
GIANT = {**BASE, "name": "gpu_vitg14", "architecture": "vit_giant_patch14_dinov2", "input_size": 224,
         "pooling": "cls", "size_class": "giant"}
SMOKE = {"vit_b16": ({**FULL["vit_b16"][0], "architecture": "vit_tiny_patch16_224", "input_size": 32}, 2, 2),
         "efficientnet_lite0": ({**FULL["efficientnet_lite0"][0], "input_size": 32}, 2, 2)}
SMOKE_GIANT = {**GIANT, "architecture": "vit_small_patch14_dinov2", "input_size": 28}


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, dev, repeat=3):
    fn()
    _sync(dev)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    return best


def throughput(key, entry, n, batch, dev, tmp, repeat=3):
    enc = build_encoder(entry)
    arr, index = make_cache(Path(tmp), n, size=entry["input_size"])
    images, _ = open_image_cache(arr, index)
    amp = dev.type == "cuda"
    model, _ = prepare_module(copy.deepcopy(enc.module), dev, channels_last=False)
    model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
    nchw = [to_model_input(images[s:s + batch], enc, dev).contiguous() for s in range(0, n, batch)]
    cl = [x.contiguous(memory_format=torch.channels_last) for x in nchw]

    def loop(m, xs):
        def run():
            with torch.inference_mode(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                for x in xs:
                    m(x)
        return run

    plain = {"NCHW input": loop(model, nchw), "channels_last input": loop(model, cl),
             "channels_last model + input": loop(model_cl, cl)}
    out = Path(tmp) / f"{key}.parquet"
    info = {}

    def pipeline():
        info.update(extract_features(enc, arr, index, out, batch_size=batch, device=str(dev), progress=False))

    best = {k: _timed(fn, dev, repeat) for k, fn in plain.items()}
    best["pipeline"] = _timed(pipeline, dev, repeat)
    fastest = min(plain, key=best.get)
    # bf16 pipeline vs an fp32 forward of the same images
    from retinabench.features.extract import load_features
    _, feats = load_features(out)
    with torch.inference_mode():
        ref = torch.cat([model(x).float() for x in nchw]).cpu()
    cos = torch.nn.functional.cosine_similarity(torch.from_numpy(feats.copy()), ref, dim=1)
    return {"model": key, "images": n, "batch": batch, "baseline": fastest, "ratio": best[fastest] / best["pipeline"],
            "img_per_s_pipeline": n / best["pipeline"], "img_per_s_baseline": n / best[fastest],
            "pipeline_channels_last": info["channels_last"], "precision": info["precision"],
            "cosine_bf16_vs_fp32_min": float(cos.min())}


def giant_memory(entry, dev, finetune_batch):
    res = {"model": entry["architecture"], "feature_batch": SIZE_CLASSES["giant"]["feature_batch"]}
    size = entry["input_size"]
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    enc = build_encoder(entry, device=str(dev))  # random init directly on the device
    model = enc.module.eval()
    x = torch.randn(res["feature_batch"], 3, size, size, device=dev)
    with torch.inference_mode(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        model(x)
    if dev.type == "cuda":
        res["features_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    for checkpointing in (False, True):
        model.train()
        model.set_grad_checkpointing(checkpointing)
        head = torch.nn.Linear(enc.embed_dim, 5).to(dev)
        opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-5)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        xb = torch.randn(finetune_batch, 3, size, size, device=dev)
        yb = torch.randint(0, 5, (finetune_batch,), device=dev)
        try:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss = torch.nn.functional.cross_entropy(head(model(xb)), yb)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            peak = torch.cuda.max_memory_allocated() / 1e9 if dev.type == "cuda" else None
            res[f"finetune_step_peak_gb{'_checkpointing' if checkpointing else ''}"] = peak
        except torch.OutOfMemoryError:
            res[f"finetune_step_peak_gb{'_checkpointing' if checkpointing else ''}"] = "out of memory"
        del opt, head
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny models (any device): exercise the code only")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or --smoke --device cpu")
    models, giant, ft_batch = (SMOKE, SMOKE_GIANT, 2) if a.smoke else (FULL, GIANT, 64)
    report = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "throughput": [], "h100_gb": H100_GB}
    with tempfile.TemporaryDirectory() as tmp:
        for key, (entry, n, batch) in models.items():
            r = throughput(key, entry, n, batch, dev, tmp, repeat=1 if a.smoke else 3)
            report["throughput"].append(r)
            print(f"{key:20s} ratio {r['ratio']:.3f} (baseline: {r['baseline']}) pipeline {r['img_per_s_pipeline']:8.1f}"
                  f" img/s, channels_last={r['pipeline_channels_last']}, {r['precision']}, min cos(bf16, fp32) "
                  f"{r['cosine_bf16_vs_fp32_min']:.4f}", flush=True)
    report["giant"] = giant_memory(giant, dev, ft_batch)
    print("giant:", json.dumps(report["giant"]), flush=True)
    if dev.type == "cuda":
        report["giant"]["features_fit_h100"] = report["giant"]["features_peak_gb"] < H100_GB
    path = a.json or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()

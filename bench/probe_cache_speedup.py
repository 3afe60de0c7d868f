"""kNN + linear probe from cached features vs training the same head by running the frozen encoder over the
images at every step (what a probe without a feature cache does). Same schedule (100 epochs x 25 steps, batch
64), same model. The uncached cost is measured on a number of real steps and extrapolated to the schedule;
its kNN needs one extraction pass over all images. Goal: ratio >= 50x."""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import encoder, make_cache, set_threads
from retinabench.features.extract import extract_features, load_features, to_model_input
from retinabench.data.image_cache import open_image_cache
from retinabench.protocols.knn import knn_predict_proba
from retinabench.protocols.linear import train_linear_probe
from retinabench.settings import KnnSettings, LinearSettings


def main(n: int = 320, measured_steps: int = 12) -> float:
    set_threads(2)
    enc = encoder()
    cfg = LinearSettings()
    total_steps = cfg.epochs * cfg.steps_per_epoch
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    tr, va = np.arange(0, int(0.7 * n)), np.arange(int(0.7 * n), int(0.85 * n))
    te = np.arange(int(0.85 * n), n)
    with tempfile.TemporaryDirectory() as tmp:
        arr, index = make_cache(Path(tmp), n)
        feats_path = Path(tmp) / "f.parquet"
        t0 = time.perf_counter()
        extract_features(enc, arr, index, feats_path, batch_size=64, device="cpu", progress=False)
        t_extract = time.perf_counter() - t0

        t0 = time.perf_counter()
        _, x = load_features(feats_path)
        knn_predict_proba(x[tr], y[tr], x[np.r_[va, te]], 3, k=KnnSettings().k, temperature=KnnSettings().temperature)
        head, _ = train_linear_probe(x[tr], y[tr], x[va], y[va], 3, seed=0, weighted=True, cfg=cfg)
        t_cached = time.perf_counter() - t0

        images, _ = open_image_cache(arr, index)
        head_u = torch.nn.Linear(enc.embed_dim, 3)
        opt = torch.optim.AdamW(head_u.parameters(), lr=cfg.lr)
        g = torch.Generator().manual_seed(0)
        t0 = time.perf_counter()
        for _ in range(measured_steps):
            idx = np.sort(tr[torch.randperm(len(tr), generator=g)[: cfg.batch_size].numpy()])
            with torch.inference_mode():
                f = enc.module(to_model_input(images[idx], enc, torch.device("cpu")))
            loss = torch.nn.functional.cross_entropy(head_u(f.clone()), torch.as_tensor(y[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        per_step = (time.perf_counter() - t0) / measured_steps
    t_uncached = per_step * total_steps + t_extract  # + one pass for kNN's features
    ratio = t_uncached / t_cached
    print(f"probe from cache vs encoder-in-the-loop, {enc.name}, {n} images, {total_steps} steps x batch 64")
    print(f"  one-time extraction        : {t_extract:8.2f} s (shared by every probe, seed and regime)")
    print(f"  cached kNN + linear probe  : {t_cached:8.2f} s")
    print(f"  uncached (measured {measured_steps} steps, {per_step:.3f} s/step, extrapolated): {t_uncached:8.1f} s")
    print(f"  speed-up cached vs uncached = {ratio:.0f}x  (goal >= 50x)")
    return ratio


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=320)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    main(a.n, a.steps)

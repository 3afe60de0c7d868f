"""Feature-extraction throughput: the pipeline (memory-mapped cache -> normalise -> model -> Parquet) vs a bare
``model(x)`` loop over pre-made tensors, same model, batch size and number of images. Goal: ratio >= 0.9."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from common import encoder, make_cache, set_threads, timed
from retinabench.features.extract import extract_features


def main(n: int = 384, batch: int = 64, repeat: int = 2) -> float:
    set_threads(2)
    enc = encoder()
    with tempfile.TemporaryDirectory() as tmp:
        arr, index = make_cache(Path(tmp), n)
        out = Path(tmp) / "features.parquet"
        batches = [torch.randn(min(batch, n - s), 3, 224, 224) for s in range(0, n, batch)]

        def bare():
            with torch.inference_mode():
                for x in batches:
                    enc.module(x)

        def pipeline():
            extract_features(enc, arr, index, out, batch_size=batch, device="cpu", progress=False)

        bare()  # warm-up (allocator, kernels)
        t_bare, t_pipe = [], []
        for _ in range(repeat):  # interleaved so drift in machine load hits both alike
            t_bare.append(timed(bare))
            t_pipe.append(timed(pipeline))
    tb, tp = min(t_bare), min(t_pipe)
    ratio = tb / tp
    print(f"feature extraction, {enc.name}, {n} images, batch {batch}, CPU x2 threads")
    print(f"  bare model(x) loop : {tb:7.2f} s  ({n / tb:6.1f} img/s)")
    print(f"  pipeline           : {tp:7.2f} s  ({n / tp:6.1f} img/s)")
    print(f"  throughput ratio pipeline/bare = {ratio:.3f}  (goal >= 0.9)")
    return ratio


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=384)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    main(a.n, a.batch, a.repeat)

"""Shared set-up for the benchmarks: a temporary image cache and the packaged EfficientNet-Lite0 encoder."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

from retinabench.models import build_encoder
from retinabench.schemas import write_table

REPO = Path(__file__).resolve().parents[1]


def encoder(name: str = "efficientnet_lite0_in1k"):
    entries = yaml.safe_load((REPO / "config/encoders.yaml").read_text())
    return build_encoder({"name": name, **entries[name]})


def make_cache(workdir: Path, n: int, size: int = 224, seed: int = 0) -> tuple[Path, Path]:
    """A uint8 image cache of ``n`` random images (throughput does not depend on pixel content)."""
    rng = np.random.default_rng(seed)
    arr = workdir / "images.npy"
    store = np.lib.format.open_memmap(arr, mode="w+", dtype=np.uint8, shape=(n, size, size, 3))
    for start in range(0, n, 256):
        store[start:start + 256] = rng.integers(0, 256, size=(min(256, n - start), size, size, 3), dtype=np.uint8)
    store.flush()
    index = workdir / "images.index.parquet"
    write_table(pd.DataFrame({"image_id": [f"img{i:06d}" for i in range(n)], "row": np.arange(n)}), index,
                "image_index")
    return arr, index


def timed(fn, repeat: int = 1) -> float:
    """Best wall time of ``repeat`` calls (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def interleaved_times(first, second, repeats: int) -> tuple[list[float], list[float]]:
    """Wall times of ``repeats`` calls of each of two arms, interleaved with the order alternating, so that drift on
    a shared machine hits both arms alike; pair i of the two lists was measured side by side."""
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(repeats):
        arms = ((first, times[0]), (second, times[1]))
        for fn, acc in (arms if r % 2 == 0 else arms[::-1]):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return times


def set_threads(n: int = 2) -> None:
    torch.set_num_threads(n)


def gpu_check_parser(doc: str, smoke_help: str):
    """The arguments every GPU check shares: --device (cuda), --smoke (tiny configs on CPU), --json."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help=smoke_help)
    ap.add_argument("--json", default=None)
    return ap


def gpu_check_device(args) -> torch.device:
    """The checked device: CUDA must be present when asked for; CPU runs take 1 thread (smoke) or up to 8."""
    import os
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --smoke --device cpu")
    if dev.type == "cpu":
        torch.set_num_threads(1 if args.smoke else min(8, os.cpu_count() or 1))
    return dev


def write_gpu_check(args, name: str, report: dict) -> Path:
    """A GPU check's JSON: ``--json PATH``, else ``$OUT/<name>.json`` (the device machine's returned folder)."""
    import json
    import os
    out = Path(args.json) if args.json else Path(os.environ.get("OUT", ".")) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    return out

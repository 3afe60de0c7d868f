"""Compute cost of an encoder (OcularBench Figs. A.16-A.19): inference latency and memory, training time per step
and memory for full fine-tuning and linear probing, parameters and FLOPs.

Phases, on the configured device, all in one fresh worker process per encoder (``python -m
retinabench.compute.worker``: no allocator state, threads or caches carried over from the caller or from another
encoder; each phase builds its own model and measures memory from its own baseline):

* ``inference``: batches of ``inference.batch_size`` (1, as the paper) test-split images of the configured task,
  ``warmup`` untimed passes, then one timed forward pass per batch (``torch.inference_mode``; set up as feature
  extraction runs: channels_last for CNNs, on CUDA bf16 autocast and cuDNN autotuning). The input is prepared
  (uint8 -> float, resized, normalised) before the clock starts: latency is the model's forward pass alone.
* ``finetune`` / ``linear_aug``: the fine-tuning layer's own ``Trainer.train_step`` (host-to-device copy of the
  uint8 batch, normalisation, forward, cross-entropy, backward, AdamW, scheduler) at ``training.batch_size``
  (64) on training-split images, ``warmup`` untimed steps, then ``steps`` (25) timed steps. Data loading and
  augmentation are excluded (they run in DataLoader workers or batched on the device). ``linear_aug`` is the
  encoder frozen: forward without gradients through the encoder, a trained linear head.

Timing: ``time.perf_counter`` around each pass; on CUDA ``torch.cuda.synchronize`` before and after, so a time
is the device's. Reported: median, p90, mean and sd per pass, images/s at the median. Memory: ``.memory``
(CUDA: max_memory_allocated; CPU: resident high-water mark above the pre-model baseline). Parameters: all and
trainable. FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` on one forward pass at batch 1 (a multiply-add
counts 2 FLOPs; ``gmacs`` is half of it, the unit tools such as fvcore call "FLOPs"), with the CPU
flash-attention kernel added to its table (torch only counts the CUDA attention kernels).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd

from retinabench.settings.finetune import FinetuneSettings
from retinabench.settings.layers import ComputeSettings

PHASES = ("inference", "finetune", "linear_aug")
COMPUTE_COLUMNS = [
    "encoder", "domain", "architecture", "size_class", "phase", "task", "device", "device_name", "dtype",
    "batch_size", "threads", "channels_last", "compile", "n_warmup", "n_timed", "seconds_median", "seconds_p90",
    "seconds_mean", "seconds_std", "images_per_s", "peak_mem_mb", "model_mem_mb", "peak_mem_kind", "n_params",
    "n_trainable", "gflops", "gmacs", "torch", "timm", "cuda", "cudnn", "python", "load_avg_1m",
]


# -- FLOPs ------------------------------------------------------------------------------------------------------

def _cpu_flash_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(module, input_size: int, device=None) -> int:
    """FLOPs of one forward pass of ``module`` on a [1, 3, S, S] input (torch's FlopCounterMode, fp32)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    aten = torch.ops.aten
    extra = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_sdpa_flop
    device = device or next(module.parameters()).device
    x = torch.zeros(1, 3, input_size, input_size, device=device)
    was_training = module.training
    module.eval()
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=extra) as counter:
        module(x)
    module.train(was_training)
    return int(counter.get_total_flops())


# -- one phase ----------------------------------------------------------------------------------------------------

def _sync(dev) -> None:
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _summary(times: list[float], batch: int) -> dict:
    t = np.asarray(times, dtype=np.float64)
    med = float(np.median(t))
    return {"n_timed": len(t), "seconds_median": med, "seconds_p90": float(np.percentile(t, 90)),
            "seconds_mean": float(t.mean()), "seconds_std": float(t.std(ddof=1)) if len(t) > 1 else 0.0,
            "images_per_s": batch / med if med > 0 else float("nan")}


def _precision(requested: str, dev) -> str:
    return requested if requested != "auto" else ("bf16" if dev.type == "cuda" else "fp32")


def measure_inference(entry: dict, images: np.ndarray, *, batch_size: int, warmup: int, device: str,
                      precision: str) -> dict:
    """Latency and peak memory of forward passes at ``batch_size`` over ``images`` (uint8 [N, H, W, 3])."""
    import torch
    from retinabench.compute.memory import PeakMemory, baseline_rss_mb
    from retinabench.features.extract import pick_device, prepare_module, to_model_input
    from retinabench.models.encoder import build_encoder
    dev = pick_device(device)
    prec = _precision(precision, dev)
    if len(images) == 0:
        raise ValueError(f"encoder {entry['name']}: no images to time inference on")
    baseline = baseline_rss_mb()
    encoder = build_encoder(entry)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True  # as feature extraction; the warm-up passes absorb the autotuning
    module, channels_last = prepare_module(encoder.module, dev, "auto")  # the feature extraction's set-up
    n_batches = max(1, len(images) // batch_size)
    mem = PeakMemory(dev, baseline).start()
    times = []
    with torch.inference_mode():
        for i in range(warmup + n_batches):
            start = (i % n_batches) * batch_size
            x = to_model_input(images[start:start + batch_size], encoder, dev)
            _sync(dev)
            t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=prec == "bf16"):
                out = module(x)
            _sync(dev)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
            del out, x
    peak = mem.peak_mb()
    n_params = sum(p.numel() for p in module.parameters())
    flops = count_flops(module.to(memory_format=torch.contiguous_format), encoder.input_size, dev)
    return {"phase": "inference", "device": str(dev), "dtype": prec, "batch_size": batch_size,
            "channels_last": channels_last, "compile": False, "n_warmup": warmup, **_summary(times, batch_size),
            "peak_mem_mb": peak, "model_mem_mb": mem.at_start_mb, "peak_mem_kind": mem.kind, "n_params": n_params,
            "n_trainable": 0, "flops": flops}


def measure_training(entry: dict, batches: list, n_classes: int, *, protocol: str, train_settings: dict,
                     warmup: int, steps: int, device: str, precision: str) -> dict:
    """Time per step and peak memory of ``Trainer.train_step`` over ``batches`` (uint8 NCHW, labels) cycled;
    ``train_settings``: fine-tuning's settings (the plan passes its step settings: channels_last, compile,
    weight_decay)."""
    import torch
    from retinabench.compute.memory import PeakMemory, baseline_rss_mb
    from retinabench.models.encoder import build_encoder
    from retinabench.protocols.finetune import Trainer
    batch_size = int(batches[0][0].shape[0])
    cfg = FinetuneSettings.of({**train_settings, "batch_size": batch_size, "epochs": 1, "steps_per_epoch": warmup + steps,
                          "device": device, "precision": precision, "augment": {"enabled": False}}, "finetune")
    baseline = baseline_rss_mb()
    trainer = Trainer(build_encoder(entry), n_classes, protocol=protocol, seed=0, cfg=cfg)  # deep-copies the encoder
    dev = trainer.device
    if dev.type == "cuda":
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
    mem = PeakMemory(dev, baseline).start()  # the encoder's load-time copy is gone: weights counted once
    times = []
    for i in range(warmup + steps):
        x, y = batches[i % len(batches)]
        _sync(dev)
        t0 = time.perf_counter()
        loss = trainer.train_step(x, y)
        _sync(dev)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"encoder {entry['name']} {protocol}: non-finite loss at benchmark step {i}")
    peak = mem.peak_mb()
    total, trainable = trainer.n_params()
    return {"phase": protocol, "device": str(dev), "dtype": trainer.precision, "batch_size": batch_size,
            "channels_last": trainer.channels_last, "compile": bool(cfg.compile), "n_warmup": warmup,
            **_summary(times, batch_size), "peak_mem_mb": peak, "model_mem_mb": mem.at_start_mb,
            "peak_mem_kind": mem.kind, "n_params": total, "n_trainable": trainable}


# -- one encoder --------------------------------------------------------------------------------------------------

def _versions(dev_type: str) -> dict:
    import torch
    out = {"torch": torch.__version__, "python": platform.python_version(), "cuda": None, "cudnn": None}
    try:
        out["timm"] = metadata.version("timm")
    except metadata.PackageNotFoundError:
        out["timm"] = None
    if dev_type == "cuda":
        out["cuda"] = torch.version.cuda
        out["cudnn"] = str(torch.backends.cudnn.version())
    return out


def _device_name(dev) -> str:
    import torch
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_phases(spec: dict) -> list[dict]:
    """Every phase of one encoder in this process (the worker's body): ``spec`` as :func:`benchmark_encoder`
    writes it."""
    import torch
    from retinabench.data.image_dataset import StreamBatchSampler
    from retinabench.features.extract import pick_device
    s, entry = ComputeSettings.of(spec["settings"]), spec["entry"]
    threads = s.threads
    torch.set_num_threads(max(1, threads))
    torch.manual_seed(0)
    from retinabench.compute.memory import trim_heap
    from retinabench.models.encoder import build_encoder
    # One untimed build first: imports the loader's libraries, reads the weight file into the page cache and runs
    # build_encoder's probe forward pass (kernel set-up), so none of that lands in the first phase's figures.
    dev = pick_device(s.device)
    if dev.type == "cuda":
        torch.cuda.init()
    warm = build_encoder(entry)
    warm.module.to(dev)
    del warm
    trim_heap()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    cache = np.load(spec["array"], mmap_mode="r")
    inf = s.inference
    test_rows = np.asarray(spec["test_rows"], dtype=np.int64)
    images = np.stack([np.array(cache[r]) for r in test_rows])
    rows = [measure_inference(entry, images, batch_size=inf.batch_size, warmup=inf.warmup, device=s.device,
                              precision=s.precision)]
    del images
    tr = s.training
    if tr.protocols:
        train_rows = np.asarray(spec["train_rows"], dtype=np.int64)
        labels = np.asarray(spec["train_labels"], dtype=np.int64)
        sampler = StreamBatchSampler(len(train_rows), tr.batch_size, 0, 0, tr.distinct_batches)
        batches = []
        for step in range(tr.distinct_batches):
            idx = np.array([i for i, _ in sampler.batch(step)])
            x = torch.from_numpy(np.stack([np.array(cache[r]) for r in train_rows[idx]])).permute(0, 3, 1, 2)
            batches.append((x.contiguous(), torch.from_numpy(labels[idx])))
        for protocol in tr.protocols:
            rows.append(measure_training(entry, batches, int(spec["n_classes"]), protocol=protocol,
                                         train_settings=spec["train_settings"], warmup=tr.warmup, steps=tr.steps,
                                         device=s.device, precision=s.precision))
    common = {"encoder": entry["name"], "domain": entry.get("domain"), "architecture": entry.get("architecture"),
              "size_class": entry.get("size_class"), "task": spec.get("task"), "device_name": _device_name(dev),
              "threads": torch.get_num_threads(), "load_avg_1m": spec.get("load_avg_1m"), **_versions(dev.type)}
    flops = rows[0].pop("flops")
    return [{**common, **r, "gflops": flops / 1e9, "gmacs": flops / 2e9} for r in rows]


def benchmark_encoder(entry: dict, array_path: str | os.PathLike, *, test_rows, train_rows, train_labels,
                      n_classes: int, settings: dict, train_settings: dict, task: str | None = None,
                      isolate: bool = True) -> pd.DataFrame:
    """The compute table of one encoder (columns :data:`COMPUTE_COLUMNS`). ``settings``: the ``compute:``
    section (plain data: it travels to the worker as JSON); ``isolate``: in a fresh worker process (the default
    and what the workflow runs); False runs in this process (debugging)."""
    spec = {"entry": entry, "array": str(array_path), "test_rows": [int(r) for r in test_rows],
            "train_rows": [int(r) for r in train_rows], "train_labels": [int(v) for v in train_labels],
            "n_classes": int(n_classes), "settings": settings, "train_settings": train_settings, "task": task,
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    if not isolate:
        rows = run_phases(spec)
    else:
        with tempfile.TemporaryDirectory(prefix="rb-compute-") as tmp:
            spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "rows.json"
            spec_path.write_text(json.dumps(spec, default=str))
            proc = subprocess.run([sys.executable, "-m", "retinabench.compute.worker", str(spec_path),
                                   str(out_path)], capture_output=True, text=True)
            if proc.stdout:
                print(proc.stdout, end="", flush=True)
            if proc.returncode != 0 or not out_path.is_file():
                raise RuntimeError(f"compute benchmark of {entry['name']} failed (worker exit {proc.returncode}):\n"
                                   f"{proc.stderr[-4000:]}")
            rows = json.loads(out_path.read_text())
    return pd.DataFrame(rows)[COMPUTE_COLUMNS]

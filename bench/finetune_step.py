"""Fine-tuning training step of the pipeline vs a bare timm training step, same model, same batch size.

Pipeline: ``protocols.finetune.Trainer.train_step`` fed by the training DataLoader — uint8 images read from the
memory-mapped image cache, the paper's augmentation (per sample, seeded), normalisation, forward, class-weighted
loss, backward, AdamW with two parameter groups, scheduler step. Bare: the same timm encoder + linear head,
forward/backward/AdamW on a pre-made normalised float tensor (no data loading, no augmentation). Reported: images/s
of both and their ratio (pipeline / bare; goal >= 0.9). Defaults (ViT-Tiny, batch 32, one thread, CPU) keep a
run under two minutes on a shared 2-core machine; on a GPU machine pass ``--device cuda --batch 64 --threads 8``
(bf16 autocast and channels_last for both, augmentation batched on the device).
"""
from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import encoder, make_cache, set_threads
from retinabench.data.image_dataset import CachedImageDataset, StreamBatchSampler
from retinabench.protocols.finetune import TrainConfig, Trainer
from retinabench.protocols.finetune_train import _loader, resolve_workers


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def pipeline_step(enc, arr: Path, n: int, cfg: TrainConfig, steps: int, threads: int):
    """A function running one pipeline step (next batch from the loader + Trainer.train_step)."""
    y = np.arange(n) % 3
    trainer = Trainer(enc, 3, protocol="finetune", seed=0, cfg=cfg, class_weight=np.array([0.3, 0.3, 0.4]))
    ds = CachedImageDataset(arr, np.arange(n), y, trainer.loader_transform())
    workers = resolve_workers(cfg, trainer.device, threads)
    batches = iter(_loader(ds, StreamBatchSampler(n, cfg.batch_size, 0, 0, steps), num_workers=workers,
                           pin=trainer.device.type == "cuda", seed=0))

    def step():
        trainer.train_step(*next(batches)).item()  # .item(): the step is finished when the timer stops
    return step, trainer.device


def bare_step(enc, cfg: TrainConfig):
    """A function running one bare timm step on a pre-made normalised batch (same model, batch, optimizer)."""
    dev = torch.device(cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    model = torch.nn.Sequential(copy.deepcopy(enc.module), torch.nn.Linear(enc.embed_dim, 3)).to(dev).train()
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg.batch_size, 3, enc.input_size, enc.input_size, generator=g).to(dev)
    if cuda:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 3, (cfg.batch_size,), generator=g).to(dev)

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    return step


def main(name: str = "vit_tiny_random", batch: int = 32, steps: int = 6, warmup: int = 1, threads: int = 1,
         device: str = "cpu", where: str = "auto") -> float:
    set_threads(threads)
    enc = encoder(name)
    cfg = TrainConfig(batch_size=batch, device=device, augment={"where": where})
    n = 4 * batch
    with tempfile.TemporaryDirectory() as tmp:
        arr, _ = make_cache(Path(tmp), n, size=224)
        pipe, dev = pipeline_step(enc, arr, n, cfg, warmup + steps, threads)
        bare = bare_step(enc, cfg)
        # Steps alternate (bare, pipeline, bare, ...) so that both see the same load on a shared machine; the
        # ratio is the median over adjacent pairs of bare time / pipeline time.
        times = {"bare": [], "pipeline": []}
        for k in range(warmup + steps):
            for kind, fn in (("bare", bare), ("pipeline", pipe)):
                _sync(dev)
                t0 = time.perf_counter()
                fn()
                _sync(dev)
                if k >= warmup:
                    times[kind].append(time.perf_counter() - t0)
    rate = {k: batch / float(np.median(v)) for k, v in times.items()}
    ratio = float(np.median(np.array(times["bare"]) / np.array(times["pipeline"])))
    print(f"fine-tuning step, {name}, batch {batch}, {dev}, {threads} threads, augmentation "
          f"{'loader' if where == 'auto' and dev.type == 'cpu' else where}: pipeline {rate['pipeline']:.1f} img/s vs "
          f"bare timm {rate['bare']:.1f} img/s ({steps} alternating steps) -> ratio {ratio:.3f} "
          f"(goal >= 0.9)")
    return ratio


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", default="vit_tiny_random")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--where", default="auto", choices=["auto", "loader", "device"])
    a = ap.parse_args()
    main(a.encoder, a.batch, a.steps, a.warmup, a.threads, a.device, a.where)

"""One fine-tuning run (retinabench.protocols.finetune): the classifier (encoder + linear head), the
:class:`Trainer` (model, optimizer, schedule, loss; one optimisation step on the device) and :func:`fit`, the
epoch loop with validation, checkpoints (retinabench.protocols.finetune_checkpoints), resume and compute record.

Every value comes from the run's :class:`~retinabench.settings.TrainConfig` (the config's ``finetune:`` section).
Batches and augmentations are pure functions of (seed, step) (``data.image_dataset``), so a run killed at any
point and restarted resumes from its last checkpoint and ends bit-identical (on CPU) to an uninterrupted run.
"""
from __future__ import annotations

import copy
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from retinabench.data.image_dataset import CachedImageDataset, SequentialBatchSampler, StreamBatchSampler, worker_init
from retinabench.features.extract import pick_device
from retinabench.protocols.augment import augment_batch, build_train_transform
from retinabench.protocols.common import make_scheduler
from retinabench.protocols.finetune_checkpoints import (CHECKPOINT_FORMAT, DivergedError, rng_state,
                                                        set_rng_state, load_checkpoint, save_checkpoint)
from retinabench.settings.base import FINETUNE_PROTOCOLS
from retinabench.settings.finetune import TrainConfig


class Classifier(nn.Module):
    """Encoder (→ [B, D] embedding) + one linear head. ``frozen``: the encoder stays in eval mode, no gradients."""

    def __init__(self, encoder: nn.Module, embed_dim: int, n_classes: int, *, frozen: bool):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(embed_dim, n_classes)
        self.frozen = frozen
        if frozen:
            self.encoder.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:
            self.encoder.eval()  # frozen means frozen: BatchNorm statistics and dropout too
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.frozen:
            with torch.no_grad():
                f = self.encoder(x)
        else:
            f = self.encoder(x)
        return self.head(f)


class Trainer:
    """One run's model, optimizer, schedule and loss; ``train_step`` is the whole per-step pipeline on device."""

    def __init__(self, encoder, n_classes: int, *, protocol: str, seed: int, cfg: TrainConfig,
                 class_weight: np.ndarray | None = None):
        if protocol not in FINETUNE_PROTOCOLS:
            raise ValueError(f"unknown fine-tuning protocol {protocol!r}; expected one of {FINETUNE_PROTOCOLS}")
        self.protocol, self.seed, self.cfg = protocol, int(seed), cfg
        self.device = pick_device(cfg.device)
        cuda = self.device.type == "cuda"
        self.precision = cfg.precision if cfg.precision != "auto" else ("bf16" if cuda else "fp32")
        self.channels_last = cuda if cfg.channels_last == "auto" else bool(cfg.channels_last)
        self.input_size = encoder.input_size
        aug = cfg.augment
        self.augment_on = None if not aug.enabled else (aug.where if aug.where != "auto" else
                                                        ("device" if cuda else "loader"))
        torch.manual_seed(self.seed)  # head initialisation (and the dropout stream) follow the run's seed
        self.model = Classifier(copy.deepcopy(encoder.module), encoder.embed_dim, n_classes,
                                frozen=protocol == "linear_aug").to(self.device)
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.model.train()
        self.forward = torch.compile(self.model) if cfg.compile else self.model
        groups = [{"params": list(self.model.head.parameters()), "lr": cfg.lr_classifier, "name": "classifier"}]
        if protocol == "finetune":
            groups.insert(0, {"params": list(self.model.encoder.parameters()), "lr": cfg.lr_encoder,
                              "name": "encoder"})
        # fused AdamW on CUDA (one kernel over all parameters); the CPU keeps the default (foreach) kernel
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr_classifier, weight_decay=cfg.weight_decay,
                                           fused=True if cuda else None)
        self.scheduler = make_scheduler(self.optimizer, cfg.total_steps, cfg.warmup_frac)
        w = None if class_weight is None else torch.as_tensor(class_weight, dtype=torch.float32)
        self.loss_weight = w
        self.loss_fn = nn.CrossEntropyLoss(weight=None if w is None else w.to(self.device))
        self.mean = torch.tensor(encoder.mean, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(encoder.std, device=self.device).view(1, 3, 1, 1)
        self.step = 0

    # -- per step -------------------------------------------------------------------------------------------
    def loader_transform(self):
        """The per-sample augmentation the training DataLoader applies (None when it happens on the device)."""
        return build_train_transform(self.cfg.augment) if self.augment_on == "loader" else None

    def prepare(self, x_u8: torch.Tensor, seeds: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 NCHW -> [augmented on the device when ``seeds`` are given] -> normalised float at the encoder's
        input size (the math of features.to_model_input)."""
        x = x_u8.to(self.device, non_blocking=True).float().div_(255.0)
        if seeds is not None:
            x = augment_batch(x, seeds.tolist(), self.cfg.augment)
        if x.shape[-1] != self.input_size or x.shape[-2] != self.input_size:
            x = F.interpolate(x, size=(self.input_size, self.input_size), mode="bicubic", align_corners=False)
        x = (x - self.mean) / self.std
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def train_step(self, x_u8: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor | None = None) -> torch.Tensor:
        """One optimisation step on a uint8 batch; ``seeds``: the samples' augmentation seeds (used when the
        augmentation runs on the device)."""
        x = self.prepare(x_u8, seeds if self.augment_on == "device" else None)
        y = y.to(self.device, non_blocking=True)
        with self._autocast():
            logits = self.forward(x)
        loss = self.loss_fn(logits.float(), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss.detach()

    @torch.no_grad()
    def logits(self, loader) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 CPU logits and labels over an (unshuffled, unaugmented) loader, in eval mode."""
        was_training = self.model.training
        self.model.eval()
        out, ys = [], []
        for x, y, _ in loader:
            with self._autocast():
                out.append(self.forward(self.prepare(x)).float().cpu())
            ys.append(y)
        self.model.train(was_training)
        return torch.cat(out), torch.cat(ys)

    def loss_of(self, logits: torch.Tensor, y: torch.Tensor) -> float:
        return float(F.cross_entropy(logits, y, weight=self.loss_weight))

    # -- state ----------------------------------------------------------------------------------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """CPU copy of what training changes: the whole model, or only the head when the encoder is frozen."""
        module = self.model.head if self.model.frozen else self.model
        return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}

    def load_trainable(self, state: dict[str, torch.Tensor]) -> None:
        module = self.model.head if self.model.frozen else self.model
        module.load_state_dict(state, strict=True)

    def n_params(self) -> tuple[int, int]:
        params = list(self.model.parameters())
        return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


@dataclass
class RunResult:
    log: list[dict]
    best_epoch: int
    best_val_loss: float
    compute: dict


def _loader(ds, batch_sampler, *, num_workers: int, pin: bool, seed: int, persistent: bool = False):
    # The generator only seeds the workers' base seed (the data itself depends on the sampler's seeds), but
    # without one the DataLoader would draw from the global RNG and shift the model's random stream.
    return DataLoader(ds, batch_sampler=batch_sampler, num_workers=num_workers, pin_memory=pin,
                      worker_init_fn=worker_init if num_workers else None,
                      generator=torch.Generator().manual_seed(seed), persistent_workers=persistent and num_workers > 0,
                      prefetch_factor=4 if num_workers else None)


def resolve_workers(cfg: TrainConfig, device: torch.device, threads: int) -> int:
    if cfg.num_workers == "auto":
        return max(0, min(8, threads - 1)) if device.type == "cuda" else 0
    return int(cfg.num_workers)


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_memory_allocated"
    # CPU: the process's peak resident set (ru_maxrss is in KiB on Linux); covers the whole process lifetime.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process_max_rss"


def fit(trainer: Trainer, train_ds: CachedImageDataset, val_ds: CachedImageDataset, *,
        ckpt_dir: str | os.PathLike | None = None, fingerprint: str = "", threads: int = 1,
        on_epoch_end: Callable[[int], None] | None = None, log: Callable[[str], None] = print) -> RunResult:
    """Train ``trainer`` (resuming from ``ckpt_dir`` when it holds this run's checkpoint); leave the best
    validation-loss weights in ``trainer.model``. ``on_epoch_end(epoch)`` runs after an epoch's checkpoint (tests
    use it to kill a run)."""
    cfg, dev = trainer.cfg, trainer.device
    workers = resolve_workers(cfg, dev, threads)
    pin = dev.type == "cuda"
    ckpt = Path(ckpt_dir) if ckpt_dir else None
    state = load_checkpoint(ckpt, fingerprint, log) if ckpt else None
    history: list[dict] = []
    best_loss, best_state, best_epoch, start_epoch, stopped_at = float("inf"), None, -1, 0, None
    acc = {"train_seconds": 0.0, "train_steps": 0, "eval_seconds": 0.0}
    if state is not None:
        trainer.load_trainable(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.scheduler.load_state_dict(state["scheduler"])
        trainer.step = state["step"]
        best_loss, best_state, best_epoch = state["best_loss"], state["best_state"], state["best_epoch"]
        history, acc, start_epoch = state["log"], state["compute"], state["epoch"]
        stopped_at = state["stopped_at"]
        set_rng_state(state["rng"], dev)
        log(f"resumed from {ckpt} at epoch {start_epoch} (step {trainer.step})")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    val_loader = _loader(val_ds, SequentialBatchSampler(len(val_ds), cfg.eval_batch_size), num_workers=workers,
                         pin=pin, seed=trainer.seed, persistent=True)  # reused every epoch
    if start_epoch < cfg.epochs and stopped_at is None:
        sampler = StreamBatchSampler(len(train_ds), cfg.batch_size, trainer.seed,
                                     start_epoch * cfg.steps_per_epoch, cfg.total_steps)
        batches = iter(_loader(train_ds, sampler, num_workers=workers, pin=pin, seed=trainer.seed))
        from retinabench.progress import Progress
        bar = Progress(cfg.epochs - start_epoch, f"{trainer.protocol} seed {trainer.seed}", unit="epochs")
        for epoch in range(start_epoch, cfg.epochs):
            t0 = time.perf_counter()
            running = torch.zeros((), device=dev)
            for _ in range(cfg.steps_per_epoch):
                running += trainer.train_step(*next(batches))
            train_loss = running.item() / cfg.steps_per_epoch  # .item() syncs the device: the timing is real
            acc["train_seconds"] += time.perf_counter() - t0
            acc["train_steps"] += cfg.steps_per_epoch
            t0 = time.perf_counter()
            val_loss = trainer.loss_of(*trainer.logits(val_loader))
            acc["eval_seconds"] += time.perf_counter() - t0
            # A non-finite loss (a too-high learning rate) cannot recover: stop, keep the best epoch so far, and
            # record it (compute record `diverged`, the job log); the sweep relies on this for its largest lrs.
            diverged = not (np.isfinite(train_loss) and np.isfinite(val_loss))
            improved = not diverged and val_loss < best_loss
            if improved:
                best_loss, best_state, best_epoch = val_loss, trainer.trainable_state(), epoch
            history.append({"epoch": epoch, "step": trainer.step,
                            "lr": trainer.scheduler.get_last_lr()[-1],  # the classifier group's lr
                            "train_loss": train_loss, "val_loss": val_loss, "best": improved})
            done = epoch + 1
            if diverged:
                log(f"{trainer.protocol} seed {trainer.seed}: loss is non-finite at epoch {epoch} (train "
                    f"{train_loss}, val {val_loss}; lr_encoder {cfg.lr_encoder}, lr_classifier {cfg.lr_classifier});"
                    f" stopping with the best epoch so far ({best_epoch})")
                stopped_at = done
            if ckpt and (diverged or done % cfg.checkpoint_every == 0 or done == cfg.epochs):
                save_checkpoint(ckpt, {
                    "format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "epoch": done, "step": trainer.step,
                    "stopped_at": stopped_at,
                    # The data order is a pure function of (seed, step): this is the whole sampler state.
                    "sampler": {"seed": trainer.seed, "next_step": trainer.step, "batch_size": cfg.batch_size},
                    "model": trainer.trainable_state(), "optimizer": trainer.optimizer.state_dict(),
                    "scheduler": trainer.scheduler.state_dict(), "best_loss": best_loss, "best_state": best_state,
                    "best_epoch": best_epoch, "log": history, "compute": acc, "rng": rng_state(dev)})
            bar.update(note=f"epoch {epoch}: train loss {train_loss:.4f}, val loss {val_loss:.4f}, best epoch "
                            f"{best_epoch}")
            if on_epoch_end is not None:
                on_epoch_end(epoch)
            if diverged:
                break
        del batches  # shuts the workers down
    if best_state is None:
        raise DivergedError(f"{trainer.protocol} seed {trainer.seed}: no epoch produced a finite validation loss "
                            f"(lr_encoder {cfg.lr_encoder}, lr_classifier {cfg.lr_classifier})")
    trainer.load_trainable(best_state)
    trainer.model.eval()
    peak, peak_kind = peak_memory_mb(dev)
    steps = max(1, acc["train_steps"])
    total, trainable = trainer.n_params()
    compute = {"device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               "precision": trainer.precision, "augment_on": trainer.augment_on or "off",
               "channels_last": trainer.channels_last, "compile": bool(cfg.compile),
               "num_workers": workers, "threads": torch.get_num_threads(), "batch_size": cfg.batch_size,
               "steps": cfg.total_steps, "timed_steps": acc["train_steps"], "train_seconds": acc["train_seconds"],
               "seconds_per_step": acc["train_seconds"] / steps,
               "images_per_s": acc["train_steps"] * cfg.batch_size / max(acc["train_seconds"], 1e-9),
               "eval_seconds": acc["eval_seconds"], "peak_mem_mb": peak, "peak_mem_kind": peak_kind,
               "n_params": total, "n_trainable": trainable, "resumed_from_epoch": start_epoch,
               "best_epoch": best_epoch, "best_val_loss": best_loss, "diverged": stopped_at is not None,
               "lr_encoder": cfg.lr_encoder if trainer.protocol == "finetune" else float("nan"),
               "lr_classifier": cfg.lr_classifier}
    return RunResult(history, best_epoch, best_loss, compute)

"""Full fine-tuning (``finetune``) and augmented linear probing (``linear_aug``) from the uint8 image cache.

Protocol (the paper's; every value comes from the config's ``finetune:`` section): the encoder plus one linear
head on its embedding (CLS token for ViTs, pooled output for CNNs, as the encoder entry's ``pooling`` says);
AdamW with two parameter groups (``lr_encoder``, ``lr_classifier``); linear warm-up over the first 10 % of steps
then cosine decay (``protocols.common.make_scheduler``); 25 optimisation steps = one bookkeeping epoch, 100
epochs, batch 64; class weights ``1/log(c+1)`` (normalised) in the unbalanced training regime, none in the
balanced one; the returned weights are those of the epoch with the lowest validation loss. ``linear_aug`` is
the same trainer with the encoder frozen (kept in eval mode, no gradients): the paper's exact linear probe,
beside the fast cached-feature probe ``linear``.

Engineering: device picked automatically (CUDA if present); on CUDA bf16 autocast and channels_last; optional
``torch.compile``. A run checkpoints every ``checkpoint_every`` epochs (and after the last one) — model,
optimizer, scheduler, best weights, log, RNG states — atomically, with a sha256 sidecar verified at load. Batches
and augmentations are pure functions of (seed, step) (``data.image_dataset``), so a run killed at any point and
restarted resumes from its last checkpoint and ends bit-identical (on CPU) to an uninterrupted run. A checkpoint
records a fingerprint of everything that determines the result; one written under other settings (or other
code) is discarded, never resumed.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import random
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from retinabench.data.image_dataset import CachedImageDataset, SequentialBatchSampler, StreamBatchSampler, worker_init
from retinabench.data.splits import regime_rows
from retinabench.features.extract import pick_device
from retinabench.atomic import atomic_path, write_text_atomic
from retinabench.hashing import sha256_file
from retinabench.protocols.augment import augment_batch, build_train_transform
from retinabench.protocols.common import class_weights, make_scheduler, predictions_frame
from retinabench.regimes import Regime, is_balanced, parse_regimes, train_sides, trained_on
from retinabench.settings import (AUGMENT_DEFAULTS, FINETUNE_DEFAULTS,  # noqa: F401  (re-exported)
                                 FINETUNE_PROTOCOLS, augment_settings, finetune_settings)

CHECKPOINT_FORMAT = 1

@dataclass
class TrainConfig:
    epochs: int = 100
    steps_per_epoch: int = 25
    batch_size: int = 64
    eval_batch_size: int = 128
    lr_encoder: float = 1e-5
    lr_classifier: float = 1e-3
    weight_decay: float = 1e-4
    warmup_frac: float = 0.1
    checkpoint_every: int = 10
    device: str = "auto"
    precision: str = "auto"
    channels_last: Any = "auto"
    compile: bool = False
    num_workers: Any = "auto"
    augment: dict = field(default_factory=lambda: copy.deepcopy(AUGMENT_DEFAULTS))

    # Fields that cannot change a run's result (by design), left out of the checkpoint fingerprint.
    _NO_EFFECT = ("checkpoint_every", "num_workers")

    def __post_init__(self):
        self.augment = augment_settings(self.augment)  # partial dicts get the defaults; unknown keys fail

    @classmethod
    def from_settings(cls, settings: dict, **overrides) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in settings.items() if k in names}
        kwargs.update(overrides)
        return cls(**kwargs)

    def result_fields(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in self._NO_EFFECT}

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch


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
        precision = cfg.precision if cfg.precision != "auto" else ("bf16" if cuda else "fp32")
        if precision not in ("bf16", "fp32"):
            raise ValueError(f"finetune.precision must be auto, bf16 or fp32, got {cfg.precision!r}")
        self.precision = precision
        self.channels_last = cuda if cfg.channels_last == "auto" else bool(cfg.channels_last)
        self.input_size = encoder.input_size
        aug = cfg.augment
        self.augment_on = None if not aug["enabled"] else (
            aug["where"] if aug["where"] != "auto" else ("device" if cuda else "loader"))
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
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr_classifier, weight_decay=cfg.weight_decay)
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


# -- checkpoints ------------------------------------------------------------------------------------------------

class CheckpointError(RuntimeError):
    pass


class DivergedError(FloatingPointError):
    """A run whose loss went non-finite before any epoch had a finite validation loss (nothing to keep)."""


def _rng_state(device: torch.device) -> dict:
    np_state = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                                                       *np_state[2:]],
             "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    kind, key, *rest = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), *rest))
    random.setstate(_tuplify(state["python"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


def _ckpt_files(ckpt_dir: Path) -> list[Path]:
    return sorted(ckpt_dir.glob("epoch*.pt"))


def _save_verified(path: Path, obj: Any) -> Path:
    """``torch.save`` to a temporary name, renamed, then a ``.sha256`` sidecar (also written atomically): whoever
    finds the sidecar finds the complete file it describes."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
        digest = sha256_file(tmp)
    write_text_atomic(path.with_name(path.name + ".sha256"), f"{digest}  {path.name}\n")
    return path


def save_checkpoint(ckpt_dir: Path, state: dict) -> Path:
    """``epochNNNNN.pt`` + ``.sha256`` sidecar, each written to a temporary name and renamed; older ones pruned
    only after both are in place, so a kill at any moment leaves the previous checkpoint usable."""
    path = _save_verified(ckpt_dir / f"epoch{state['epoch']:05d}.pt", state)
    for old in _ckpt_files(ckpt_dir):
        if old != path:
            old.unlink()
            old.with_name(old.name + ".sha256").unlink(missing_ok=True)
    return path


def load_checkpoint(ckpt_dir: Path, fingerprint: str, log: Callable[[str], None] = print) -> dict | None:
    """The newest complete checkpoint of this run, or None. A checkpoint without its sidecar is an interrupted
    write (ignored); a sidecar that disagrees with the file is corruption (error); another fingerprint means
    other settings or code (the stale checkpoints are removed and the run starts over)."""
    if not ckpt_dir.is_dir():
        return None
    for path in reversed(_ckpt_files(ckpt_dir)):
        side = path.with_name(path.name + ".sha256")
        if not side.is_file():
            log(f"checkpoint {path} has no sha256 sidecar (interrupted write); ignoring it")
            continue
        expected = side.read_text().split()[0]
        actual = sha256_file(path)
        if actual != expected:
            raise CheckpointError(f"checkpoint {path} is corrupt: sha256 {actual} but its sidecar {side} says "
                                  f"{expected}; delete {ckpt_dir} to start this run over")
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("format") != CHECKPOINT_FORMAT or state.get("fingerprint") != fingerprint:
            log(f"checkpoints in {ckpt_dir} were written with other settings or code; starting over")
            shutil.rmtree(ckpt_dir)
            return None
        return state
    return None


# -- trained weights (kept for the saliency maps) ----------------------------------------------------------------

WEIGHTS_FORMAT = 1
WEIGHTS_KIND = "retinabench.finetuned_weights"


def module_digest(module: nn.Module) -> str:
    """sha256 over a module's state dict (names, dtypes, shapes, bytes): identifies a frozen encoder exactly."""
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def entry_digest(entry: dict) -> str:
    """Hash of a registry entry without its free-text notes: weights trained from another entry are refused."""
    return hashlib.sha256(json.dumps({k: v for k, v in entry.items() if k != "notes"}, sort_keys=True,
                                     default=str).encode()).hexdigest()


def save_weights(path: str | os.PathLike, weights: dict, *, protocol: str, encoder_entry: dict, task: dict,
                 seed: int) -> Path:
    """The best-validation weights of a job's training regimes (``FinetuneOutput.weights``) as one verified file
    (``.sha256`` sidecar): everything training changed (the whole model, or only the head of ``linear_aug``) plus
    what identifies the run, so :func:`load_finetuned` can refuse weights of another encoder, task or entry."""
    record = {"format": WEIGHTS_FORMAT, "kind": WEIGHTS_KIND, "protocol": protocol, "encoder": encoder_entry["name"],
              "entry_digest": entry_digest(encoder_entry), "task": task["name"], "classes": list(task["classes"]),
              "seed": int(seed), **weights}
    return _save_verified(Path(path), record)


def read_weights(path: str | os.PathLike) -> dict:
    """A weights file after checking it against its sha256 sidecar (a missing or disagreeing sidecar is an error)."""
    path = Path(path)
    side = path.with_name(path.name + ".sha256")
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist")
    if not side.is_file():
        raise CheckpointError(f"weights file {path} has no sha256 sidecar {side.name} (interrupted write?)")
    expected, actual = side.read_text().split()[0], sha256_file(path)
    if actual != expected:
        raise CheckpointError(f"weights file {path} is corrupt: sha256 {actual} but its sidecar says {expected}")
    record = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(record, dict) or record.get("kind") != WEIGHTS_KIND or record.get("format") != WEIGHTS_FORMAT:
        raise CheckpointError(f"{path} is not a retinabench weights file of format {WEIGHTS_FORMAT}")
    record["sha256"] = actual
    return record


def load_finetuned(path: str | os.PathLike, encoder_entry: dict, task: dict, *, protocol: str,
                   train_regime: str = "u"):
    """Rebuild the classifier a fine-tuning job trained: ``(model, encoder, record)``.

    The encoder is built from its registry entry through the verified loaders (pretrained sha256, strict keys),
    then the trained state is loaded strictly: the whole model for ``finetune``, the head for ``linear_aug``,
    whose rebuilt frozen encoder must hash to the one it was trained on. The model is a non-frozen
    :class:`Classifier` in eval mode, so gradients reach the input (saliency); ``record`` holds the file's sha256,
    best epoch and validation loss. Any mismatch (protocol, encoder, registry entry, task, classes) is an error.
    """
    from retinabench.models.encoder import build_encoder
    record = read_weights(path)
    want = {"protocol": protocol, "encoder": encoder_entry["name"], "task": task["name"],
            "classes": list(task["classes"]), "entry_digest": entry_digest(encoder_entry)}
    wrong = {k: (record.get(k), v) for k, v in want.items() if record.get(k) != v}
    if wrong:
        raise CheckpointError(f"weights file {path} does not belong to this run: " + "; ".join(
            f"{k} is {got!r}, expected {exp!r}" for k, (got, exp) in wrong.items()))
    regimes = record["regimes"]
    if train_regime not in regimes:
        raise CheckpointError(f"weights file {path} has no training regime {train_regime!r} (it has "
                              f"{sorted(regimes)})")
    encoder = build_encoder(encoder_entry)
    if protocol == "linear_aug" and module_digest(encoder.module) != record["frozen_encoder_sha256"]:
        raise CheckpointError(f"weights file {path}: the encoder {encoder_entry['name']!r} built now differs from "
                              "the frozen encoder its head was trained on (weights or loader changed)")
    model = Classifier(encoder.module, encoder.embed_dim, len(task["classes"]), frozen=False)
    state = regimes[train_regime]["state"]
    target = model.head if protocol == "linear_aug" else model
    try:
        target.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"weights file {path}: {err}") from err
    model.eval()
    info = {"path": str(path), "sha256": record["sha256"], "train_regime": train_regime, "seed": record["seed"],
            "best_epoch": regimes[train_regime]["best_epoch"],
            "best_val_loss": regimes[train_regime]["best_val_loss"], "encoder_weights": record["encoder_weights"]}
    return model, encoder, info


# -- one run --------------------------------------------------------------------------------------------------

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
        _set_rng_state(state["rng"], dev)
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
                    "best_epoch": best_epoch, "log": history, "compute": acc, "rng": _rng_state(dev)})
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


# -- one (encoder, task, protocol, seed) job: every training regime ------------------------------------------

def _rows(split: pd.DataFrame, id_to_row: dict, part: str, balanced: bool) -> tuple[pd.DataFrame, np.ndarray]:
    rows = regime_rows(split, part, balanced)
    missing = [i for i in rows["image_id"] if i not in id_to_row]
    if missing:
        raise KeyError(f"{len(missing)} images of the {part} split are not in the image cache, e.g. {missing[:3]}")
    return rows, np.fromiter((id_to_row[i] for i in rows["image_id"]), dtype=np.int64, count=len(rows))


def run_fingerprint(**parts) -> str:
    from retinabench.workflow_plan import package_code_hash
    parts["code"] = package_code_hash("protocols", "data/image_dataset.py", "models")
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _ids_hash(ids) -> str:
    return hashlib.sha256("\n".join(map(str, ids)).encode()).hexdigest()[:16]


@dataclass
class FinetuneOutput:
    predictions: pd.DataFrame
    log: pd.DataFrame
    compute: pd.DataFrame
    weights: dict = field(default_factory=dict)  # with keep_weights: what save_weights stores


def run_finetune(array_path: str | os.PathLike, index: pd.DataFrame, split: pd.DataFrame, task: dict,
                 encoder_entry: dict, *, protocol: str, seed: int, regimes: list[str], cfg: TrainConfig,
                 ckpt_dir: str | os.PathLike | None = None, threads: int = 1, encoder=None,
                 on_epoch_end: Callable[[str, int], None] | None = None,
                 log: Callable[[str], None] = print, keep_weights: bool = False) -> FinetuneOutput:
    """Train ``protocol`` with ``seed`` once per training regime of ``regimes``; predict val and test sets.

    Regime ``a-b`` as for the frozen protocols: ``a`` = training (and validation) data, u: all / b: the balanced
    rows; ``b`` = test data. ``encoder``: an already built Encoder (else built from ``encoder_entry``).
    ``keep_weights``: also return each training regime's best weights (``FinetuneOutput.weights``, for
    :func:`save_weights`).
    """
    from retinabench.models.encoder import build_encoder
    if protocol not in FINETUNE_PROTOCOLS:
        raise ValueError(f"unknown fine-tuning protocol {protocol!r}; expected one of {FINETUNE_PROTOCOLS}")
    parse_regimes(regimes, "fine-tuning regimes")
    encoder = encoder or build_encoder(encoder_entry)
    classes, n_classes = list(task["classes"]), len(task["classes"])
    id_to_row = dict(zip(index["image_id"], index["row"].astype(np.int64)))
    st = Path(array_path).stat()  # a rebuilt cache (same name and size, new content) gets a new mtime
    cache_id = {"array": Path(array_path).name, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    preds, logs, computes, kept = [], [], [], {}
    for train_regime in train_sides(regimes):
        bal = is_balanced(train_regime)
        tr, tr_idx = _rows(split, id_to_row, "train", bal)
        va, va_idx = _rows(split, id_to_row, "val", bal)
        weight = None if bal else class_weights(tr["y"].to_numpy(), n_classes)
        trainer = Trainer(encoder, n_classes, protocol=protocol, seed=seed, cfg=cfg, class_weight=weight)
        fp = run_fingerprint(protocol=protocol, seed=seed, train_regime=train_regime, cfg=cfg.result_fields(),
                             encoder={k: v for k, v in encoder_entry.items() if k != "notes"},
                             classes=classes, train=_ids_hash(tr["image_id"]), val=_ids_hash(va["image_id"]),
                             cache=cache_id, device=trainer.device.type, precision=trainer.precision)
        train_ds = CachedImageDataset(array_path, tr_idx, tr["y"].to_numpy(), trainer.loader_transform())
        val_ds = CachedImageDataset(array_path, va_idx, va["y"].to_numpy())
        hook = None if on_epoch_end is None else (lambda epoch, r=train_regime: on_epoch_end(r, epoch))
        res = fit(trainer, train_ds, val_ds, ckpt_dir=Path(ckpt_dir) / train_regime if ckpt_dir else None,
                  fingerprint=fp, threads=threads, on_epoch_end=hook, log=log)
        workers, pin = res.compute["num_workers"], trainer.device.type == "cuda"
        if keep_weights:
            kept[train_regime] = {"state": trainer.trainable_state(), "best_epoch": res.best_epoch,
                                  "best_val_loss": res.best_val_loss}

        def proba(rows_idx, labels):
            ds = CachedImageDataset(array_path, rows_idx, labels)
            logits, _ = trainer.logits(_loader(ds, SequentialBatchSampler(len(ds), cfg.eval_batch_size),  # noqa: B023 (called within the iteration)
                                               num_workers=workers, pin=pin, seed=seed))  # noqa: B023 (called within the iteration)
            return torch.softmax(logits.double(), dim=1).numpy()

        proba_val = proba(va_idx, va["y"].to_numpy())
        # One pass over the test images a regime needs: the balanced test rows are a subset of all test rows.
        test_regimes = trained_on(regimes, train_regime)
        need_all = any(not Regime.parse(r).test_balanced for r in test_regimes)
        te_all, te_idx = _rows(split, id_to_row, "test", not need_all)
        proba_te = proba(te_idx, te_all["y"].to_numpy())
        for regime in test_regimes:
            subset = need_all and Regime.parse(regime).test_balanced
            mask = te_all["balanced"].to_numpy() if subset else np.ones(len(te_all), bool)
            common = dict(dataset=task["dataset"], task=task["name"], encoder=encoder_entry["name"],
                          protocol=protocol, seed=seed, regime=regime)
            preds.append(predictions_frame(va["image_id"], va["y"], proba_val, classes, split="val", **common))
            preds.append(predictions_frame(te_all["image_id"][mask], te_all["y"][mask], proba_te[mask], classes,
                                           split="test", **common))
        logs.append(pd.DataFrame(res.log).assign(encoder=encoder_entry["name"], task=task["name"], protocol=protocol,
                                                 seed=seed, train_regime=train_regime))
        computes.append({"encoder": encoder_entry["name"], "task": task["name"], "protocol": protocol, "seed": seed,
                         "train_regime": train_regime, "n_train": len(tr), "n_val": len(va), **res.compute})
    weights = {}
    if keep_weights:
        weights = {"regimes": kept, "embed_dim": encoder.embed_dim, "encoder_weights": dict(encoder.weights),
                   "frozen_encoder_sha256": module_digest(encoder.module) if protocol == "linear_aug" else None}
    return FinetuneOutput(pd.concat(preds, ignore_index=True), pd.concat(logs, ignore_index=True),
                          pd.DataFrame(computes), weights)

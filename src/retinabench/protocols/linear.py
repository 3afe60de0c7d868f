"""Linear probe on cached features: one torch linear layer, AdamW, warm-up + cosine, best validation loss.

Features are standardised with training-set statistics (an affine map, so the probe stays linear) to make one
learning rate work across encoders whose embedding scales differ by orders of magnitude.
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from retinabench.protocols.common import class_weights, make_scheduler
from retinabench.settings.protocols import LinearSettings


def train_linear_probe(train_x, train_y, val_x, val_y, n_classes: int, *, seed: int, weighted: bool,
                       cfg: LinearSettings) -> tuple[nn.Module, list[dict]]:
    """Train on (train_x, train_y); return the head (with standardisation folded in) of the best val epoch."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    xt = torch.as_tensor(train_x, dtype=torch.float32)
    # Variance floored at 1 % of the mean feature variance: a feature that is (nearly) constant on the training
    # images, e.g. a dead ReLU channel, must not be blown up by 1/std on validation or test images.
    var = xt.var(0)
    mean, std = xt.mean(0), (var + 0.01 * var.mean() + 1e-12).sqrt()
    xt = (xt - mean) / std
    yt = torch.as_tensor(np.array(train_y), dtype=torch.long)
    xv = (torch.as_tensor(val_x, dtype=torch.float32) - mean) / std
    yv = torch.as_tensor(np.array(val_y), dtype=torch.long)
    head = nn.Linear(xt.shape[1], n_classes)
    # Zero init (the objective is convex, so nothing is lost): a feature that never varies on the training set
    # then keeps weight 0 instead of a random one that would fire on unseen images.
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    weight = torch.as_tensor(class_weights(train_y, n_classes), dtype=torch.float32) if weighted else None
    loss_fn = nn.CrossEntropyLoss(weight=weight)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = cfg.epochs * cfg.steps_per_epoch
    sched = make_scheduler(opt, total, cfg.warmup_frac)
    best_state: dict[str, Any] | None = None
    best_loss, log = float("inf"), []
    perm, pos, step = torch.randperm(len(xt), generator=gen), 0, 0
    for epoch in range(cfg.epochs):
        head.train()
        running = 0.0
        for _ in range(cfg.steps_per_epoch):
            if pos + cfg.batch_size > len(perm):  # reshuffle when an epoch over the data is used up
                perm, pos = torch.randperm(len(xt), generator=gen), 0
            idx = perm[pos:pos + cfg.batch_size]
            pos += cfg.batch_size
            loss = loss_fn(head(xt[idx]), yt[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            running += loss.item()
        head.eval()
        with torch.no_grad():
            val_loss = loss_fn(head(xv), yv).item()
        improved = val_loss < best_loss
        if improved:
            best_loss, best_state = val_loss, copy.deepcopy(head.state_dict())
        log.append({"epoch": epoch, "step": step, "lr": sched.get_last_lr()[0],
                    "train_loss": running / cfg.steps_per_epoch, "val_loss": val_loss, "best": improved})
    if best_state is None:
        raise FloatingPointError("linear head: the validation loss was never finite; no epoch to keep")
    head.load_state_dict(best_state)
    # Fold standardisation into the layer: W' = W / std, b' = b - W' @ mean.
    folded = nn.Linear(xt.shape[1], n_classes)
    with torch.no_grad():
        folded.weight.copy_(head.weight / std)
        folded.bias.copy_(head.bias - folded.weight @ mean)
    return folded.eval(), log


def linear_predict_proba(head: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch.softmax(head(torch.as_tensor(x, dtype=torch.float32)), dim=1).double().numpy()


# -- the protocol registry's interface (retinabench.protocols.registry) ------------------------------------------
def fit(train_x, train_y, val_x, val_y, n_classes: int, *, seed: int, balanced: bool, settings: LinearSettings):
    """The head of the best validation epoch and its training log; class-weighted loss unless trained on the
    balanced undersample."""
    return train_linear_probe(train_x, train_y, val_x, val_y, n_classes, seed=seed, weighted=not balanced,
                              cfg=settings)


def predict(head: nn.Module, x: np.ndarray) -> np.ndarray:
    return linear_predict_proba(head, x)

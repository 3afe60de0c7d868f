"""The paper's two-stage learning-rate sweep, per encoder, and the learning-rate sensitivity table.

Stage 1: augmented linear probing (``linear_aug``) over ``lr_classifier`` (default {1e-4, 1e-3, 1e-2}).
Stage 2: full fine-tuning (``finetune``) over ``lr_encoder`` (default {1e-7, …, 1e-3}) with stage 1's
``lr_classifier`` fixed. Both run on the configured sweep task with the fine-tuning protocol's settings.

Selection criterion (both stages): the lowest **validation loss** — each run's best-epoch validation loss (the
loss its returned weights have), averaged over the sweep's seeds (and training regimes); ties go to the smaller
learning rate. A run whose loss went non-finite before any finite validation loss counts as +inf.

The chosen pair is one JSON artifact per encoder that every fine-tuning job of that encoder takes as input. The
same two stages on a second (sensitivity) task feed the sensitivity table: per encoder, task and stage, the
metric at the optimal learning rate vs the mean over the sub-optimal ones (see :func:`sensitivity_table`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from retinabench.protocols.finetune import DivergedError, TrainConfig, run_finetune
from retinabench.regimes import train_sides
from retinabench.settings.finetune import SWEEP_STAGES as STAGES

CRITERION = "lowest seed-mean best-epoch validation loss; ties -> smaller learning rate"

RUNS_COLUMNS = ["encoder", "task", "protocol", "stage", "lr_name", "lr", "lr_encoder", "lr_classifier", "seed",
                "train_regime", "best_val_loss", "best_epoch", "diverged", "train_seconds"]
SENSITIVITY_COLUMNS = ["encoder", "task", "stage", "protocol", "lr_name", "regime", "split", "metric", "lr_optimal",
                       "value_optimal", "value_suboptimal_mean", "value_suboptimal_sd", "n_suboptimal",
                       "n_diverged", "drop"]


def choose_lr(runs: pd.DataFrame) -> tuple[float, pd.DataFrame]:
    """The learning rate with the lowest mean best validation loss (ties: the smaller lr) and the per-lr table."""
    if runs.empty:
        raise ValueError("choose_lr: no sweep runs")
    if runs["lr_name"].nunique() != 1:
        raise ValueError(f"choose_lr: runs of several sweeps {sorted(runs['lr_name'].unique())}")
    per_lr = (runs.assign(best_val_loss=runs["best_val_loss"].astype(float).fillna(np.inf))
              .groupby("lr", as_index=False)
              .agg(val_loss=("best_val_loss", "mean"), n_runs=("best_val_loss", "size"),
                   n_diverged=("diverged", "sum")))
    per_lr = per_lr.sort_values(["val_loss", "lr"], kind="stable").reset_index(drop=True)
    if not np.isfinite(per_lr["val_loss"].iloc[0]):
        raise DivergedError(f"every learning rate of the {runs['lr_name'].iloc[0]} sweep diverged: "
                            f"{per_lr['lr'].tolist()}")
    return float(per_lr["lr"].iloc[0]), per_lr.sort_values("lr").reset_index(drop=True)


def run_sweep_stage(stage: int, array_path, index: pd.DataFrame, split: pd.DataFrame, task: dict,
                    encoder_entry: dict, *, grid: list[float], seeds: list[int], regimes: list[str],
                    cfg: TrainConfig, lr_classifier: float | None = None, ckpt_dir=None, threads: int = 1,
                    log: Callable[[str], None] = print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every lr of ``grid`` × seed for one stage; returns (sweep metrics: METRICS + lr/lr_name/stage, runs)."""
    from retinabench.metrics.classification import metrics_table
    from retinabench.models.encoder import build_encoder, is_random_init
    protocol, lr_name = STAGES[stage]
    if stage == 2 and lr_classifier is None:
        raise ValueError("sweep stage 2 needs the lr_classifier chosen by stage 1")
    # One build per seed for a random-init encoder (its weights depend on the seed, as in fine-tuning), else one.
    shared = None if is_random_init(encoder_entry) else build_encoder(encoder_entry)
    encoders = {s: shared if shared is not None else build_encoder(encoder_entry, seed=s) for s in seeds}
    from retinabench.progress import Progress
    metrics, runs = [], []
    bar = Progress(len(grid) * len(seeds), f"sweep stage {stage} {encoder_entry['name']}/{task['name']}",
                   unit="runs")
    for lr in grid:
        lrs = {"lr_classifier": lr} if stage == 1 else {"lr_encoder": lr, "lr_classifier": lr_classifier}
        run_cfg = cfg.model_copy(update=lrs)
        for seed in seeds:
            bar_note = f"{lr_name}={lr:g} seed {seed}"
            where = Path(ckpt_dir) / f"{lr_name}_{lr:g}" / f"seed{seed}" if ckpt_dir else None
            try:
                out = run_finetune(array_path, index, split, task, encoder_entry, protocol=protocol, seed=seed,
                                   regimes=regimes, cfg=run_cfg, ckpt_dir=where, threads=threads, encoder=encoders[seed],
                                   log=log)
            except DivergedError as err:
                # A diverged learning rate is a sweep result (val loss +inf), not a failure of the sweep.
                log(f"sweep stage {stage}: {lr_name}={lr:g} seed {seed} diverged: {err}")
                for train_regime in train_sides(regimes):
                    runs.append({"encoder": encoder_entry["name"], "task": task["name"], "protocol": protocol,
                                 "seed": seed, "train_regime": train_regime, "best_val_loss": np.inf,
                                 "best_epoch": -1, "diverged": True, "train_seconds": np.nan, **lrs})
                bar.update(note=f"{bar_note}: diverged")
                continue
            m = metrics_table(out.predictions, {task["name"]: task})
            metrics.append(m.assign(lr=lr, lr_name=lr_name, stage=stage))
            runs.extend(out.compute[["encoder", "task", "protocol", "seed", "train_regime", "best_val_loss",
                                     "best_epoch", "diverged", "train_seconds"]].assign(**lrs).to_dict("records"))
            bar.update(note=bar_note)
    runs_df = pd.DataFrame(runs)
    runs_df = runs_df.assign(stage=stage, lr_name=lr_name, lr=runs_df[lr_name],
                             lr_encoder=runs_df.get("lr_encoder", np.nan))[RUNS_COLUMNS]
    runs_df = runs_df.sort_values(["lr", "seed", "train_regime"]).reset_index(drop=True)
    if not metrics:
        raise DivergedError(f"sweep stage {stage} of {encoder_entry['name']} on {task['name']}: every run diverged")
    return pd.concat(metrics, ignore_index=True), runs_df


def chosen_record(encoder: str, task: str, runs1: pd.DataFrame, runs2: pd.DataFrame) -> dict:
    """The chosen-LR artifact: both choices, the criterion and the per-lr validation losses behind them."""
    lr_c, t1 = choose_lr(runs1)
    lr_e, t2 = choose_lr(runs2)
    fixed = sorted(set(runs2["lr_classifier"].astype(float)))
    if fixed != [lr_c]:
        raise ValueError(f"sweep of {encoder}: stage 2 ran with lr_classifier {fixed}, but stage 1 chooses {lr_c} "
                         f"(stage 2 is out of date)")
    return {"encoder": encoder, "task": task, "lr_classifier": lr_c, "lr_encoder": lr_e, "criterion": CRITERION,
            "stage1": t1.to_dict("records"), "stage2": t2.to_dict("records")}


def read_chosen(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"chosen learning rates {path} do not exist (run the sweep first)")
    rec = json.loads(path.read_text())
    missing = [k for k in ("encoder", "lr_classifier", "lr_encoder") if k not in rec]
    if missing:
        raise KeyError(f"{path}: chosen learning-rate record lacks {missing}")
    return rec


def sensitivity_table(metrics: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per (encoder, task, stage, regime, split, metric): the seed-mean value at the optimal lr (chosen by
    validation loss, as the sweep) vs the mean (and sd) over the other lrs that did not diverge; ``drop`` =
    optimal − sub-optimal mean. Columns: :data:`SENSITIVITY_COLUMNS`."""
    rows = []
    for (encoder, task, stage), r in runs.groupby(["encoder", "task", "stage"], sort=True):
        lr_opt, _ = choose_lr(r)
        m = metrics[(metrics["encoder"] == encoder) & (metrics["task"] == task) & (metrics["stage"] == stage)]
        n_div = int((r.groupby("lr")["diverged"].all()).sum())
        means = m.groupby(["regime", "split", "metric", "lr"])["value"].mean().reset_index()
        for (regime, split, metric), g in means.groupby(["regime", "split", "metric"], sort=True):
            opt = g.loc[np.isclose(g["lr"], lr_opt, rtol=1e-12, atol=0), "value"]
            sub = g.loc[~np.isclose(g["lr"], lr_opt, rtol=1e-12, atol=0), "value"]
            v_opt = float(opt.iloc[0]) if len(opt) else np.nan
            rows.append({"encoder": encoder, "task": task, "stage": int(stage), "protocol": STAGES[int(stage)][0],
                         "lr_name": STAGES[int(stage)][1], "regime": regime, "split": split, "metric": metric,
                         "lr_optimal": lr_opt, "value_optimal": v_opt,
                         "value_suboptimal_mean": float(sub.mean()) if len(sub) else np.nan,
                         "value_suboptimal_sd": float(sub.std()) if len(sub) > 1 else np.nan,
                         "n_suboptimal": int(len(sub)), "n_diverged": n_div,
                         "drop": v_opt - float(sub.mean()) if len(sub) else np.nan})
    return pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)

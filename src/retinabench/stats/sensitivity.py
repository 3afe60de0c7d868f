"""Learning-rate sensitivity from a learning-rate sweep.

Two inputs are understood (:func:`choices_from_sweep`):

* the sweep's own sensitivity table (``sweep/lr_sensitivity.parquet``, :data:`SWEEP_SENSITIVITY_COLUMNS`): per
  (encoder, task, protocol, regime, split, metric) the value at the sweep's optimal lr (lowest validation loss)
  and the mean over the other lrs; used as it is, so the analysis and the sweep agree on "optimal";
* a sweep metrics table: the METRICS columns plus ``lr``. For each (task, protocol, regime, encoder) the
  *optimal* lr is then the one with the best seed-mean validation score (ties: the smaller lr) and the
  *sub-optimal* one ``reference_lr`` when given (e.g. a shared default), otherwise the worst on validation.

Test scores at both are compared: the per-encoder drop, and ranks at optimal vs sub-optimal learning rates. As in
OcularBench (Fig. 12), sensitivity is computed on the sweep task alone (``tasks``): the second swept task is the
separate transfer check of the chosen learning rate (Figs. A.14/A.15, :func:`lr_transfer_table`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from retinabench.schemas import METRICS
from retinabench.metrics.table import higher_is_better

SWEEP_COLUMNS = [*METRICS.names, "lr"]
SWEEP_SENSITIVITY_COLUMNS = ["encoder", "task", "protocol", "regime", "split", "metric", "lr_optimal",
                             "value_optimal", "value_suboptimal_mean"]
KEYS = ["task", "protocol", "regime", "encoder"]


def is_sensitivity_table(table: pd.DataFrame) -> bool:
    return all(c in table.columns for c in SWEEP_SENSITIVITY_COLUMNS)


def check_sweep(sweep: pd.DataFrame) -> None:
    if is_sensitivity_table(sweep):
        return
    missing = [c for c in SWEEP_COLUMNS if c not in sweep.columns]
    if missing:
        raise KeyError(f"learning-rate sweep table lacks column(s) {missing}; expected {SWEEP_COLUMNS} (a sweep "
                       f"metrics table) or {SWEEP_SENSITIVITY_COLUMNS} (the sweep's sensitivity table)")


def choices_from_sweep(table: pd.DataFrame, *, metric: str = "accuracy", regime: str,
                       reference_lr: float | None = None, tasks: list[str] | None = None) -> pd.DataFrame:
    """:func:`lr_choices` rows (test split) for every protocol of either sweep table format; ``tasks``: only
    these tasks (the sweep task), None: all."""
    check_sweep(table)
    if tasks is not None:
        missing = sorted(set(tasks) - set(table["task"]))
        if missing:
            raise ValueError(f"learning-rate sensitivity: the sweep table has no rows for task(s) {missing}; tasks "
                             f"present: {sorted(table['task'].unique())}")
        table = table[table["task"].isin(tasks)]
    if not is_sensitivity_table(table):
        return pd.concat([lr_choices(table, metric=metric, protocol=p, regime=regime, reference_lr=reference_lr)
                          for p in sorted(table["protocol"].unique())], ignore_index=True)
    if reference_lr is not None:
        raise ValueError("analysis.lr_reference applies to a sweep metrics table; the sweep's sensitivity table "
                         "compares the optimal lr with the mean over the other lrs")
    d = table[(table["metric"] == metric) & (table["regime"] == regime) & (table["split"] == "test")]
    d = d.dropna(subset=["value_optimal", "value_suboptimal_mean"])
    if d.empty:
        raise ValueError(f"learning-rate sensitivity table: no test {metric} rows for regime {regime!r} "
                         f"(regimes {sorted(table['regime'].unique())}, metrics {sorted(table['metric'].unique())})")
    sign = 1.0 if higher_is_better(metric) else -1.0
    out = pd.DataFrame({"task": d["task"], "protocol": d["protocol"], "regime": d["regime"], "encoder": d["encoder"],
                        "lr_optimal": d["lr_optimal"], "test_optimal": d["value_optimal"],
                        "lr_suboptimal": float("nan"), "test_suboptimal": d["value_suboptimal_mean"]})
    out["drop"] = sign * (out["test_optimal"] - out["test_suboptimal"])
    return out.assign(metric=metric).reset_index(drop=True)


def lr_choices(sweep: pd.DataFrame, *, metric: str = "accuracy", protocol: str, regime: str,
               reference_lr: float | None = None) -> pd.DataFrame:
    """Per (task, encoder): optimal and sub-optimal lr with their seed-mean test scores."""
    check_sweep(sweep)
    d = sweep[(sweep["metric"] == metric) & (sweep["protocol"] == protocol) & (sweep["regime"] == regime)]
    if d.empty:
        raise ValueError(f"learning-rate sweep: no {metric} rows for protocol {protocol!r}, regime {regime!r}; "
                         f"protocols {sorted(sweep['protocol'].unique())}, regimes {sorted(sweep['regime'].unique())}")
    means = d.groupby([*KEYS, "lr", "split"])["value"].mean().unstack("split")
    for s in ("val", "test"):
        if s not in means.columns:
            raise ValueError(f"learning-rate sweep: no {s!r} rows (needed: val selects, test reports)")
    means = means.reset_index()
    sign = 1.0 if higher_is_better(metric) else -1.0
    rows = []
    for key, g in means.groupby(KEYS, sort=True):
        g = g.sort_values("lr")
        if len(g) < 2:
            raise ValueError(f"learning-rate sweep: {dict(zip(KEYS, key))} has a single learning rate")
        val = sign * g["val"].to_numpy()
        best = g.iloc[int(val.argmax())]  # argmax/argmin return the first (smallest lr) on ties
        if reference_lr is None:
            sub = g.iloc[int(val.argmin())]
        else:
            match = g[(g["lr"] - reference_lr).abs() <= 1e-12 * max(1.0, abs(reference_lr))]
            if match.empty:
                raise ValueError(f"learning-rate sweep: reference lr {reference_lr} not swept for "
                                 f"{dict(zip(KEYS, key))}; swept: {g['lr'].tolist()}")
            sub = match.iloc[0]
        rows.append(dict(zip(KEYS, key)) | {"lr_optimal": best["lr"], "test_optimal": best["test"],
                                             "lr_suboptimal": sub["lr"], "test_suboptimal": sub["test"]})
    out = pd.DataFrame(rows)
    out["drop"] = sign * (out["test_optimal"] - out["test_suboptimal"])
    return out.assign(metric=metric)


def lr_sensitivity(choices: pd.DataFrame) -> pd.DataFrame:
    """Per encoder: mean ± sd over tasks of the test-score drop from optimal to sub-optimal lr (and the tasks)."""
    g = choices.groupby("encoder")
    return pd.DataFrame({"mean_drop": g["drop"].mean(), "sd_drop": g["drop"].std(), "n_tasks": g["drop"].size(),
                         "tasks": g["task"].agg(lambda t: ",".join(sorted(set(t))))}).reset_index()


LR_TRANSFER_COLUMNS = ["encoder", "protocol", "stage", "lr_name", "task", "role", "lr", "value", "n_seeds",
                       "lr_optimal_here", "lr_chosen", "chosen", "transfers", "metric", "regime", "split"]


def lr_transfer_table(grid: pd.DataFrame, sensitivity: pd.DataFrame, *, metric: str, regime: str, sweep_task: str,
                      check_task: str, check_regime: str | None = None) -> pd.DataFrame:
    """The transfer check of the chosen learning rate (OcularBench Figs. A.14/A.15): per encoder, sweep stage,
    task (the sweep task and the check task) and lr, the seed-mean validation ``metric``; ``lr_chosen`` is the
    sweep's choice on the sweep task (lowest validation loss), ``lr_optimal_here`` that task's own optimum, and
    ``transfers`` says whether the check task's optimum is the sweep task's choice.

    ``regime``: the sweep task's regime; ``check_regime``: the check task's (None: ``regime``; OcularBench checks
    on EyePACS balanced, b-b). Only the encoders swept on the check task are compared (sweep.sensitivity_encoders).
    ``grid``: the sweep's per-lr metrics (METRICS columns + lr, lr_name, stage); ``sensitivity``: the sweep's
    sensitivity table (lr_optimal per encoder, task, stage)."""
    need = [*METRICS.names, "lr", "lr_name", "stage"]
    missing = [c for c in need if c not in grid.columns]
    if missing:
        raise KeyError(f"learning-rate grid table lacks column(s) {missing}; expected {need}")
    if not is_sensitivity_table(sensitivity) or "stage" not in sensitivity.columns:
        raise KeyError("the lr transfer check needs the sweep's own sensitivity table (sweep/lr_sensitivity.parquet)")
    tasks = {sweep_task: "sweep task", check_task: "transfer check"}
    regimes = {sweep_task: regime, check_task: check_regime or regime}
    g = grid[(grid["metric"] == metric) & (grid["split"] == "val") & grid["task"].isin(list(tasks))]
    g = g[g["regime"] == g["task"].map(regimes)]
    lacking = sorted(set(tasks) - set(g["task"]))
    if lacking:
        wanted = ", ".join(f"{t} (regime {regimes[t]})" for t in lacking)
        raise ValueError(f"learning-rate transfer: no validation {metric} rows for {wanted}; tasks present: "
                         f"{sorted(grid['task'].unique())}, regimes {sorted(grid['regime'].unique())}")
    checked = set(g.loc[g["task"] == check_task, "encoder"])
    g = g[g["encoder"].isin(checked)]  # the encoders swept on both tasks
    means = (g.groupby(["encoder", "protocol", "stage", "lr_name", "task", "lr"], as_index=False)
             .agg(value=("value", "mean"), n_seeds=("seed", "nunique")))
    opt = sensitivity.drop_duplicates(["encoder", "task", "stage"]).set_index(["encoder", "task", "stage"])["lr_optimal"]

    def optimum(enc, task, stage):
        key = (enc, task, stage)
        if key not in opt.index:
            raise ValueError(f"learning-rate transfer: no chosen lr for encoder {enc!r}, task {task!r}, stage {stage}"
                             " in the sensitivity table")
        return float(opt.loc[key])

    means["role"] = means["task"].map(tasks)
    means["lr_optimal_here"] = [optimum(e, t, s) for e, t, s in zip(means["encoder"], means["task"], means["stage"])]
    means["lr_chosen"] = [optimum(e, sweep_task, s) for e, s in zip(means["encoder"], means["stage"])]
    means["chosen"] = np.isclose(means["lr"], means["lr_chosen"], rtol=1e-12, atol=0)
    check_opt = {(e, s): optimum(e, check_task, s) for e, s in zip(means["encoder"], means["stage"])}
    means["transfers"] = [bool(np.isclose(check_opt[(e, s)], c, rtol=1e-12, atol=0))
                          for e, s, c in zip(means["encoder"], means["stage"], means["lr_chosen"])]
    out = means.assign(metric=metric, regime=means["task"].map(regimes), split="val")
    return out.sort_values(["encoder", "stage", "role", "lr"])[
        LR_TRANSFER_COLUMNS].reset_index(drop=True)


def lr_mean_ranks(choices: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Encoders' mean ranks over tasks at their optimal and at their sub-optimal learning rates (ranks within
    each task among all encoders, 1 = best, ties averaged)."""
    sign = 1.0 if higher_is_better(str(choices["metric"].iloc[0])) else -1.0
    out = []
    for col in ("test_optimal", "test_suboptimal"):
        r = choices.groupby(["task", "protocol", "regime"])[col].transform(
            lambda s: rankdata(-sign * s.to_numpy(), method="average"))
        out.append(r.groupby(choices["encoder"]).mean())
    return out[0], out[1]

"""Seeded synthetic metrics tables (and registry metadata) for tests and the analysis-scale benchmark.

Scores follow encoder skill + task difficulty + protocol/regime offsets + noise, so rankings have structure
(domain groups differ, protocols mostly agree) without being identical.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from retinabench.metrics.table import METRICS_TABLE as ALL_METRICS
from retinabench.metrics.table import higher_is_better
from retinabench.regimes import Regime
from retinabench.schemas import METRICS
DOMAINS = ("natural", "cfp", "oct", "cfp+oct", "pathology", "radiology", "none")
# (method, method_group, pretraining_data)
METHODS: tuple[tuple[str, str, list[str]], ...] = (
    ("supervised", "supervised", ["imagenet-1k"]), ("MAE", "masked_modelling", ["meh-midas-cfp"]),
    ("DINOv2 self-distillation", "self_distillation", ["lvd-142m"]), ("CLIP", "image_text", ["wit-400m"]),
    ("random initialisation", "none", []))
FAMILIES = ("dr_staging", "glaucoma", "dme", "amd", "myopia")
SIZE_OF_PARAMS = {5.5: "tiny", 22.0: "small", 86.6: "base", 303.3: "large", 632.0: "huge"}


@dataclass
class SyntheticStudy:
    metrics: pd.DataFrame
    encoders: dict[str, dict]   # domain, method, method_group, pretraining_data, exposure, params_m, size_class
    tasks: dict[str, dict]      # dataset, modality, family
    datasets: dict[str, dict]   # web_exposure_risk


def synthetic_registries(n_encoders: int, n_tasks: int, *, n_datasets: int | None = None, seed: int = 0):
    rng = np.random.default_rng(seed)
    n_datasets = n_datasets or max(1, (n_tasks + 2) // 3)
    datasets = {f"ds{i:02d}": {"web_exposure_risk": "high" if i % 3 == 0 else "low"} for i in range(n_datasets)}
    tasks = {}
    for i in range(n_tasks):
        ds = f"ds{i % n_datasets:02d}"
        tasks[f"task{i:02d}"] = {"dataset": ds, "modality": "cfp" if i % 3 else "oct",
                                 "family": FAMILIES[i % len(FAMILIES)]}
    encoders = {}
    for i in range(n_encoders):
        domain = DOMAINS[i % len(DOMAINS)]
        exposure = [f"ds{j:02d}" for j in range(n_datasets) if domain in ("cfp", "cfp+oct") and j % 4 == 1]
        params = float(np.round(rng.choice([5.5, 22, 86.6, 303.3, 632]), 1))
        method, group, data = METHODS[i % len(METHODS)]
        encoders[f"enc{i:02d}"] = {"domain": domain, "method": method, "method_group": group,
                                   "pretraining_data": list(data), "exposure": exposure, "params_m": params,
                                   "size_class": SIZE_OF_PARAMS[params]}
    return encoders, tasks, datasets


def synthetic_metrics(encoders: dict[str, dict], tasks: dict[str, dict], *, protocols=("knn", "linear", "logreg"),
                      seeds=(0, 1, 2), regimes=("u-u", "b-b"), metrics=ALL_METRICS, splits=("val", "test"),
                      seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    enc = list(encoders)
    skill = {e: rng.normal(0.0, 0.05) + (0.04 if encoders[e]["domain"] in ("cfp", "oct", "cfp+oct") else 0.0)
             - (0.12 if encoders[e]["domain"] == "none" else 0.0) for e in enc}
    base = {t: rng.uniform(0.6, 0.85) for t in tasks}
    proto_off = {p: o for p, o in zip(protocols, np.linspace(-0.03, 0.04, len(protocols)))}
    regime_off = {"u-u": 0.02, "u-b": -0.02, "b-b": 0.0, "b-u": -0.01}
    idx = pd.MultiIndex.from_product([list(tasks), enc, list(protocols), list(seeds), list(regimes), list(splits),
                                      list(metrics)], names=["task", "encoder", "protocol", "seed", "regime",
                                                             "split", "metric"])
    df = idx.to_frame(index=False)
    n = len(df)
    interaction = {(e, p): rng.normal(0, 0.02) for e in enc for p in protocols}
    task_fit = {(e, t): rng.normal(0, 0.04) for e in enc for t in tasks}
    value = (df["task"].map(base).to_numpy() + df["encoder"].map(skill).to_numpy()
             + df["protocol"].map(proto_off).to_numpy() + df["regime"].map(regime_off).to_numpy()
             + np.array([interaction[(e, p)] for e, p in zip(df["encoder"], df["protocol"])])
             + np.array([task_fit[(e, t)] for e, t in zip(df["encoder"], df["task"])])
             + rng.normal(0, 0.01, n))
    lower_better = ~df["metric"].map(higher_is_better).astype(bool).to_numpy()  # ECE: skill lowers it
    value = np.where(lower_better, np.clip(0.3 - 0.3 * value, 0.0, 1.0), np.clip(value, 0.0, 1.0))
    df["value"] = value
    df["dataset"] = df["task"].map({t: m["dataset"] for t, m in tasks.items()})
    df["n"] = 200
    return df[METRICS.names]


def synthetic_study(n_encoders: int = 6, n_tasks: int = 6, *, seed: int = 0, **kwargs) -> SyntheticStudy:
    encoders, tasks, datasets = synthetic_registries(n_encoders, n_tasks, seed=seed)
    return SyntheticStudy(synthetic_metrics(encoders, tasks, seed=seed, **kwargs), encoders, tasks, datasets)


def synthetic_subgroups(metrics: pd.DataFrame, *, seed: int = 0) -> pd.DataFrame:
    """Subgroup table from a metrics table: each row split into age <60/>=60 and sex female/male groups."""
    rng = np.random.default_rng(seed)
    base = metrics[metrics["split"] == "test"]
    frames = []
    for attribute, groups, shift in (("age", ["<60", ">=60"], -0.03), ("sex", ["female", "male"], 0.01)):
        for g, s in zip(groups, (0.0, shift)):
            d = base.copy()
            d["value"] = np.clip(d["value"] + s + rng.normal(0, 0.01, len(d)), 0, 1)
            frames.append(d.assign(attribute=attribute, group=g))
    return pd.concat(frames, ignore_index=True)


def synthetic_lr_sweep(metrics: pd.DataFrame, *, lrs=(1e-4, 1e-3, 1e-2), protocol: str = "linear",
                       seed: int = 0) -> pd.DataFrame:
    """LR-sweep table from a metrics table's rows of one protocol: the score peaks at an encoder-specific lr."""
    rng = np.random.default_rng(seed)
    base = metrics[metrics["protocol"] == protocol]
    best = {e: rng.integers(len(lrs)) for e in base["encoder"].unique()}
    frames = []
    for i, lr in enumerate(lrs):
        d = base.copy()
        dist = np.abs(i - d["encoder"].map(best).to_numpy())
        d["value"] = np.clip(d["value"] - 0.04 * dist + rng.normal(0, 0.005, len(d)), 0, 1)
        frames.append(d.assign(lr=lr))
    return pd.concat(frames, ignore_index=True)


def synthetic_sweep(encoders: dict[str, dict], tasks: list[str], *, seed: int = 0,
                    metrics=("accuracy", "balanced_accuracy", "auroc"), check_encoders: list[str] | None = None,
                    check_regime: str = "u-u") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-lr sweep metrics, sensitivity table) in the formats of the sweep's own tables (sweep/lr_sweep_metrics
    and sweep/lr_sensitivity): stage 1 linear_aug over lr_classifier, stage 2 finetune over lr_encoder, seed 0,
    regime u-u; scores peak at an encoder- and task-specific lr. The optimum stands in for the lowest validation
    loss (the first of ``tasks`` is the sweep task, the second the transfer check, swept for ``check_encoders``
    only (None: all) in ``check_regime``, as sweep.sensitivity_encoders / sensitivity_regimes)."""
    rng = np.random.default_rng(seed)
    stages = {1: ("linear_aug", "lr_classifier", (1e-4, 1e-3, 1e-2)), 2: ("finetune", "lr_encoder", (1e-6, 1e-5, 1e-4))}
    grid, sens = [], []
    for e in encoders:
        skill = rng.uniform(0.6, 0.85)
        for stage, (protocol, lr_name, lrs) in stages.items():
            best = int(rng.integers(len(lrs)))
            for k, t in enumerate(tasks):
                if k == 1 and check_encoders is not None and e not in check_encoders:
                    continue
                regime = check_regime if k == 1 else "u-u"
                best_t = best if rng.random() < 0.7 else int(rng.integers(len(lrs)))
                values = {}
                for i, lr in enumerate(lrs):
                    for split in ("val", "test"):
                        for m in metrics:
                            v = float(np.clip(skill - 0.06 * abs(i - best_t) + rng.normal(0, 0.005), 0, 1))
                            values[(split, m, lr)] = v
                            grid.append({"dataset": "ds00", "task": t, "encoder": e, "protocol": protocol, "seed": 0,
                                         "regime": regime, "split": split, "metric": m, "value": v, "n": 200,
                                         "lr": lr, "lr_name": lr_name, "stage": stage})
                for split in ("val", "test"):
                    for m in metrics:
                        opt = values[(split, m, lrs[best_t])]
                        sub = [values[(split, m, lr)] for lr in lrs if lr != lrs[best_t]]
                        sens.append({"encoder": e, "task": t, "stage": stage, "protocol": protocol, "lr_name": lr_name,
                                     "regime": regime, "split": split, "metric": m, "lr_optimal": lrs[best_t],
                                     "value_optimal": opt, "value_suboptimal_mean": float(np.mean(sub)),
                                     "value_suboptimal_sd": float(np.std(sub, ddof=1)), "n_suboptimal": len(sub),
                                     "n_diverged": 0, "drop": opt - float(np.mean(sub))})
    return pd.DataFrame(grid), pd.DataFrame(sens)


def synthetic_baselines(tasks: dict[str, dict], *, regimes=("u-u", "b-b"), splits=("val", "test"), n: int = 200,
                        seed: int = 0) -> pd.DataFrame:
    """A baselines table (stats.baselines.COLUMNS) for synthetic binary tasks: majority shares 0.5–0.8."""
    from retinabench.stats.baselines import COLUMNS, chance_levels
    rng = np.random.default_rng(seed)
    rows = []
    for t, m in tasks.items():
        share = float(np.round(rng.uniform(0.5, 0.8), 3))
        for regime in regimes:
            s = 0.5 if Regime.parse(regime).test_balanced else share
            chance = chance_levels(np.array([s, 1 - s]))
            majority = {"accuracy": s, "balanced_accuracy": 0.5, "auroc": 0.5, "auprc": 1 - s,
                        "f1_macro": s / (1 + s), "kappa": 0.0, "ece": 0.0, "ece_top_label": 0.0}
            for split in splits:
                for metric in ALL_METRICS:
                    rows.append({"dataset": m["dataset"], "task": t, "regime": regime, "split": split,
                                 "metric": metric, "majority": majority[metric], "chance": chance[metric], "n": n,
                                 "n_classes": 2, "majority_class": "no", "majority_share": s})
    return pd.DataFrame(rows, columns=COLUMNS)

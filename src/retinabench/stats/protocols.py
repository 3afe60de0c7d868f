"""Protocol comparisons on scores: the fine-tuning minus linear-probe gap per encoder (vs parameter count)."""
from __future__ import annotations

import pandas as pd

from retinabench.stats.ranks import seed_means


def ft_lp_gap(metrics: pd.DataFrame, encoders: dict[str, dict], *, finetune: str = "finetune",
              linear: str = "linear", regime: str = "u-u", metric: str = "accuracy",
              split: str = "test") -> pd.DataFrame:
    """Per encoder: mean over tasks of (fine-tuning − linear-probe) seed-mean score, its sd, the number of tasks
    both protocols cover, and the parameter count (millions) from the registry."""
    means = seed_means(metrics, metric, split)
    means = means[means["regime"] == regime]
    have = set(means["protocol"])
    missing = [p for p in (finetune, linear) if p not in have]
    if missing:
        raise ValueError(f"ft_lp_gap: the metrics table has no {split} {metric} rows for protocol(s) {missing} in "
                         f"regime {regime!r}; protocols present: {sorted(have)}")
    wide = means.pivot_table(index=["task", "encoder"], columns="protocol", values="score")[[finetune, linear]]
    wide = wide.dropna()
    if wide.empty:
        raise ValueError(f"ft_lp_gap: no (task, encoder) has both {finetune!r} and {linear!r} scores")
    wide["gap"] = wide[finetune] - wide[linear]
    g = wide.reset_index().groupby("encoder")
    out = pd.DataFrame({"gap": g["gap"].mean(), "sd": g["gap"].std(), "n_tasks": g["task"].nunique(),
                        finetune: g[finetune].mean(), linear: g[linear].mean()}).reset_index()
    params = []
    for e in out["encoder"]:
        if e not in encoders or encoders[e].get("params_m") is None:
            raise KeyError(f"ft_lp_gap: encoder {e!r} has no params_m in the registry")
        params.append(float(encoders[e]["params_m"]))
    out["params_m"] = params
    return out.assign(metric=metric, regime=regime, split=split).sort_values("encoder").reset_index(drop=True)

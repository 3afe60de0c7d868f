"""Prompt tables: prompt-variant sensitivity (how much a prompted model's metric moves across paraphrased prompt
sets) and the rendered-prompt snapshot the tests pin."""
from __future__ import annotations

from typing import Iterable

from retinabench.prompts import PromptRegistry, split_protocol


def prompt_sensitivity(metrics, metric: str = "auroc", protocols: Iterable[str] = ("zeroshot", "zeroshot_focus",
                                                                                    "mllm", "mllm_renorm"),
                       default_label: str = "default"):
    """Spread of a metric across prompt sets per model × task × base protocol (× regime, split; seeds averaged):
    one row each with the number of prompt sets, min, max, range, sd and the set names at the extremes.

    ``metrics``: a tidy metrics table (``metrics.parquet``) holding ``<protocol>`` and ``<protocol>@<set>`` rows.
    """
    import numpy as np
    import pandas as pd
    m = metrics[metrics["metric"] == metric].copy()
    split = m["protocol"].map(split_protocol)
    m["base_protocol"] = [b for b, _ in split]
    m["prompt_set"] = [s or default_label for _, s in split]
    m = m[m["base_protocol"].isin(list(protocols))]
    keys = ["dataset", "task", "encoder", "base_protocol", "regime", "split"]
    cols = [*keys, "metric", "n_prompt_sets", "min", "max", "range", "sd", "argmin", "argmax", "prompt_sets"]
    if m.empty:
        return pd.DataFrame(columns=cols)
    per_set = m.groupby([*keys, "prompt_set"], sort=True)["value"].mean().reset_index()
    rows = []
    for key, g in per_set.groupby(keys, sort=True):
        v = g["value"].to_numpy(dtype=float)
        ok = np.isfinite(v)
        rows.append({**dict(zip(keys, key)), "metric": metric, "n_prompt_sets": int(len(g)),
                     "min": float(np.min(v[ok])) if ok.any() else float("nan"),
                     "max": float(np.max(v[ok])) if ok.any() else float("nan"),
                     "range": float(np.ptp(v[ok])) if ok.any() else float("nan"),
                     "sd": float(np.std(v[ok], ddof=1)) if ok.sum() > 1 else float("nan"),
                     "argmin": g["prompt_set"].to_numpy()[ok][np.argmin(v[ok])] if ok.any() else None,
                     "argmax": g["prompt_set"].to_numpy()[ok][np.argmax(v[ok])] if ok.any() else None,
                     "prompt_sets": ",".join(g["prompt_set"])})
    return pd.DataFrame(rows, columns=cols)


# --- snapshots ------------------------------------------------------------------------------------------------
SNAPSHOT_ROWS = ({"image_id": "example_1", "sex": "female", "age": 61.0},
                 {"image_id": "example_2", "sex": None, "age": float("nan")})


def render_snapshot(registry: PromptRegistry, tasks: Iterable[dict]) -> str:
    """Every prompt the registry gives for ``tasks``, rendered as text (what the snapshot test pins): zero-shot
    class texts, and each question for example metadata rows (an image with sex and age, one with neither)."""
    out = []
    for task in tasks:
        for s in registry.sets_for("zeroshot", task):
            zp = registry.zeroshot(s, task)
            out.append(f"### zeroshot/{s}/{task['name']}")
            for c, texts in zp.as_dict().items():
                out += [f"[{c}] {t}" for t in texts]
        for s in registry.sets_for("mllm", task):
            p = registry.mllm(s, task)
            out.append(f"### mllm/{s}/{task['name']} (yes = {p.yes_class!r})")
            if p.system:
                out.append(f"[system] {p.system}")
            rows = SNAPSHOT_ROWS if p.placeholders else SNAPSHOT_ROWS[:1]
            for row in rows:
                out.append(f"[{row['image_id']}]")
                out.append(p.render(row))
    return "\n".join(out) + "\n"

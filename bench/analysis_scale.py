"""Time the whole analysis layer (all statistics + all figures and tables) on a synthetic metrics table the size
of the paper's full grid: 34 encoders × 39 tasks × 4 protocols × 3 seeds × 2 regimes, all 8 metrics, val and
test (~500k rows), plus synthetic subgroup and learning-rate-sweep tables so every family runs. One process,
the same family functions the Snakemake stages call. Goal: ≤ 20 s on 2 cores.

    python bench/analysis_scale.py [--out DIR] [--encoders 34 --tasks 39]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (default: a temporary one, removed afterwards)")
    ap.add_argument("--encoders", type=int, default=34)
    ap.add_argument("--tasks", type=int, default=39)
    ap.add_argument("--protocols", default="knn,linear,linear_aug,finetune",
                    help="comma-separated; kNN / linear probes / fine-tuning (finetune + linear_aug enable FT−LP)")
    args = ap.parse_args()

    t_start = time.perf_counter()
    from retinabench.analysis import AnalysisContext
    from retinabench.plan.family_outputs import analysis_outputs
    from retinabench.analysis.families import run_family
    from retinabench.settings import AnalysisSettings
    from retinabench.testing.synthetic import (synthetic_baselines, synthetic_metrics, synthetic_registries,
                                             synthetic_subgroups, synthetic_sweep)
    t_import = time.perf_counter() - t_start

    protocols = args.protocols.split(",")
    encoders, tasks, datasets = synthetic_registries(args.encoders, args.tasks, seed=0)
    t0 = time.perf_counter()
    metrics = synthetic_metrics(encoders, tasks, protocols=protocols, seeds=(0, 1, 2), regimes=("u-u", "b-b"))
    subgroups = synthetic_subgroups(metrics[metrics["protocol"] == protocols[-1]])
    grid, sweep = synthetic_sweep(encoders, list(tasks)[:2])
    t_synth = time.perf_counter() - t0
    print(f"synthetic metrics: {len(metrics):,} rows ({args.encoders} encoders × {args.tasks} tasks × "
          f"{len(protocols)} protocols × 3 seeds × 2 regimes × 8 metrics × 2 splits); subgroups "
          f"{len(subgroups):,}, "
          f"lr sweep {len(sweep):,} rows; built in {t_synth:.1f} s (not timed below)")

    ctx = AnalysisContext(encoders=encoders, tasks=tasks, datasets=datasets, protocols=protocols,
                          regimes=["u-u", "b-b"], ranking={"metric": "accuracy", "regime": "u-u"},
                          settings=AnalysisSettings().plain(), lr_source="sweep/lr_sensitivity.parquet",
                          lr_grid="sweep/lr_sweep_metrics.parquet", subgroup_source="reliability/subgroups.parquet",
                          sweep_tasks={"sweep": list(tasks)[0], "check": list(tasks)[1]})

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        outputs = analysis_outputs(ctx, str(root))
        tables = {"metrics": metrics, "subgroups": subgroups, "lr_sweep": sweep, "lr_grid": grid,
                  "baselines": synthetic_baselines(tasks)}
        timings = {}
        t_all, cpu_all = time.perf_counter(), time.process_time()
        for family, out in outputs.items():  # dict order: ranks first, then everything that reads them
            t = time.perf_counter()
            if family != "ranks" and "ranks" not in tables:
                import pandas as pd
                tables["ranks"] = pd.read_parquet(outputs["ranks"]["ranks"])
            fam_ctx = AnalysisContext.from_params(ctx.params_for(family))
            run_family(family, tables, fam_ctx, out)
            timings[family] = time.perf_counter() - t
        total, cpu = time.perf_counter() - t_all, time.process_time() - cpu_all
        n_files = sum(len(v) for v in outputs.values())
        for family, sec in timings.items():
            print(f"  {family:18s} {sec:6.2f} s  ({', '.join(Path(p).name for p in outputs[family].values())})")
        print(f"analysis stage: {total:.1f} s wall ({cpu:.1f} s CPU of this process) for {len(outputs)} families, "
              f"{n_files} files (+ {t_import:.1f} s imports) — goal ≤ 20 s")
        if args.out:
            print(f"outputs under {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

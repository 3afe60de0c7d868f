"""Stage entry points of the analysis layer (statistics, figures, tables); merged into retinabench.stages.STAGES.

The analysis is organised in *families*, one Snakemake job each (never one per task): ``ranks``, ``rank_figures``,
``tables``, ``cd`` (Friedman / Nemenyi / critical-difference diagrams), ``protocol_heatmap``, ``agreement``
(Spearman), ``distance`` (signed rank distances + Kruskal–Wallis), ``subsets``, ``leakage``, ``top_k``, ``ft_lp``,
``fairness``, ``sensitivity`` and ``lr_transfer``.

Each analysis runs on the protocol the paper used. The *analysis protocol* of the main rank figure, the CD
diagrams, the subset / leakage / top-k / fairness analyses is full fine-tuning (``analysis.finetune_protocol``)
when the config ranks it (it covers every encoder, task and regime), otherwise ``analysis.fallback_protocol``;
titles and tables name it and, for a fallback, why (:func:`choose_headline`). The FT − LP gap compares fine-tuning
with the paper's linear probe ``linear_aug`` (frozen encoder, same trainer, augmentations, swept lr). The fairness
family reads the reliability layer's subgroup table (``reliability/subgroup_metrics.parquet``) by default. :func:`analysis_outputs` decides, from the configuration alone, which families
this config can produce and their output paths; the Snakemake rules, the benchmark and the tests all use it.
Each family is a plain function ``family_x(inputs, ctx, out)`` (DataFrames in, files out) wrapped by a stage
``stage_x(job)`` that reads the job's inputs and writes a provenance sidecar for every output.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from retinabench.provenance import write_sidecar

# Defaults of the config's `analysis:` section (config/config.yaml documents the same values).
ANALYSIS_DEFAULTS: dict[str, Any] = {
    "alpha": 0.05,
    "split": "test",
    "alternative_metrics": ["balanced_accuracy", "auroc"],
    "protocol": None,
    "fallback_protocol": "linear",
    "subsets": {"modality": ["cfp", "oct"], "family": ["dr_staging", "glaucoma"]},
    "top_k": 8,
    "finetune_protocol": "finetune",
    "linear_protocol": "linear_aug",
    "subgroup_metrics": None,
    "subgroup_pairs": {"age": ["<60", ">=60"], "sex": ["female", "male"]},
    "lr_sweep_metrics": None,
    "lr_reference": None,
}
ENCODER_FIELDS = ("domain", "method", "exposure", "params_m", "size_class")
# The reliability layer's per-group metrics in the analysis format (workflow/rules/reliability.smk, rule
# reliability_collect): the fairness family's input unless analysis.subgroup_metrics names another table.
RELIABILITY_SUBGROUPS = "reliability/subgroup_metrics.parquet"
SWEEP_GRID = "sweep/lr_sweep_metrics.parquet"          # the sweep's per-lr metrics (finetune.smk, sweep_collect)
SWEEP_SENSITIVITY = "sweep/lr_sensitivity.parquet"
TASK_FIELDS = ("dataset", "modality", "family")
DATASET_FIELDS = ("web_exposure_risk",)
UNBALANCED, BALANCED = "u-u", "b-b"


def analysis_settings(config: dict) -> dict:
    """The `analysis:` section merged over the defaults; unknown keys are an error."""
    given = config.get("analysis") or {}
    unknown = sorted(set(given) - set(ANALYSIS_DEFAULTS))
    if unknown:
        raise KeyError(f"analysis: unknown key(s) {unknown}; known: {sorted(ANALYSIS_DEFAULTS)}")
    return {**copy.deepcopy(ANALYSIS_DEFAULTS), **copy.deepcopy(given)}


def _pick(entry: dict, fields: tuple[str, ...], what: str) -> dict:
    out = {}
    for f in fields:
        if f not in entry:
            if f in ("exposure",):
                out[f] = []
                continue
            if f in ("params_m", "family", "size_class"):
                out[f] = None
                continue
            raise KeyError(f"{what}: registry entry lacks {f!r} (needed by the analysis)")
        out[f] = entry[f]
    return out


@dataclass
class AnalysisContext:
    """What the analysis needs from the config and the registries (only registry fields the analysis reads)."""
    encoders: dict[str, dict] = field(default_factory=dict)
    tasks: dict[str, dict] = field(default_factory=dict)
    datasets: dict[str, dict] = field(default_factory=dict)
    protocols: list[str] = field(default_factory=list)      # ranked protocols: every encoder on every task
    ft_protocols: list[str] = field(default_factory=list)   # fine-tuning protocols run (maybe on a subset)
    ft_regimes: list[str] = field(default_factory=list)
    lr_source: str | None = None                            # sweep table the sensitivity family reads
    lr_encoders: int | None = None                          # encoders the sweep covers (None: all)
    lr_grid: str | None = None                              # the sweep's per-lr metrics (the transfer figure)
    sweep_tasks: dict = field(default_factory=dict)         # {"sweep": task, "check": sensitivity task or None}
    subgroup_source: str | None = None                      # subgroup table of the fairness family
    headline: dict = field(default_factory=dict)            # analysis protocol: protocol, role, note
    regimes: list[str] = field(default_factory=list)
    ranking: dict = field(default_factory=dict)        # metric, regime
    settings: dict = field(default_factory=lambda: copy.deepcopy(ANALYSIS_DEFAULTS))

    @classmethod
    def from_config(cls, config: dict, registries, *, encoders: list[str], tasks: list[str],
                    datasets: list[str]) -> "AnalysisContext":
        settings = analysis_settings(config)
        protocols = list(config["protocols"])
        # Fine-tuning (workflow/rules/finetune.smk) adds its protocols' rows to the same metrics table when
        # `finetune.enabled`. They join the rank analyses only when they cover every encoder, task and regime
        # (ranks are comparable across protocols only over the same encoders); the FT-LP gap needs no more than
        # the encoders and tasks both protocols ran.
        ft = config.get("finetune") or {}
        ft_protocols = list(ft.get("protocols") or ["finetune", "linear_aug"]) if ft.get("enabled") else []
        ft_regimes = list(ft.get("regimes") or config["regimes"])

        def covers(subset, full):
            return subset is None or set(full) <= set(subset)

        gaps = [f"{len(ft.get(k) or [])} of {len(full)} {k}" for k, full in
                (("encoders", encoders), ("tasks", tasks), ("regimes", config["regimes"]))
                if not covers(ft.get(k), full)]
        if ft_protocols and not gaps:
            protocols += [p for p in ft_protocols if p not in protocols]
        # The learning-rate sweep's per-encoder sensitivity table (finetune.smk, rule sweep_collect), unless the
        # analysis names another table; the sweep task and the transfer-check task (protocols.sweep.sweep_tasks).
        from retinabench.protocols.sweep import sweep_settings, sweep_tasks
        sweep = sweep_settings(config)
        lr_source, lr_encoders, lr_grid, swept = settings["lr_sweep_metrics"], None, None, {}
        if lr_source is None and ft_protocols and sweep["enabled"] and config["ranking"]["regime"] in sweep["regimes"]:
            lr_source, lr_encoders = SWEEP_SENSITIVITY, len(ft.get("encoders") or encoders)
            task, check = sweep_tasks(sweep, list(ft.get("tasks") or tasks))
            swept = {"sweep": task, "check": check}
            if check is not None:
                lr_grid = SWEEP_GRID
        headline = choose_headline(protocols, settings, ft_protocols=ft_protocols, coverage=gaps)
        return cls(
            encoders={e: _pick(registries.encoder(e), ENCODER_FIELDS, f"encoder {e!r}") for e in encoders},
            tasks={t: _pick(registries.task(t), TASK_FIELDS, f"task {t!r}") for t in tasks},
            datasets={d: _pick(registries.dataset(d), DATASET_FIELDS, f"dataset {d!r}") for d in datasets},
            protocols=protocols, ft_protocols=ft_protocols, ft_regimes=ft_regimes, lr_source=lr_source,
            lr_encoders=lr_encoders, lr_grid=lr_grid, sweep_tasks=swept,
            subgroup_source=settings["subgroup_metrics"] or RELIABILITY_SUBGROUPS, headline=headline,
            regimes=list(config["regimes"]), ranking=dict(config["ranking"]), settings=settings)

    # --- derived settings ---
    @property
    def metric(self) -> str:
        return self.ranking["metric"]

    @property
    def regime(self) -> str:
        return self.ranking["regime"]

    @property
    def alpha(self) -> float:
        return float(self.settings["alpha"])

    @property
    def split(self) -> str:
        return self.settings["split"]

    @property
    def metrics(self) -> list[str]:
        """Ranking metrics: the primary (ranking.metric) first, then the alternatives."""
        return list(dict.fromkeys([self.metric, *self.settings["alternative_metrics"]]))

    @property
    def analysis_protocol(self) -> dict:
        """protocol, role (headline | fallback | configured) and note of the analyses on one protocol."""
        return self.headline or choose_headline(self.protocols, self.settings, ft_protocols=self.ft_protocols)

    @property
    def focus_protocol(self) -> str:
        return self.analysis_protocol["protocol"]

    @property
    def protocol_label(self) -> str:
        """The analysis protocol as titles name it: ``finetune``, or ``linear (fallback: ...)``."""
        h = self.analysis_protocol
        return h["protocol"] if h["role"] != "fallback" else f"{h['protocol']} ({h['note']})"

    @property
    def subgroups_path(self) -> str | None:
        return self.subgroup_source or self.settings.get("subgroup_metrics")

    # --- per-family parameters (only what each family reads, so a change reruns only its dependants) ---
    def params_for(self, family: str) -> dict:
        spec = FAMILIES[family]
        out: dict[str, Any] = {}
        if spec.encoder_fields:
            out["encoders"] = {e: {f: m[f] for f in spec.encoder_fields} for e, m in self.encoders.items()}
        if spec.task_fields:
            out["tasks"] = {t: {f: m[f] for f in spec.task_fields} for t, m in self.tasks.items()}
        if spec.datasets:
            out["datasets"] = copy.deepcopy(self.datasets)
        for key in spec.context:
            out[key] = copy.deepcopy(self.analysis_protocol if key == "headline" else getattr(self, key))
        out["settings"] = {k: copy.deepcopy(self.settings[k]) for k in spec.settings}
        return _canonical(out)

    @classmethod
    def from_params(cls, params: dict) -> "AnalysisContext":
        ctx = cls()
        for key in ("encoders", "tasks", "datasets", "protocols", "ft_protocols", "ft_regimes", "regimes",
                    "ranking", "headline", "sweep_tasks"):
            if key in params:
                setattr(ctx, key, copy.deepcopy(dict(params[key]) if isinstance(params[key], dict)
                                                else list(params[key])))
        ctx.settings = Settings(copy.deepcopy(dict(params.get("settings", {}))))
        return ctx


def choose_headline(protocols: list[str], settings: dict, *, ft_protocols: list[str] = (),
                    coverage: list[str] = ()) -> dict:
    """The protocol of the single-protocol analyses: ``analysis.protocol`` when set (role ``configured``); else
    full fine-tuning (``analysis.finetune_protocol``) when it is ranked (role ``headline``, OcularBench's headline
    protocol); else ``analysis.fallback_protocol`` (role ``fallback``, the note says why)."""
    given, ft = settings["protocol"], settings["finetune_protocol"]
    if given is not None:
        if given not in protocols:
            raise ValueError(f"analysis.protocol {given!r} is not among the ranked protocols {protocols}; set it to "
                             "one of them (or null: fine-tuning when run, else analysis.fallback_protocol)")
        return {"protocol": given, "role": "configured", "note": "analysis.protocol"}
    if ft in protocols:
        return {"protocol": ft, "role": "headline", "note": "full fine-tuning, the paper's headline protocol"}
    fallback = settings["fallback_protocol"]
    if fallback not in protocols:
        raise ValueError(f"analysis.fallback_protocol {fallback!r} is not among the ranked protocols {protocols} "
                         f"(and {ft!r} is not ranked); set analysis.fallback_protocol or analysis.protocol")
    if ft not in ft_protocols:
        why = f"fallback: {ft} not run"
    else:
        why = f"fallback: {ft} covers only {', '.join(coverage)}" if coverage else f"fallback: {ft} not ranked"
    return {"protocol": fallback, "role": "fallback", "note": why}


class Settings(dict):
    """The analysis settings a job received; asking for one it was not given is a bug in FAMILIES."""

    def __missing__(self, key):
        raise KeyError(f"analysis setting {key!r} was not passed to this job (has {sorted(self)}); "
                       "add it to the family's `settings` in retinabench.stages_analysis.FAMILIES")


def _canonical(value):
    """Dicts with sorted keys, recursively: a job's params must not change when a config file lists the same
    settings in another key order (Snakemake compares params as written)."""
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


@dataclass
class Family:
    inputs: tuple[str, ...]                 # metrics | ranks | subgroups | lr_sweep | lr_grid | baselines
    encoder_fields: tuple[str, ...] = ()
    task_fields: tuple[str, ...] = ()
    datasets: bool = False
    context: tuple[str, ...] = ()           # AnalysisContext attributes: protocols, regimes, ranking
    settings: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {
    "ranks": Family(("metrics",), context=("ranking",), settings=("alternative_metrics", "split")),
    "rank_figures": Family(("ranks",), ("domain",), context=("ranking", "protocols", "headline"),
                           settings=("alternative_metrics",)),
    "tables": Family(("metrics", "ranks", "baselines"), context=("ranking",),
                     settings=("alternative_metrics", "split")),
    "cd": Family(("ranks",), ("domain",), context=("ranking", "protocols", "headline"),
                 settings=("alternative_metrics", "alpha")),
    "protocol_heatmap": Family(("ranks",), ("domain",), context=("ranking", "protocols", "regimes")),
    "agreement": Family(("ranks",), context=("ranking", "protocols", "regimes"), settings=("alpha",)),
    "distance": Family(("ranks",), ("domain", "method"), ("modality", "family"),
                       context=("ranking", "protocols", "headline"), settings=("alpha", "subsets")),
    "subsets": Family(("ranks",), ("domain",), ("modality", "family"), context=("ranking", "protocols", "headline"),
                      settings=("subsets",)),
    "leakage": Family(("ranks",), ("domain", "exposure"), ("dataset",), True, ("ranking", "protocols", "headline")),
    "top_k": Family(("ranks",), ("domain", "exposure"), ("dataset", "modality"), True,
                    ("ranking", "protocols", "headline"), ("top_k", "subsets")),
    "ft_lp": Family(("metrics",), ("domain", "params_m"), context=("ranking", "ft_protocols"),
                    settings=("split", "finetune_protocol", "linear_protocol")),
    "fairness": Family(("subgroups",), ("domain",), context=("ranking", "protocols", "headline"),
                       settings=("split", "subgroup_pairs")),
    "sensitivity": Family(("lr_sweep", "ranks"), ("domain", "method", "size_class"),
                          context=("ranking", "protocols", "sweep_tasks"), settings=("alpha", "lr_reference")),
    "lr_transfer": Family(("lr_grid", "lr_sweep", "baselines"), ("domain", "size_class"),
                          context=("ranking", "sweep_tasks")),
}


# --------------------------------------------------------------------------------------------------------------
# What this config can produce
# --------------------------------------------------------------------------------------------------------------

def _subset_comparisons_exist(ctx: AnalysisContext) -> bool:
    from retinabench.stats.distance import subset_comparisons
    return bool(subset_comparisons(ctx.tasks, ctx.settings["subsets"], metric=ctx.metric,
                                   protocol=ctx.focus_protocol, regime=ctx.regime))


def _figure(paths: dict, key: str, base: str) -> None:
    paths[key] = f"{base}.png"
    paths[key.replace("png", "pdf", 1)] = f"{base}.pdf"


def analysis_outputs(ctx: AnalysisContext, results: str, skipped: list | None = None) -> dict[str, dict[str, str]]:
    """Per family this config can produce, its named outputs (PNG keys start with ``png``, each with a ``pdf``
    twin). Families whose inputs the config does not produce are absent (no empty placeholders); each figure or
    table left out is appended to ``skipped`` (rows of :mod:`retinabench.skipped`) with the reason."""
    from retinabench.skipped import record
    from retinabench.stats.leakage import high_leakage_datasets, informative_subsets, leakage_subsets
    from retinabench.stats.subsets import task_subsets
    skipped = [] if skipped is None else skipped

    def skip(output: str, reason: str) -> None:
        skipped.append(record(output, reason))

    R, A, F = results, f"{results}/analysis", f"{results}/figures"
    k, n_tasks = len(ctx.encoders), len(ctx.tasks)
    n_prot = len(ctx.protocols)
    alts = [m for m in ctx.metrics if m != ctx.metric]
    out: dict[str, dict[str, str]] = {}
    out["ranks"] = {"ranks": f"{A}/ranks.parquet", "summary": f"{A}/rank_summary.csv"}
    figs: dict[str, str] = {}
    _figure(figs, "png", f"{F}/rank_distribution")
    for m in alts:
        _figure(figs, f"png_{m}", f"{F}/rank_distribution_{m}")
    out["rank_figures"] = figs
    out["tables"] = {"appendix_csv": f"{R}/tables/appendix.csv", "appendix_tex": f"{R}/tables/appendix.tex",
                     "ranking_csv": f"{R}/tables/ranking.csv", "ranking_tex": f"{R}/tables/ranking.tex"}
    if k >= 3 and n_tasks >= 2:
        cd = {"friedman": f"{A}/friedman.csv", "nemenyi": f"{A}/nemenyi.csv"}
        _figure(cd, "png", f"{F}/cd_diagram")
        for m in alts:
            _figure(cd, f"png_{m}", f"{F}/cd_diagram_{m}")
        out["cd"] = cd
    else:
        skip("cd_diagram", f"Friedman test, Nemenyi post-hoc and critical-difference diagrams need >= 3 encoders "
                           f"and >= 2 tasks; this run has {k} encoder(s) and {n_tasks} task(s)")
    paired_regime = any(r in ctx.regimes for r in (UNBALANCED, BALANCED))
    if n_prot >= 2 and paired_regime:
        heat: dict[str, str] = {}
        _figure(heat, "png", f"{F}/protocol_rank_heatmap")
        out["protocol_heatmap"] = heat
    else:
        skip("protocol_rank_heatmap", f"needs >= 2 ranked protocols (has {n_prot}) and regime {UNBALANCED} or "
                                      f"{BALANCED}")
    if k >= 3:
        agree = {"table": f"{A}/rank_agreement.csv"}
        if n_prot >= 2 and paired_regime:
            _figure(agree, "png_protocols", f"{F}/spearman_protocols")
        else:
            skip("spearman_protocols", f"needs >= 2 ranked protocols (has {n_prot}) and regime {UNBALANCED} or "
                                       f"{BALANCED}")
        if len(ctx.regimes) >= 2:
            _figure(agree, "png_regimes", f"{F}/spearman_regimes")
        else:
            skip("spearman_regimes", f"needs >= 2 data regimes (has {len(ctx.regimes)})")
        if len(agree) > 1:
            out["agreement"] = agree
    else:
        for name in ("spearman_protocols", "spearman_regimes"):
            skip(name, f"Spearman correlation between encoder rankings needs >= 3 encoders; this run has {k}")
    if k >= 2:
        dist = {"table": f"{A}/signed_rank_distance.csv", "kruskal": f"{A}/kruskal_wallis.csv"}
        if n_prot >= 2:
            _figure(dist, "png_protocols", f"{F}/srd_protocols")
        else:
            skip("srd_protocols", f"signed rank distances between protocols need >= 2 ranked protocols (has "
                                  f"{n_prot})")
        if _subset_comparisons_exist(ctx):
            _figure(dist, "png_subsets", f"{F}/srd_subsets")
        else:
            skip("srd_subsets", "no task subset (analysis.subsets) leaves tasks on both sides of the comparison")
        if len(dist) > 2:
            out["distance"] = dist
    else:
        for name in ("srd_protocols", "srd_subsets"):
            skip(name, f"signed rank distances need >= 2 encoders; this run has {k}")
    if task_subsets(ctx.tasks, ctx.settings["subsets"]):
        sub = {"table": f"{A}/subset_ranks.csv"}
        _figure(sub, "png", f"{F}/subset_ranks")
        out["subsets"] = sub
    else:
        skip("subset_ranks", f"no task matches a subset of analysis.subsets {ctx.settings['subsets']}")
    lsub = leakage_subsets(ctx.tasks, ctx.encoders, ctx.datasets)
    if informative_subsets(lsub, list(ctx.tasks)):
        leak = {"table": f"{A}/leakage.csv"}
        _figure(leak, "png", f"{F}/leakage_rank_change")
        out["leakage"] = leak
    else:
        skip("leakage_rank_change", "no leakage subset differs from the full task set (no encoder's pretraining "
                                    "data includes a benchmark dataset and no dataset has a high web-exposure risk)")
    high = set(high_leakage_datasets(ctx.encoders, ctx.datasets))
    if any(m["dataset"] not in high for m in ctx.tasks.values()):
        top = {"table": f"{A}/top_k.csv"}
        _figure(top, "png", f"{F}/top_k")
        out["top_k"] = top
    else:
        skip("top_k", f"every task is from a high-leakage dataset ({', '.join(sorted(high))})")
    s = ctx.settings
    run = set(ctx.protocols) | set(ctx.ft_protocols)
    ft, lp = s["finetune_protocol"], s["linear_protocol"]
    if ft in run and lp in run and (ft not in ctx.ft_protocols or ctx.regime in ctx.ft_regimes):
        gap = {"table": f"{A}/ft_lp_gap.csv"}
        _figure(gap, "png", f"{F}/ft_lp_gap")
        out["ft_lp"] = gap
    else:
        why = (f"{ft} and {lp} were not both run (finetune.enabled false, or a protocol missing)"
               if not (ft in run and lp in run) else f"fine-tuning does not cover the ranking regime {ctx.regime}")
        skip("ft_lp_gap", why)
    if ctx.subgroups_path:
        fair = {"table": f"{A}/subgroup_accuracy.csv"}
        _figure(fair, "png", f"{F}/subgroup_accuracy")
        out["fairness"] = fair
    else:
        skip("subgroup_accuracy", "no subgroup table (analysis.subgroup_metrics)")
    if ctx.lr_source:
        lr = {"table": f"{A}/lr_sensitivity.csv"}
        _figure(lr, "png", f"{F}/lr_sensitivity")
        if (ctx.lr_encoders or k) >= 2:  # ranks at optimal vs sub-optimal lr need two encoders
            lr["distance"] = f"{A}/lr_signed_rank_distance.csv"
            _figure(lr, "png_srd", f"{F}/srd_lr")
        else:
            skip("srd_lr", "ranks at the optimal vs sub-optimal learning rate need >= 2 swept encoders")
        out["sensitivity"] = lr
    else:
        for name in ("lr_sensitivity", "srd_lr"):
            skip(name, "no learning-rate sweep in the ranking regime (finetune.enabled / sweep.enabled false, or "
                       f"{ctx.regime} not in sweep.regimes)")
    if ctx.lr_source and ctx.lr_grid:
        from retinabench.figures.scatter import lr_transfer_pages
        tr = {"table": f"{A}/lr_transfer.csv"}
        _figure(tr, "png", f"{F}/lr_transfer")
        for part in range(2, lr_transfer_pages(ctx.lr_encoders or k) + 1):  # one page per 10 swept encoders
            _figure(tr, f"png_part{part}", f"{F}/lr_transfer_part{part}")
        out["lr_transfer"] = tr
    else:
        skip("lr_transfer", "needs the learning-rate sweep and a second fine-tuned task to check the chosen rate "
                            "on (sweep.sensitivity_task)" if ctx.lr_source else
                            "no learning-rate sweep (finetune.enabled / sweep.enabled false)")
    return out


def family_inputs(family: str, results: str, ctx: "AnalysisContext") -> dict[str, str]:
    """Input paths of a family's job."""
    paths = {"metrics": f"{results}/metrics.parquet", "ranks": f"{results}/analysis/ranks.parquet",
             "baselines": baselines_path(results)}
    if ctx.subgroups_path:
        paths["subgroups"] = str(Path(results) / ctx.subgroups_path)
    if ctx.lr_source:
        paths["lr_sweep"] = str(Path(results) / ctx.lr_source)
    if ctx.lr_grid:
        paths["lr_grid"] = str(Path(results) / ctx.lr_grid)
    return {k: paths[k] for k in FAMILIES[family].inputs}


def baselines_path(results: str) -> str:
    """The majority-class / chance table (rule ``baselines``, from the splits; stats.baselines)."""
    return f"{results}/analysis/baselines.csv"


def targets(outputs: dict[str, dict[str, str]]) -> list[str]:
    return [p for fam in outputs.values() for p in fam.values()]


# --------------------------------------------------------------------------------------------------------------
# Families: DataFrames in, files out. `out` holds the paths analysis_outputs() gives the family.
# --------------------------------------------------------------------------------------------------------------

def _write_csv(df: pd.DataFrame, path: str) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False, float_format="%.6g")
    return path


def _write_text(text: str, path: str) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    return path


def _order(ranks: pd.DataFrame, ctx: AnalysisContext) -> list[str]:
    from retinabench.stats.ranks import encoder_order
    ranked = ranks[ranks["protocol"].isin(ctx.protocols)] if ctx.protocols else ranks
    return encoder_order(ranked, metric=ctx.metric, regime=ctx.regime)


def _metric_title(ctx: AnalysisContext, metric: str) -> str:
    return f"test {metric.replace('_', ' ')}"


def _role(ctx: AnalysisContext, protocol: str) -> str:
    """How a table names a protocol's part: the analysis protocol's role (headline / fallback: why / configured),
    or ``other``."""
    h = ctx.analysis_protocol
    if protocol != h["protocol"]:
        return "other"
    return h["note"] if h["role"] == "fallback" else h["role"]


def family_ranks(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.stats.ranks import rank_summaries, rank_tables
    ranks = rank_tables(inputs["metrics"], ctx.metrics, split=ctx.split)
    Path(out["ranks"]).parent.mkdir(parents=True, exist_ok=True)
    ranks.to_parquet(out["ranks"], index=False)
    _write_csv(rank_summaries(ranks), out["summary"])
    return [out["ranks"], out["summary"]]


def family_rank_figures(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.ranks import rank_distribution_figure
    paths = []
    for m in ctx.metrics:
        key = "png" if m == ctx.metric else f"png_{m}"
        paths += rank_distribution_figure(inputs["ranks"], ctx.encoders, out[key], regime=ctx.regime, metric=m,
                                          protocols=[ctx.focus_protocol],
                                          title=f"Encoder ranks by {_metric_title(ctx, m)}, {ctx.protocol_label} "
                                                f"(regime {ctx.regime})")
    return paths


def family_tables(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.stats.ranks import rank_summaries
    from retinabench.stats.tables import appendix_latex, appendix_table, ranking_latex, ranking_table
    order = _order(inputs["ranks"], ctx)
    app = appendix_table(inputs["metrics"], metric=ctx.metric, split=ctx.split, baselines=inputs["baselines"])
    rank = ranking_table(rank_summaries(inputs["ranks"]), regime=ctx.regime, ranks=inputs["ranks"],
                         baselines=inputs["baselines"], split=ctx.split)
    return [_write_csv(app, out["appendix_csv"]),
            _write_text(appendix_latex(app, regime=ctx.regime, encoder_order=order), out["appendix_tex"]),
            _write_csv(rank, out["ranking_csv"]),
            _write_text(ranking_latex(rank, encoder_order=order), out["ranking_tex"])]


def family_cd(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.cd import CDPanel, cd_figure
    from retinabench.stats.friedman import block_ranks, friedman_test, nemenyi, nemenyi_long
    from retinabench.stats.ranks import higher_is_better, score_matrix
    ranks = inputs["ranks"]
    rows, pairs, paths = [], [], []
    head = ctx.analysis_protocol
    from retinabench.progress import progress
    for m in progress(ctx.metrics, "Friedman / Nemenyi", unit="ranking metrics"):
        panels = []
        # Tables: every ranked protocol, the analysis protocol marked; the diagram: the analysis protocol.
        for protocol in [head["protocol"], *[p for p in ctx.protocols if p != head["protocol"]]]:
            scores = score_matrix(ranks, metric=m, protocol=protocol, regime=ctx.regime)
            res = friedman_test(scores, higher_is_better=higher_is_better(m), alpha=ctx.alpha)
            p = nemenyi(scores)
            mean_rank = block_ranks(scores, higher_is_better(m)).mean(axis=0)
            role = _role(ctx, protocol)
            rows.append({"metric": m, "protocol": protocol, "role": role, "regime": ctx.regime, **res.as_dict()})
            pairs.append(nemenyi_long(p, mean_rank, ctx.alpha).assign(metric=m, protocol=protocol, role=role,
                                                                       regime=ctx.regime))
            if protocol != head["protocol"]:
                continue
            verdict = "differ" if res.p < ctx.alpha else "no evidence of a difference"
            panels.append(CDPanel(f"{ctx.protocol_label}: Friedman χ² = {res.chi2:.2f}, p = {res.p:.2g} ({verdict}); "
                                  f"{res.n} tasks, {res.k} encoders", mean_rank, p, res.cd))
        key = "png" if m == ctx.metric else f"png_{m}"
        paths += cd_figure(panels, ctx.encoders, out[key], alpha=ctx.alpha,
                           title=f"Critical differences (Nemenyi, α = {ctx.alpha:g}), {_metric_title(ctx, m)}, "
                                 f"regime {ctx.regime}")
    return [_write_csv(pd.DataFrame(rows), out["friedman"]),
            _write_csv(pd.concat(pairs, ignore_index=True), out["nemenyi"]), *paths]


def family_protocol_heatmap(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.agreement import heatmap_panels
    from retinabench.stats.agreement import condition_rankings
    ranks = inputs["ranks"]
    panels = {}
    for regime, label in ((UNBALANCED, "unbalanced (u-u)"), (BALANCED, "balanced (b-b)")):
        if regime in ctx.regimes:
            m = condition_rankings(ranks, metric=ctx.metric, by="protocol", fixed={"regime": regime},
                                   keep=ctx.protocols)
            panels[label] = m[[p for p in ctx.protocols if p in m.columns]]
    n_enc = len(ctx.encoders)
    return heatmap_panels(panels, ctx.encoders, out["png"], order=_order(ranks, ctx), vmin=1, vmax=max(2, n_enc),
                          value_label="mean rank across tasks (1 = best)",
                          title=f"Mean rank per protocol, {_metric_title(ctx, ctx.metric)}")


def family_agreement(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.agreement import spearman_figure
    from retinabench.stats.agreement import agreement_table, condition_rankings, spearman_matrix
    ranks = inputs["ranks"]
    table = agreement_table(ranks, metric=ctx.metric, protocols=ctx.protocols, regimes=ctx.regimes,
                            alpha=ctx.alpha)
    paths = [_write_csv(table, out["table"])]
    if "png_protocols" in out:
        mats = {}
        for regime, label in ((UNBALANCED, "unbalanced (u-u)"), (BALANCED, "balanced (b-b)")):
            if regime in ctx.regimes:
                m = condition_rankings(ranks, metric=ctx.metric, by="protocol", fixed={"regime": regime},
                                   keep=ctx.protocols)
                mats[label] = spearman_matrix(m, ctx.protocols)
        paths += spearman_figure(mats, out["png_protocols"], alpha=ctx.alpha, n_encoders=int(table["n_encoders"].max()),
                                 title=f"Agreement of protocols' encoder rankings ({_metric_title(ctx, ctx.metric)})")
    if "png_regimes" in out:
        mats = {}
        for protocol in ctx.protocols:
            m = condition_rankings(ranks, metric=ctx.metric, by="regime", fixed={"protocol": protocol},
                                   keep=ctx.regimes)
            mats[protocol] = spearman_matrix(m, ctx.regimes)
        paths += spearman_figure(mats, out["png_regimes"], alpha=ctx.alpha, n_encoders=int(table["n_encoders"].max()),
                                 title=f"Agreement of encoder rankings between data regimes "
                                       f"({_metric_title(ctx, ctx.metric)})")
    return paths


def family_distance(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.bars import distance_bars
    from retinabench.stats.distance import (distance_table, kruskal_table, protocol_comparisons,
                                            subset_comparisons)
    ranks = inputs["ranks"]
    comps = protocol_comparisons(ctx.protocols, metric=ctx.metric, regime=ctx.regime) \
        if len(ctx.protocols) >= 2 else []
    subs = subset_comparisons(ctx.tasks, ctx.settings["subsets"], metric=ctx.metric, protocol=ctx.focus_protocol,
                              regime=ctx.regime)
    table = distance_table(ranks, comps + subs, ctx.encoders)
    table["protocol"] = ["" if f == "protocols" else ctx.focus_protocol for f in table["family"]]
    kw = kruskal_table(table, ctx.alpha)
    paths = [_write_csv(table, out["table"]), _write_csv(kw, out["kruskal"])]
    if "png_protocols" in out:
        d = table[table["family"] == "protocols"]
        paths += distance_bars(d, kw, ctx.encoders, out["png_protocols"], group_by="domain",
                               title=f"Signed rank distance between protocols ({_metric_title(ctx, ctx.metric)}, "
                                     f"regime {ctx.regime})")
    if "png_subsets" in out:
        d = table[table["family"] != "protocols"]
        paths += distance_bars(d, kw, ctx.encoders, out["png_subsets"], group_by="domain",
                               title=f"Signed rank distance, subset vs rest ({ctx.protocol_label}, "
                                     f"{_metric_title(ctx, ctx.metric)}, regime {ctx.regime})")
    return paths


def family_subsets(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.agreement import heatmap_panels
    from retinabench.stats.subsets import subset_rankings, task_subsets
    ranks = inputs["ranks"]
    subsets = task_subsets(ctx.tasks, ctx.settings["subsets"])
    table = subset_rankings(ranks, subsets, metric=ctx.metric, protocol=ctx.focus_protocol, regime=ctx.regime)
    wide = table.pivot(index="encoder", columns="subset", values="mean_rank")[["all", *subsets]]
    wide.columns = [f"{c} ({len(subsets[c]) if c in subsets else len(ctx.tasks)})" for c in wide.columns]
    paths = [_write_csv(table, out["table"])]
    paths += heatmap_panels({f"{ctx.protocol_label}, regime {ctx.regime}": wide}, ctx.encoders, out["png"],
                            order=_order(ranks, ctx), vmin=1, vmax=max(2, len(ctx.encoders)),
                            value_label="mean rank (1 = best)",
                            title=f"Mean rank by task subset (task count), {_metric_title(ctx, ctx.metric)}")
    return paths


def family_leakage(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.bars import leakage_bars
    from retinabench.stats.leakage import (SUBSET_LABELS, exposed_datasets, exposure_likelihood,
                                           informative_subsets, leakage_rerank, leakage_subsets)
    ranks = inputs["ranks"]
    subsets = informative_subsets(leakage_subsets(ctx.tasks, ctx.encoders, ctx.datasets), list(ctx.tasks))
    if not subsets:
        raise ValueError("leakage: no task subset differs from the full task set (nothing to re-rank)")
    table = leakage_rerank(ranks, subsets, metric=ctx.metric, protocol=ctx.focus_protocol, regime=ctx.regime,
                           likelihood=exposure_likelihood(ctx.encoders, ctx.datasets),
                           exposure=exposed_datasets(ctx.encoders, list(ctx.datasets)))
    paths = [_write_csv(table.assign(protocol_role=_role(ctx, ctx.focus_protocol)), out["table"])]
    paths += leakage_bars(table, ctx.encoders, out["png"], order=_order(ranks, ctx), labels=SUBSET_LABELS,
                          title=f"Rank change without possibly leaked tasks ({ctx.protocol_label}, "
                                f"{_metric_title(ctx, ctx.metric)})")
    return paths


def family_top_k(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.bars import top_k_panels
    from retinabench.stats.leakage import high_leakage_datasets, top_k
    ranks = inputs["ranks"]
    high = set(high_leakage_datasets(ctx.encoders, ctx.datasets))
    clean = sorted(t for t, m in ctx.tasks.items() if m["dataset"] not in high)
    k = int(ctx.settings["top_k"])
    modalities = list(ctx.settings["subsets"].get("modality", []))
    table = top_k(ranks, ctx.tasks, clean, k=k, metric=ctx.metric, protocol=ctx.focus_protocol,
                  regime=ctx.regime, modalities=modalities)
    titles = {"all": "all modalities", **{m: m.upper() for m in modalities}}
    paths = [_write_csv(table.assign(excluded_datasets=",".join(sorted(high)),
                                     protocol_role=_role(ctx, ctx.focus_protocol)), out["table"])]
    excluded = ", ".join(sorted(high)) or "none"
    paths += top_k_panels(table, ctx.encoders, out["png"], titles=titles,
                          title=f"Top {k} by mean rank, high-leakage datasets excluded ({excluded}); "
                                f"{ctx.protocol_label}, {_metric_title(ctx, ctx.metric)}")
    return paths


def family_ft_lp(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.scatter import ft_lp_gap_figure
    from retinabench.stats.protocols import ft_lp_gap
    s = ctx.settings
    table = ft_lp_gap(inputs["metrics"], ctx.encoders, finetune=s["finetune_protocol"], linear=s["linear_protocol"],
                      regime=ctx.regime, metric=ctx.metric, split=ctx.split)
    return [_write_csv(table, out["table"]),
            *ft_lp_gap_figure(table, ctx.encoders, out["png"], finetune=s["finetune_protocol"],
                              linear=s["linear_protocol"],
                              title=f"{s['finetune_protocol']} − {s['linear_protocol']} gap vs size "
                                    f"(regime {ctx.regime}; mean ± sd over tasks)")]


def family_fairness(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.scatter import subgroup_figure
    from retinabench.stats.fairness import subgroup_pairs
    table = subgroup_pairs(inputs["subgroups"], ctx.settings["subgroup_pairs"], metric=ctx.metric,
                           protocol=ctx.focus_protocol, regime=ctx.regime, split=ctx.split)
    return [_write_csv(table.assign(protocol_role=_role(ctx, ctx.focus_protocol)), out["table"]),
            *subgroup_figure(table, ctx.encoders, out["png"],
                             title=f"Subgroup {_metric_title(ctx, ctx.metric)} per encoder and dataset "
                                   f"({ctx.protocol_label}, regime {ctx.regime})")]


def family_sensitivity(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.bars import distance_bars, sensitivity_bars
    from retinabench.stats.distance import distance_rows, kruskal_table, with_groups
    from retinabench.stats.sensitivity import choices_from_sweep, lr_mean_ranks, lr_sensitivity
    s = ctx.settings
    sweep_task = (ctx.sweep_tasks or {}).get("sweep")
    choices = choices_from_sweep(inputs["lr_sweep"], metric=ctx.metric, regime=ctx.regime,
                                 reference_lr=s["lr_reference"], tasks=[sweep_task] if sweep_task else None)
    sens, frames = [], []
    meaning = ("positive = better relative rank at the sub-optimal lr than at the optimal one (less lr-sensitive "
               "than the other encoders)")
    for protocol, c in choices.groupby("protocol", sort=True):
        sens.append(lr_sensitivity(c).assign(protocol=protocol))
        if c["encoder"].nunique() >= 2:
            r_opt, r_sub = lr_mean_ranks(c)
            frames.append(distance_rows(f"optimal vs sub-optimal lr ({protocol})", "lr", "optimal lr",
                                        "sub-optimal lr", r_opt, r_sub, meaning))
    sens = pd.concat(sens, ignore_index=True)
    sens["size_class"] = [ctx.encoders.get(e, {}).get("size_class") for e in sens["encoder"]]
    order = [e for e in _order(inputs["ranks"], ctx) if e in set(sens["encoder"])]
    where = f"sweep task {sweep_task}" if sweep_task else "every swept task"
    paths = [_write_csv(sens, out["table"])]
    paths += sensitivity_bars(sens, ctx.encoders, out["png"], order=order,
                              xlabel=f"test {ctx.metric} drop: optimal − sub-optimal lr",
                              title=f"Learning-rate sensitivity on {where} (regime {ctx.regime})")
    if "png_srd" in out:
        if not frames:
            raise ValueError("learning-rate sensitivity: no protocol of the sweep has two or more encoders to rank")
        groups = ("size_class", "domain", "method")
        dist = with_groups(pd.concat(frames, ignore_index=True), ctx.encoders, groups)
        kw = kruskal_table(dist, ctx.alpha, groups)
        paths.append(_write_csv(dist, out["distance"]))
        paths += distance_bars(dist, kw, ctx.encoders, out["png_srd"], group_by="size_class",
                               title=f"Signed rank distance, optimal vs sub-optimal learning rate ({where})")
    return paths


def family_lr_transfer(inputs: dict, ctx: AnalysisContext, out: dict) -> list[str]:
    from retinabench.figures.scatter import lr_transfer_figure
    from retinabench.stats.sensitivity import lr_transfer_table
    tasks = ctx.sweep_tasks or {}
    if not tasks.get("sweep") or not tasks.get("check"):
        raise ValueError(f"learning-rate transfer needs a sweep task and a check task, got {tasks}")
    table = lr_transfer_table(inputs["lr_grid"], inputs["lr_sweep"], metric=ctx.metric, regime=ctx.regime,
                              sweep_task=tasks["sweep"], check_task=tasks["check"])
    from retinabench.stats.baselines import select
    base = select(inputs["baselines"], ctx.metric, "val", ctx.regime)
    pages = [out["png"]] + [out[k] for k in sorted((k for k in out if k.startswith("png_part")),
                                                   key=lambda k: int(k[len("png_part"):]))]
    return [_write_csv(table, out["table"]),
            *lr_transfer_figure(table, ctx.encoders, pages, baselines=base,
                                title=f"Transfer of the chosen learning rate: validation {ctx.metric} over the lr "
                                      f"grid, sweep task {tasks['sweep']} vs {tasks['check']} (regime {ctx.regime})")]


FAMILY_FUNCTIONS: dict[str, Callable[[dict, AnalysisContext, dict], list[str]]] = {
    "ranks": family_ranks, "rank_figures": family_rank_figures, "tables": family_tables, "cd": family_cd,
    "protocol_heatmap": family_protocol_heatmap, "agreement": family_agreement, "distance": family_distance,
    "subsets": family_subsets, "leakage": family_leakage, "top_k": family_top_k, "ft_lp": family_ft_lp,
    "fairness": family_fairness, "sensitivity": family_sensitivity, "lr_transfer": family_lr_transfer,
}


def read_input(kind: str, path: str) -> pd.DataFrame:
    from retinabench.schemas import read_table
    if kind == "metrics":
        return read_table(path, "metrics")
    if kind == "ranks":
        return pd.read_parquet(path)
    if kind == "subgroups":
        from retinabench.stats.fairness import check_subgroups
        df = read_table(path)
        check_subgroups(df)
        return df
    if kind == "lr_sweep":
        from retinabench.stats.sensitivity import check_sweep
        df = read_table(path)
        check_sweep(df)
        return df
    if kind == "lr_grid":
        return read_table(path, "metrics")
    if kind == "baselines":
        from retinabench.stats.baselines import check_baselines
        return check_baselines(pd.read_csv(path, keep_default_na=False, na_values={"majority": [""],
                                                                                 "chance": [""]}))
    raise KeyError(f"unknown analysis input kind {kind!r}")


def run_family(family: str, inputs: dict[str, pd.DataFrame], ctx: AnalysisContext, out: dict[str, str]) -> list[str]:
    """Run one family on in-memory tables; returns the files written (each must be one of ``out``'s paths)."""
    if family not in FAMILY_FUNCTIONS:
        raise KeyError(f"unknown analysis family {family!r}; known: {sorted(FAMILY_FUNCTIONS)}")
    missing = [k for k in FAMILIES[family].inputs if k not in inputs]
    if missing:
        raise KeyError(f"analysis family {family!r} needs input(s) {missing}")
    from retinabench.progress import Progress
    bar = Progress(1, f"analysis {family}", unit="family")
    written = FAMILY_FUNCTIONS[family](inputs, ctx, out)
    bar.update(note=f"{len(written)} files: {', '.join(Path(p).name for p in written)}")
    unexpected = sorted(set(written) - set(out.values()))
    if unexpected:
        raise RuntimeError(f"analysis family {family!r} wrote files it did not declare: {unexpected}")
    not_written = sorted(set(out.values()) - set(written))
    if not_written:
        raise RuntimeError(f"analysis family {family!r} did not write {not_written}")
    return written


def _stage(family: str) -> Callable:
    def stage(job) -> None:
        ctx = AnalysisContext.from_params(job.params)
        inputs = {k: read_input(k, job.input[k]) for k in FAMILIES[family].inputs}
        written = run_family(family, inputs, ctx, dict(job.output))
        config = {k: job.params[k] for k in job.params if k not in ("encoders", "tasks", "datasets")}
        registry = {k: job.params[k] for k in ("encoders", "tasks", "datasets") if k in job.params}
        for path in written:
            write_sidecar(path, rule=job.rule, inputs=job.inputs_flat(), wildcards=job.wildcards,
                          config=config, extra={"family": family, "registry_fields": registry})
    stage.__name__ = f"stage_analysis_{family}"
    stage.__doc__ = f"Snakemake stage of the {family!r} analysis family (see FAMILY_FUNCTIONS)."
    return stage


def stage_baselines(job) -> None:
    """Majority-class and chance levels of every task, regime and split (stats.baselines), from the splits."""
    from retinabench.schemas import read_table
    from retinabench.stats.baselines import baselines_table
    tasks = job.params["tasks"]
    splits = {}
    for path in job.input["splits"]:
        split = read_table(path, "split")
        for name in split["task"].unique():
            splits[str(name)] = split
    table = baselines_table(splits, tasks, list(job.params["regimes"]))
    path = _write_csv(table, job.output["baselines"])
    write_sidecar(path, rule=job.rule, inputs=job.inputs_flat(), wildcards=job.wildcards,
                  config={"regimes": job.params["regimes"]},
                  extra={"registry_fields": {"tasks": tasks}, "doc": "retinabench.stats.baselines"})


def stage_skipped(job) -> None:
    """The skipped-analyses table (retinabench.skipped): planned skips, figure jobs' records, reliability."""
    from retinabench import skipped
    figure_tables = {name: path for name, path in job.params["figure_tables"].items()}
    table = skipped.collect(job.params["planned"], figure_tables, coverage=job.input.get("coverage"),
                            subgroup_table=job.input.get("subgroup_table"), produced=job.params["produced"])
    path = job.output["table"]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    inputs = [*figure_tables.values(), *(job.input[k] for k in ("coverage", "subgroup_table") if k in job.input)]
    write_sidecar(path, rule=job.rule, inputs=inputs, wildcards=job.wildcards,  # files (inputs are folders)
                  config={"planned": job.params["planned"]}, extra={"n_skipped": int(len(table))})


# Stage names are prefixed so they never shadow the pipeline's own (e.g. "ranks").
ANALYSIS_STAGES: dict[str, Callable] = {f"analysis_{f}": _stage(f) for f in FAMILY_FUNCTIONS}
ANALYSIS_STAGES.update({"analysis_baselines": stage_baselines, "skipped_analyses": stage_skipped})

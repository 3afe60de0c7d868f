"""What the analysis reads from the config and the registries: :class:`AnalysisContext`, the analysis protocol
(:func:`choose_headline`), and the family table (:data:`FAMILIES`: each family one declared record: rule, inputs,
fields, settings, statistics-and-figure function, report entries)."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

from retinabench.settings.finetune import FinetuneSettings, SweepSettings
from retinabench.settings.reliability import AnalysisSettings, ReliabilitySettings
from retinabench.skipped import FAIRNESS, LEAKAGE, PROTOCOLS, RANKING, SENSITIVITY, SUBSETS

# method_group is resolved from the entry (retinabench.stats.groups.method_group: init random -> none)
ENCODER_FIELDS = ("domain", "method", "method_group", "pretraining_data", "exposure", "params_m", "size_class")
# The reliability layer's per-group metrics in the analysis format (workflow/rules/reliability.smk, rule
# reliability_collect): the fairness family's input unless analysis.subgroup_metrics names another table.
RELIABILITY_SUBGROUPS = "reliability/subgroup_metrics.parquet"
SWEEP_GRID = "sweep/lr_sweep_metrics.parquet"          # the sweep's per-lr metrics (finetune.smk, sweep_collect)
SWEEP_SENSITIVITY = "sweep/lr_sensitivity.parquet"
TASK_FIELDS = ("dataset", "modality", "family")
# OcularBench's three protocols are kNN, its linear probe (analysis.linear_protocol) and full fine-tuning
# (analysis.finetune_protocol): AnalysisContext.paper_protocols. Figures comparing protocols show those three when
# two or more are ranked; the project's other probes (the cached `linear`, `logreg`) go to `*_extended` figures.
PAPER_KNN = "knn"
OCT_PANEL = "oct"  # the modality of OcularBench's top-k panel over every task of it (leaked datasets included)
# Table 1 (sensitive attributes): the fairness attributes of reliability.attributes compared by
# analysis.subgroup_pairs (OcularBench: age < 60 / >= 60, sex female / male), binarised as the reliability layer does.
DATASET_FIELDS = ("web_exposure_risk",)


def _pick(entry: dict, fields: tuple[str, ...], what: str) -> dict:
    out: dict[str, Any] = {}
    for f in fields:
        if f == "method_group":
            from retinabench.stats.groups import method_group
            out[f] = method_group(entry, what)
            continue
        if f not in entry:
            if f in ("exposure", "pretraining_data"):
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
    sweep_tasks: dict = field(default_factory=dict)         # {"sweep": task, "check": sensitivity task or None,
    #                                                         "check_regime": its regime, "check_encoders": [...]}
    subgroup_source: str | None = None                      # subgroup table of the fairness family
    headline: dict = field(default_factory=dict)            # analysis protocol: protocol, role, note
    regimes: list[str] = field(default_factory=list)
    ranking: dict = field(default_factory=dict)        # metric, regime
    settings: dict = field(default_factory=lambda: AnalysisSettings().plain())  # the `analysis:` section
    attributes: list[dict] = field(default_factory=list)   # Table 1: name, column, cut, groups (reliability.attributes)

    @classmethod
    def from_config(cls, config: dict, registries, *, encoders: list[str], tasks: list[str],
                    datasets: list[str]) -> AnalysisContext:
        settings = AnalysisSettings.from_config(config).plain()
        protocols = list(config["protocols"])
        # Fine-tuning (workflow/rules/finetune.smk) adds its protocols' rows to the same metrics table when
        # `finetune.enabled`. They join the rank analyses only when they cover every encoder, task and regime
        # (ranks are comparable across protocols only over the same encoders); the FT-LP gap needs no more than
        # the encoders and tasks both protocols ran.
        ft = FinetuneSettings.from_config(config)
        ft_protocols = list(ft.protocols) if ft.enabled else []
        ft_regimes = list(ft.regimes or config["regimes"])

        def covers(subset, full):
            return subset is None or set(full) <= set(subset)

        gaps = [f"{len(getattr(ft, k) or [])} of {len(full)} {k}" for k, full in
                (("encoders", encoders), ("tasks", tasks), ("regimes", config["regimes"]))
                if not covers(getattr(ft, k), full)]
        if ft_protocols and not gaps:
            protocols += [p for p in ft_protocols if p not in protocols]
        # The learning-rate sweep's per-encoder sensitivity table (finetune.smk, rule sweep_collect), unless the
        # analysis names another table; the sweep task and the transfer-check task (SweepSettings.tasks).
        sweep = SweepSettings.from_config(config)
        lr_source, lr_encoders, lr_grid, swept = settings["lr_sweep_metrics"], None, None, {}
        if lr_source is None and ft_protocols and sweep.enabled and config["ranking"]["regime"] in sweep.regimes:
            lr_source, lr_encoders = SWEEP_SENSITIVITY, len(ft.encoders or encoders)
            task, check = sweep.tasks(list(ft.tasks or tasks))
            # The check task's regime (the ranking regime when it is swept there, else the first one swept) and
            # the encoders swept on it too (sweep.sensitivity_regimes / sensitivity_encoders).
            check_regimes, regime = sweep.run_regimes(True), config["ranking"]["regime"]
            swept = {"sweep": task, "check": check,
                     "check_regime": regime if regime in check_regimes else check_regimes[0],
                     "check_encoders": sweep.sensitivity_of(list(ft.encoders or encoders)) if check else []}
            if check is not None and swept["check_encoders"]:
                lr_grid = SWEEP_GRID
        headline = choose_headline(protocols, settings, ft_protocols=ft_protocols, coverage=gaps)
        attributes = [{"name": a.name, "column": a.column, "cut": a.cut, "groups": a.groups}
                      for a in ReliabilitySettings.from_config(config).attributes if a.name in settings["subgroup_pairs"]]
        return cls(
            encoders={e: _pick(registries.encoder(e), ENCODER_FIELDS, f"encoder {e!r}") for e in encoders},
            tasks={t: _pick(registries.task(t), TASK_FIELDS, f"task {t!r}") for t in tasks},
            datasets={d: _pick(registries.dataset(d), DATASET_FIELDS, f"dataset {d!r}") for d in datasets},
            protocols=protocols, ft_protocols=ft_protocols, ft_regimes=ft_regimes, lr_source=lr_source,
            lr_encoders=lr_encoders, lr_grid=lr_grid, sweep_tasks=swept,
            subgroup_source=settings["subgroup_metrics"] or RELIABILITY_SUBGROUPS, headline=headline,
            regimes=list(config["regimes"]), ranking=dict(config["ranking"]), settings=settings,
            attributes=attributes)

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
    def analysis_protocol_name(self) -> str:
        return self.analysis_protocol["protocol"]

    @property
    def protocol_label(self) -> str:
        """The analysis protocol as titles name it: ``finetune``, or ``linear (fallback: ...)``."""
        h = self.analysis_protocol
        return h["protocol"] if h["role"] != "fallback" else f"{h['protocol']} ({h['note']})"

    @property
    def paper_protocols(self) -> list[str]:
        """The ranked protocols among OcularBench's three (kNN, analysis.linear_protocol, analysis.finetune_protocol),
        in ranking order."""
        paper = {PAPER_KNN, self.settings["linear_protocol"], self.settings["finetune_protocol"]}
        return [p for p in self.protocols if p in paper]

    @property
    def protocol_sets(self) -> dict[str, list[str]]:
        """Protocols of the figures that compare protocols, by file-name suffix: ``""`` the paper's protocols when
        two or more are ranked (else every ranked protocol), ``"_extended"`` every ranked protocol when that adds
        the project's other probes to the paper's."""
        paper = self.paper_protocols
        if len(paper) < 2:
            return {"": list(self.protocols)}
        extra = [p for p in self.protocols if p not in paper]
        return {"": paper, **({"_extended": list(self.protocols)} if extra else {})}

    @property
    def linear_probe(self) -> str | None:
        """The paper's linear probe when it is ranked and is not the analysis protocol (Figs. 4 and A.3)."""
        lp = self.settings["linear_protocol"]
        return lp if lp in self.protocols and lp != self.analysis_protocol_name else None

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
    def from_params(cls, params: dict) -> AnalysisContext:
        ctx = cls()
        for key in ("encoders", "tasks", "datasets", "protocols", "ft_protocols", "ft_regimes", "regimes",
                    "ranking", "headline", "sweep_tasks", "attributes"):
            if key in params:
                setattr(ctx, key, copy.deepcopy(dict(params[key]) if isinstance(params[key], dict)
                                                else list(params[key])))
        ctx.settings = Settings(copy.deepcopy(dict(params.get("settings", {}))))
        return ctx


def choose_headline(protocols: list[str], settings: dict, *, ft_protocols: Sequence[str] = (),
                    coverage: Sequence[str] = ()) -> dict:
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
                       "add it to the family's `settings` in retinabench.analysis.context.FAMILIES")


def _canonical(value):
    """Dicts with sorted keys, recursively: a job's params must not change when a config file lists the same
    settings in another key order (Snakemake compares params as written)."""
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


@dataclass(frozen=True)
class Report:
    """One output of a family shown in the report: its output key (``png`` also labels ``png_<metric>`` pages),
    caption (workflow/report/<caption>.rst; also its name in retinabench.skipped.SECTIONS), section and
    subcategory."""

    key: str
    caption: str
    section: str
    subcategory: str


@dataclass(frozen=True)
class Family:
    """One analysis family, declared once: its name, Snakemake rule, the tables it reads, what of the registries
    and the config its job receives, the function that computes its statistics and draws its figures
    (``analysis.families.<function>``) and its report entries. The outputs and when the family is skipped are
    decided from the config by retinabench.plan.family_outputs.analysis_outputs."""

    name: str
    rule: str
    function: str                           # in retinabench.analysis.families
    inputs: tuple[str, ...]                 # metrics | ranks | subgroups | lr_sweep | lr_grid | baselines | manifests
    encoder_fields: tuple[str, ...] = ()
    task_fields: tuple[str, ...] = ()
    datasets: bool = False
    context: tuple[str, ...] = ()           # AnalysisContext attributes: protocols, regimes, ranking, attributes
    settings: tuple[str, ...] = ()
    report: tuple[Report, ...] = ()

    @property
    def report_entries(self) -> dict[str, tuple[str, str, str]]:
        """{output key: (caption, section, subcategory)}."""
        return {r.key: (r.caption, r.section, r.subcategory) for r in self.report}


_R = ("ranking",)
_RPH = ("ranking", "protocols", "headline")
_PAPER = ("linear_protocol", "finetune_protocol")  # which ranked protocols are the paper's (paper_protocols)
# The families in report order (retinabench.skipped.SECTIONS names the sections).
_TABLE = (
    Family("ranks", "ranks", "family_ranks", ("metrics",), context=_R, settings=("alternative_metrics", "split")),
    Family("rank_figures", "figure_rank_distribution", "family_rank_figures", ("ranks",), ("domain",), context=_RPH,
           settings=("alternative_metrics", *_PAPER),
           report=(Report("png", "rank_distribution", RANKING, "Rank distributions"),
                   Report("png_linear_probe", "rank_distribution_linear_probe", RANKING, "Rank distributions"))),
    Family("tables", "analysis_tables", "family_tables", ("metrics", "ranks", "baselines"), context=_R,
           settings=("alternative_metrics", "split"),
           report=(Report("ranking_csv", "ranking_table", RANKING, "Tables"),
                   Report("appendix_csv", "appendix_table", RANKING, "Tables"))),
    Family("cd", "critical_difference", "family_cd", ("ranks",), ("domain",), context=_RPH,
           settings=("alternative_metrics", "alpha", *_PAPER),
           report=(Report("png", "cd_diagram", RANKING, "Critical difference"),
                   Report("png_linear_probe", "cd_diagram_linear_probe", RANKING, "Critical difference"))),
    Family("protocol_heatmap", "protocol_heatmap", "family_protocol_heatmap", ("ranks",), ("domain",),
           context=("ranking", "protocols", "regimes"), settings=_PAPER,
           report=(Report("png", "protocol_rank_heatmap", PROTOCOLS, "Mean rank per protocol"),
                   Report("png_extended", "protocol_rank_heatmap_extended", PROTOCOLS, "Mean rank per protocol"))),
    Family("agreement", "rank_agreement", "family_agreement", ("ranks",), context=("ranking", "protocols", "regimes"),
           settings=("alpha", *_PAPER),
           report=(Report("png_protocols", "spearman_protocols", PROTOCOLS, "Spearman correlation"),
                   Report("png_protocols_extended", "spearman_protocols_extended", PROTOCOLS, "Spearman correlation"),
                   Report("png_regimes", "spearman_regimes", PROTOCOLS, "Spearman correlation"))),
    Family("distance", "signed_rank_distance", "family_distance", ("ranks",), ("domain", "method", "method_group"),
           ("modality", "family"), context=_RPH, settings=("alpha", "subsets", *_PAPER),
           report=(Report("png_protocols", "srd_protocols", PROTOCOLS, "Signed rank distance"),
                   Report("png_protocols_extended", "srd_protocols_extended", PROTOCOLS, "Signed rank distance"),
                   Report("png_subsets", "srd_subsets", SUBSETS, "Signed rank distance"))),
    Family("ft_lp", "ft_lp_gap", "family_ft_lp", ("metrics",), ("domain", "params_m"),
           context=("ranking", "ft_protocols"), settings=("split", "finetune_protocol", "linear_protocol"),
           report=(Report("png", "ft_lp_gap", PROTOCOLS, "Fine-tuning vs linear probe"),)),
    Family("subsets", "subset_ranks", "family_subsets", ("ranks",), ("domain",), ("modality", "family"), context=_RPH,
           settings=("subsets",), report=(Report("png", "subset_ranks", SUBSETS, "Mean rank by subset"),)),
    Family("leakage", "leakage", "family_leakage", ("ranks",), ("domain", "pretraining_data", "exposure"), ("dataset",),
           True, _RPH,
           report=(Report("png", "leakage_rank_change", LEAKAGE, "Rank change"),)),
    Family("top_k", "top_k", "family_top_k", ("ranks",), ("domain", "exposure"), ("dataset", "modality"), True,
           _RPH, ("top_k", "subsets"), report=(Report("png", "top_k", LEAKAGE, "Top encoders"),
                                               Report("png_oct", "top_k_oct", LEAKAGE, "Top encoders"))),
    Family("attributes", "attribute_table", "family_attributes", ("manifests",), context=("attributes",),
           report=(Report("attributes_csv", "attribute_distribution", FAIRNESS, "Sensitive attributes"),)),
    Family("fairness", "fairness", "family_fairness", ("subgroups",), ("domain",), context=_RPH,
           settings=("split", "subgroup_pairs"), report=(Report("png", "subgroup_accuracy", FAIRNESS, "Subgroups"),)),
    Family("sensitivity", "lr_sensitivity", "family_sensitivity", ("lr_sweep", "ranks"),
           ("domain", "method", "method_group", "size_class"), context=("ranking", "protocols", "sweep_tasks"),
           settings=("alpha", "lr_reference"),
           report=(Report("png", "lr_sensitivity", SENSITIVITY, "Learning rate"),
                   Report("png_srd", "srd_lr", SENSITIVITY, "Learning rate"))),
    Family("lr_transfer", "lr_transfer", "family_lr_transfer", ("lr_grid", "lr_sweep", "baselines"),
           ("domain", "size_class"), context=("ranking", "sweep_tasks"),
           report=(Report("png", "lr_transfer", SENSITIVITY, "Learning rate"),)),
)
FAMILIES: dict[str, Family] = {f.name: f for f in _TABLE}


"""Plan of workflow/rules/analysis.smk: the tidy metrics table, then one job per analysis family this config
can produce (retinabench.plan.family_outputs decides which, from the config alone)."""
from __future__ import annotations

from retinabench import skipped as skip_table
from retinabench.analysis import AnalysisContext
from retinabench.analysis.context import FAMILIES
from retinabench.plan.family_outputs import analysis_outputs, baselines_path, family_inputs
from retinabench.plan.core import CorePlan


class AnalysisPlan:
    ranking_section = skip_table.RANKING  # report sections (retinabench.skipped.SECTIONS)
    skipped_section = skip_table.SKIPPED_SECTION

    def __init__(self, core: CorePlan, metrics_files, reliability):
        """``metrics_files()``: the per-job metrics tables of every protocol (collect_metrics concatenates them);
        ``reliability``: the reliability plan (its figures and coverage feed the skipped-analyses table)."""
        self.core, self.metrics_files, self.reliability = core, metrics_files, reliability
        c = core.config
        self.context = AnalysisContext.from_config(c, core.reg, encoders=core.encoders, tasks=core.tasks,
                                                   datasets=core.datasets)
        self.planned_skips: list[dict] = []  # figures and tables this config cannot produce, with the reason
        self.outputs = analysis_outputs(self.context, core.R, self.planned_skips)
        self.baselines_file = baselines_path(core.R)
        self.skipped_table = core.path("skipped_analyses")
        # What the captions say the figures come from (the provenance sidecars hold the file-level chain).
        self.runs = (f"{len(core.encoders)} encoders ({', '.join(core.encoders)}); {len(core.tasks)} tasks "
                     f"({', '.join(core.tasks)}); protocols {', '.join(c['protocols'])}; seeds "
                     f"{', '.join(map(str, c['seeds']))}; regimes {', '.join(c['regimes'])}; "
                     f"{self.context.split} split")

    def families(self) -> list[tuple[str, str]]:
        """(family, rule name) of every family this config produces, in report order."""
        return [(f.name, f.rule) for f in FAMILIES.values() if f.name in self.outputs]

    def inputs(self, family: str) -> dict[str, str | list[str]]:
        return family_inputs(family, self.core.R, self.context)

    def params(self, family: str) -> dict:
        return self.context.params_for(family)

    def reported_outputs(self, family: str, report) -> dict:
        """The family's named outputs, figures (and report tables) wrapped in Snakemake's ``report()`` with their
        caption and section (the family's record, retinabench.analysis.context.FAMILIES)."""
        spec = FAMILIES[family].report_entries
        out = {}
        for key, path in self.outputs[family].items():
            metric = key[len("png_"):] if key.startswith("png_") and key not in spec else None
            if metric and metric.startswith("part"):  # a further page of a long figure (lr_transfer_part2, ...)
                metric, entry = None, spec.get("png")
            else:
                entry = spec.get(key) or (spec.get("png") if metric else None)
            if entry is None:
                out[key] = path
                continue
            caption, category, subcategory = entry
            out[key] = report(path, caption=f"../report/{caption}.rst", category=category, subcategory=subcategory,
                              labels={"figure": caption.replace("_", " "), "metric": metric or self.context.metric})
        return out

    # -- baselines (majority class / chance beside every headline number) -------------------------------------
    def baselines_inputs(self) -> dict:
        return {"splits": [self.core.task_split(t) for t in self.core.tasks]}

    def baselines_params(self) -> dict:
        return {"tasks": {t: self.core.reg.task(t) for t in self.core.tasks}, "regimes": self.core.config["regimes"]}

    # -- the skipped-analyses table ---------------------------------------------------------------------------
    def skipped_inputs(self) -> dict:
        rel = self.reliability
        out = {"figures": rel.figure_targets(), "coverage": rel.table("coverage")}
        if "fairness" in self.outputs:
            out["subgroup_table"] = self.outputs["fairness"]["table"]
        return out

    def produced(self) -> list[str]:
        """Names (retinabench.skipped.SECTIONS keys) of every figure and table this config produces."""
        names = []
        for family, outputs in self.outputs.items():
            spec = FAMILIES[family].report_entries
            names += [spec[k][0] for k in outputs if k in spec]
        return names + self.reliability.figure_names() + ["baselines"]

    def skipped_params(self) -> dict:
        rel = self.reliability
        # the LoRA grid's planned evaluations that cannot run (lora.unavailable), each with its reason
        lora_skips = self.core.lora.skipped() if hasattr(self.core, "lora") else []
        return {"planned": (self.planned_skips + rel.skipped() + lora_skips
                            + skip_table.optional_layers(self.core.config)),
                "figures": rel.figure_names(), "produced": self.produced()}

    def skipped_figure_tables(self) -> dict[str, str]:
        """{figure: its skipped.csv} (inputs of rule skipped_analyses; a location: CorePlan.located)."""
        rel = self.reliability
        return {f: f"{rel.figure_dir(f)}/skipped.csv" for f in rel.figure_names()}

    def targets(self) -> list[str]:
        """Analysis outputs requested by `all` (only those whose inputs this config produces), the baselines and the
        skipped-analyses table."""
        return ([path for outputs in self.outputs.values() for path in outputs.values()]
                + [self.baselines_file, self.skipped_table])

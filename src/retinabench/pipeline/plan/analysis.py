"""Plan of workflow/rules/analysis.smk: the tidy metrics table, then one job per analysis family this config
can produce (retinabench.analysis.plan decides which, from the config alone)."""
from __future__ import annotations

from retinabench.analysis import AnalysisContext, analysis_outputs, family_inputs
from retinabench.analysis.plan import FAMILY_RULES
from retinabench.pipeline.plan.core import CorePlan


class AnalysisPlan:
    def __init__(self, core: CorePlan, metrics_files):
        """``metrics_files()``: the per-job metrics tables of every protocol (collect_metrics concatenates them)."""
        self.core, self.metrics_files = core, metrics_files
        c = core.config
        self.context = AnalysisContext.from_config(c, core.reg, encoders=core.encoders, tasks=core.tasks,
                                                   datasets=core.datasets)
        self.outputs = analysis_outputs(self.context, core.R)
        # What the captions say the figures come from (the provenance sidecars hold the file-level chain).
        self.runs = (f"{len(core.encoders)} encoders ({', '.join(core.encoders)}); {len(core.tasks)} tasks "
                     f"({', '.join(core.tasks)}); protocols {', '.join(c['protocols'])}; seeds "
                     f"{', '.join(map(str, c['seeds']))}; regimes {', '.join(c['regimes'])}; "
                     f"{self.context.split} split")

    def families(self) -> list[tuple[str, str]]:
        """(family, rule name) of every family this config produces, in report order."""
        return [(f, rule) for f, (rule, _) in FAMILY_RULES.items() if f in self.outputs]

    def inputs(self, family: str) -> dict[str, str]:
        return family_inputs(family, self.core.R, self.context)

    def params(self, family: str) -> dict:
        return self.context.params_for(family)

    def reported_outputs(self, family: str, report) -> dict:
        """The family's named outputs, figures (and report tables) wrapped in Snakemake's ``report()`` with their
        caption and section (FAMILY_RULES)."""
        spec = FAMILY_RULES[family][1]
        out = {}
        for key, path in self.outputs[family].items():
            metric = key[len("png_"):] if key.startswith("png_") and key not in spec else None
            entry = spec.get(key) or (spec.get("png") if metric else None)
            if entry is None:
                out[key] = path
                continue
            caption, category, subcategory = entry
            out[key] = report(path, caption=f"../report/{caption}.rst", category=category, subcategory=subcategory,
                              labels={"figure": caption.replace("_", " "), "metric": metric or self.context.metric})
        return out

    def targets(self) -> list[str]:
        """Analysis outputs requested by `all` (only those whose inputs this config produces)."""
        return [path for outputs in self.outputs.values() for path in outputs.values()]

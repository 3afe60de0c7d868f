"""Plan of FOCUS's paper tables and figures (rules focus_tables and focus_figure in workflow/rules/reliability.smk;
retinabench.reliability.focus_tables, retinabench.figures.focus): each planned only when the config produces its
inputs, else a skipped-analyses row with the reason."""
from __future__ import annotations

from retinabench.plan.core import alternatives

# figure -> what it needs besides the collected reliability tables: "" (nothing), "mllm" (an MLLM interface job),
# "zeroshot" (a dual encoder's zero-shot job), "lora" (the LoRA adapter deltas)
FIGURES = {"spiders": "", "auroc_ece": "", "mllm_size": "mllm", "probe_vs_zeroshot": "zeroshot",
           "dataset_heatmap": "", "calibration_curves": "", "sft_deltas": "lora"}
TABLES = {"table3": "", "table4": "general_ophthalmic", "table10": "lora"}
WHY = {"mllm": "no MLLM runs (mllm.enabled with an MLLM entry)",
       "zeroshot": "no dual-encoder zero-shot runs (zeroshot.enabled with a dual encoder among the encoders)",
       "lora": "LoRA SFT is off (lora.enabled with lora.sources): no adapter deltas",
       "general_ophthalmic": "the encoders lack a general (natural-image) or an ophthalmic (cfp / oct) model"}


class FocusPlan:
    figure_constraint = alternatives(FIGURES)

    def __init__(self, rel):
        self.rel, self.core = rel, rel.core

    def encoders(self) -> dict[str, dict]:
        """Registry entries of every encoder whose predictions the reliability layer evaluates."""
        names = list(getattr(self.core, "weight_entries", self.core.encoders))
        return {e: self.core.reg.encoder(e) for e in names}

    def _has(self, need: str) -> bool:
        if not need:
            return True
        interfaces = getattr(self.core, "interfaces", None)
        jobs = interfaces.jobs if interfaces is not None else {}
        if need in ("mllm", "zeroshot"):
            return any(i == need for i, _, _ in jobs)
        if need == "lora":
            lora = getattr(self.core, "lora", None)
            return bool(lora is not None and lora.jobs)
        from retinabench.reliability.focus_tables import model_groups
        doms = set(model_groups(self.encoders())["domain_group"])
        return {"general", "ophthalmic"} <= doms

    def lora_comparisons(self) -> list[str]:
        return [self.core.lora.delta_outputs()["comparisons"]] if self._has("lora") else []

    def table_names(self) -> list[str]:
        return [t for t, need in TABLES.items() if self._has(need)]

    def figure_names(self) -> list[str]:
        return [f for f, need in FIGURES.items() if self._has(need)]

    def table_outputs(self) -> dict[str, str]:
        return {f"{t}_{ext}": self.core.path("focus_table", table=t, ext=ext) for t in self.table_names()
                for ext in ("csv", "tex")}

    def table_inputs(self) -> dict:
        return {"metrics": self.rel.table("metrics"), "gaps": self.rel.table("gaps"),
                "comparisons": self.lora_comparisons()}

    def figure_inputs(self, wc) -> dict:
        need = {"calibration_curves": {"bins": self.rel.table("bins")},
                "sft_deltas": {"comparisons": self.lora_comparisons()}}.get(wc.figure, {})
        return {"metrics": self.rel.table("metrics"), "gaps": self.rel.table("gaps"), **need}

    def figure_outputs(self) -> dict[str, str]:
        return {ext: self.core.path("focus_figure", ext=ext) for ext in ("png", "pdf")}

    def params(self) -> dict:
        """A FOCUS job's params: tasks and encoder entries, the regime drawn, the fairness attributes and the LoRA
        hard-decision variant (Table 5's)."""
        s = self.rel.settings
        return {"tasks": self.rel.plan_tasks, "encoders": self.encoders(), "regime": s.figures.regime,
                "fairness_attributes": list(s.fairness_score_attributes),
                "variant": self.core.settings.lora.deltas.variant}

    @staticmethod
    def report_section(wc) -> str:
        from retinabench.skipped import SECTIONS
        return SECTIONS[f"focus_{wc.figure}"]

    def report_tables(self) -> dict:
        """Table outputs, the CSVs as report items (category: the table's report section)."""
        from retinabench.skipped import SECTIONS
        return {k: (v if k.endswith("_tex") else
                    {"path": v, "category": SECTIONS[f"focus_{k[:-4]}"],
                     "labels": {"table": k[:-4]}})
                for k, v in self.table_outputs().items()}

    def targets(self) -> list[str]:
        figs = [self.core.path("focus_figure", figure=f, ext=e) for f in self.figure_names() for e in ("png", "pdf")]
        return list(self.table_outputs().values()) + figs

    def skipped(self) -> list[dict]:
        from retinabench.skipped import record
        return ([record(f"focus_{t}", WHY[need]) for t, need in TABLES.items() if not self._has(need)]
                + [record(f"focus_{f}", WHY[need]) for f, need in FIGURES.items() if not self._has(need)])

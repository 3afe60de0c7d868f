"""Plan of workflow/rules/reliability.smk: transfer (encoder x harmonised group with >= 2 datasets), one
evaluation job per predictions table of any protocol, collection, paired comparisons and four figures."""
from __future__ import annotations

from retinabench.plan.core import CorePlan, alternatives
from retinabench.reliability.evaluation import KINDS

# figure -> (settings section it reads, the collected tables it draws). Each figure is a folder of panel groups
# (one file per dataset / attribute / harmonised task, figures/reliability.py) plus skipped.csv (groups left out
# for lack of data, and why; collected into the skipped-analyses table).
FIGURES = {"reliability_diagrams": ("calibration", ["bins", "calibration"]),
           "fairness_gaps": ("fairness", ["gaps"]),
           "subgroup_scatter": ("fairness", ["subgroups"]),
           "transfer": ("transfer", ["metrics"])}


class ReliabilityPlan:
    kinds = KINDS
    figures = FIGURES
    figure_constraint = alternatives(FIGURES)

    def __init__(self, core: CorePlan, prediction_files):
        """``prediction_files()``: {"<source>/<encoder>/<task or group>": path} of every protocol the config runs
        besides transfer (retinabench.plan.WorkflowPlan.prediction_files)."""
        from retinabench.data.derived import transfer_groups
        self.core, self._upstream = core, prediction_files
        self.settings = core.settings.reliability
        self.plan_tasks = {t: core.reg.task(t) for t in core.tasks}
        self.transfer_groups = transfer_groups(self.plan_tasks)
        self.group_constraint = alternatives(self.transfer_groups)
        # Settings each per-job table depends on (figure, paired and transfer settings only rerun their own jobs).
        self.job_settings = self.settings.plain(exclude={"figures", "paired", "transfer", "harmonised",
                                                         "protocol_sensitivity"})
        from retinabench.plan.sensitivity import SensitivityPlan
        self.sensitivity = SensitivityPlan(core, prediction_files)
        from retinabench.plan.focus import FocusPlan
        self.focus = FocusPlan(self)  # FOCUS's Tables 3 / 4 / 10 and figures (plan/focus.py)

    def parts(self, *keys: str) -> dict:
        """These keys of the ``reliability:`` settings as plain data (a job's params)."""
        return self.settings.plain(include=set(keys))

    def transfer_prediction_files(self) -> dict[str, str]:
        return {f"transfer/{e}/{g}": self.core.path("predictions", source="transfer", encoder=e, name=g)
                for e in self.core.encoders for g in self.transfer_groups}

    def prediction_files(self) -> dict[str, str]:
        """Every predictions table the layer evaluates, {"<source>/<encoder>/<task or group>": path}."""
        return {**self._upstream(), **self.transfer_prediction_files()}

    def tasks_of(self, source: str, name: str) -> list[str]:
        """Task names a predictions table covers: a transfer group's tasks, an interface job's task set, else the
        task itself."""
        if source == "transfer":
            return self.transfer_groups[name]
        interfaces = getattr(self.core, "interfaces", None)
        return (interfaces.tasks_of(source, name) if interfaces is not None else None) or [name]

    def datasets_of(self, source: str, name: str) -> list[str]:
        return list(dict.fromkeys(self.core.task_dataset(t) for t in self.tasks_of(source, name)))

    def job_inputs(self, wc) -> dict:
        core = self.core
        return {"predictions": core.path("predictions", source=wc.source, encoder=wc.encoder, name=wc.name),
                "manifests": [core.path("manifest", dataset=d) for d in self.datasets_of(wc.source, wc.name)],
                "exclusions": [core.path("exclusions", dataset=d) for d in self.datasets_of(wc.source, wc.name)],
                "splits": [core.task_split(t) for t in self.tasks_of(wc.source, wc.name)]}

    def job_outputs(self) -> dict[str, str]:
        return {k: self.core.path("reliability_job", kind=k) for k in KINDS}

    def job_table(self, key: str, kind: str) -> str:
        """The ``kind`` table of the reliability job of predictions ``key`` ("<source>/<encoder>/<name>")."""
        source, encoder, name = key.split("/", 2)
        return self.core.path("reliability_job", source=source, encoder=encoder, name=name, kind=kind)

    def job_tables(self, kind: str) -> list[str]:
        return [self.job_table(key, kind) for key in self.prediction_files()]

    def table(self, name: str) -> str:
        """A collected reliability table (reliability/<name>.parquet)."""
        return self.core.path("reliability_table", table=name)

    def collected(self) -> dict[str, str]:
        return {k: self.table(k) for k in KINDS}

    def collect_outputs(self) -> dict[str, str]:
        """Rule reliability_collect: the collected per-kind tables, the subgroup metrics and the summary scores."""
        return {**self.collected(), "subgroup_metrics": self.table("subgroup_metrics"),
                "scores": self.table("summary_scores")}

    def paired_outputs(self) -> dict[str, str]:
        return {"comparisons": self.table("paired_comparisons"), "domains": self.table("paired_domains")}

    def figure_inputs(self, wc) -> dict[str, str]:
        return {k: self.table(k) for k in self.figures[wc.figure][1]}

    def paired_sources(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for key, path in self.prediction_files().items():
            source = key.split("/")[0]
            if source in self.settings.paired.sources:
                out.setdefault(source, []).append(path)
        return out

    def figure_names(self) -> list[str]:
        """The figures this config draws (transfer needs a harmonised task shared by two selected datasets)."""
        return [f for f in FIGURES if f != "transfer" or self.transfer_groups]

    @staticmethod
    def report_section(wc) -> str:
        """The report section of a figure job (retinabench.skipped.SECTIONS; a wildcards callable)."""
        from retinabench.skipped import SECTIONS
        return SECTIONS[wc.figure]

    @staticmethod
    def section(output: str) -> str:
        """The report section of ``output`` (retinabench.skipped.SECTIONS)."""
        from retinabench.skipped import SECTIONS
        return SECTIONS[output]

    def figure_dir(self, figure: str) -> str:
        return self.core.path("reliability_figure", figure=figure)

    def figure_targets(self) -> list[str]:
        return [self.figure_dir(f) for f in self.figure_names()]

    def skipped(self) -> list[dict]:
        """Planned rows of the skipped-analyses table (retinabench.skipped) for this layer."""
        from retinabench.skipped import record
        if self.transfer_groups:
            return self.focus.skipped()
        return self.focus.skipped() + [record("transfer", "no harmonised task is shared by two selected datasets (out-of-distribution "
                                   "transfer needs a second dataset with the task)")]

    def targets(self) -> list[str]:
        return (list(self.collect_outputs().values()) + list(self.paired_outputs().values())
                + self.figure_targets() + self.sensitivity.targets() + self.focus.targets())

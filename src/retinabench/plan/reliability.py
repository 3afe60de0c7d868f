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
        self.root = f"{core.R}/reliability"
        self.plan_tasks = {t: core.reg.task(t) for t in core.tasks}
        self.transfer_groups = transfer_groups(self.plan_tasks)
        self.group_constraint = alternatives(self.transfer_groups)
        # Settings each per-job table depends on (figure, paired and transfer settings only rerun their own jobs).
        self.job_settings = self.settings.plain(exclude={"figures", "paired", "transfer", "harmonised"})

    def parts(self, *keys: str) -> dict:
        """These keys of the ``reliability:`` settings as plain data (a job's params)."""
        return self.settings.plain(include=set(keys))

    def transfer_prediction_files(self) -> dict[str, str]:
        return {f"transfer/{e}/{g}": f"{self.core.R}/predictions/transfer/{e}/{g}.parquet"
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
        return {"predictions": f"{core.R}/predictions/{wc.source}/{wc.encoder}/{wc.name}.parquet",
                "manifests": [core.data(d, "manifest.parquet") for d in self.datasets_of(wc.source, wc.name)],
                "exclusions": [core.data(d, "exclusions.parquet") for d in self.datasets_of(wc.source, wc.name)],
                "splits": [core.task_split(t) for t in self.tasks_of(wc.source, wc.name)]}

    def job_outputs(self) -> dict[str, str]:
        return {k: f"{self.root}/jobs/{{source}}/{{encoder}}/{{name}}/{k}.parquet" for k in KINDS}

    def job_tables(self, kind: str) -> list[str]:
        return [f"{self.root}/jobs/{key}/{kind}.parquet" for key in self.prediction_files()]

    def collected(self) -> dict[str, str]:
        return {k: f"{self.root}/{k}.parquet" for k in KINDS}

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

    def figure_dir(self, figure: str) -> str:
        return f"{self.core.R}/figures/reliability/{figure}"

    def figure_targets(self) -> list[str]:
        return [self.figure_dir(f) for f in self.figure_names()]

    def skipped(self) -> list[dict]:
        """Planned rows of the skipped-analyses table (retinabench.skipped) for this layer."""
        from retinabench.skipped import record
        if self.transfer_groups:
            return []
        return [record("transfer", "no harmonised task is shared by two selected datasets (out-of-distribution "
                                   "transfer needs a second dataset with the task)")]

    def targets(self) -> list[str]:
        root = self.root
        return ([f"{root}/{k}.parquet" for k in KINDS]
                + [f"{root}/subgroup_metrics.parquet", f"{root}/summary_scores.parquet",
                   f"{root}/paired_comparisons.parquet", f"{root}/paired_domains.parquet"]
                + self.figure_targets())

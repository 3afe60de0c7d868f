"""Plan of workflow/rules/lora.smk: LoRA SFT of MLLMs (config `lora:`). One training job per (MLLM, source task)
with `lora.gpus` GPUs, one inference job per adapter (1 GPU) on its source task (in-domain) and on every other
grid task of the same task / harmonised id (out-of-domain), and one job pairing every adapter result with the
base model's `mllm` result on the same test set (reliability/adapter_deltas.py; FOCUS Table 5)."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from retinabench.plan.core import CorePlan, alternatives
from retinabench.skipped import LORA

DELTA_TABLES = ("comparisons", "domains", "pairs", "unpaired")


@dataclass(frozen=True)
class AdapterJob:
    encoder: str
    source: str                  # the source task (its dataset is the source dataset)
    test_tasks: tuple[str, ...]  # the source task first, then the out-of-domain tasks


@dataclass(frozen=True)
class NotRun:
    """A planned adapter evaluation this grid cannot run (``lora.unavailable``): its source or test set is a
    ``<dataset>/<harmonised id>`` with no task here."""
    encoder: str
    source: str
    test: str
    reason: str

    @property
    def in_domain(self) -> bool:
        return self.source == self.test


class LoraPlan:
    report_section = LORA  # the report's category of the Table-5 outputs

    def __init__(self, core: CorePlan, interfaces):
        self.core, self.interfaces = core, interfaces
        self.settings = core.settings.lora
        self.train = self.settings.train
        self.enabled = self.settings.enabled
        self.jobs: dict[tuple[str, str], AdapterJob] = {}
        self.not_run: list[NotRun] = []
        self.constraint_encoders = self.constraint_tasks = alternatives([])
        if not self.enabled:
            return
        from retinabench.plan.interface_jobs import selected_entries
        encoders = {n: core.reg.encoder(n) for n in core.reg.encoders}
        names = self.settings.encoders or interfaces.settings["mllm"].encoders
        chosen = selected_entries(encoders, "mllm", names)
        sources = self._sources()
        for enc in chosen:
            for src in sources:
                self.jobs[(enc, src)] = AdapterJob(enc, src, self._test_tasks(src))
        self.not_run = self._not_run(chosen, sources)
        self.constraint_encoders = alternatives(sorted({j.encoder for j in self.jobs.values()}))
        self.constraint_tasks = alternatives(sorted({j.source for j in self.jobs.values()}))

    # -- selection ------------------------------------------------------------------------------------------
    def _sources(self) -> list[str]:
        out = []
        for pattern in self.settings.sources:
            hits = [t for t in self.core.tasks if fnmatch.fnmatchcase(t, pattern)]
            if not hits:
                raise KeyError(f"lora.sources: {pattern!r} matches no task of the grid {list(self.core.tasks)}")
            out += [t for t in hits if t not in out]
        if not out:
            raise ValueError("lora is enabled but lora.sources names no source task")
        for t in out:
            classes = self.core.reg.task(t)["classes"]
            if len(classes) != 2:
                raise ValueError(f"lora.sources: task {t!r} has {len(classes)} classes; yes/no SFT needs a binary task")
        return out

    def _compatible(self, source: str, task: str) -> bool:
        if source == task:
            return True
        h = self.core.reg.task(source).get("harmonised")
        return h is not None and h == self.core.reg.task(task).get("harmonised")

    def _test_tasks(self, source: str) -> tuple[str, ...]:
        wanted = self.settings.test_tasks
        if wanted == "auto":
            others = [t for t in self.core.tasks if t != source and self._compatible(source, t)]
        else:
            bad = [t for t in wanted if t not in self.core.tasks]
            if bad:
                raise KeyError(f"lora.test_tasks: {bad} are not tasks of the grid")
            others = [t for t in wanted if t != source and self._compatible(source, t)]
        return (source, *others)

    # -- a study's evaluations this grid cannot run (lora.unavailable) ------------------------------------------
    def _unavailable(self) -> dict[str, tuple[str, str, str]]:
        """{"<dataset>/<harmonised id>": (dataset, harmonised id, reason)}, each checked against the grid."""
        reg, out = self.core.reg, {}
        grid = {(reg.task(t)["dataset"], reg.task(t).get("harmonised")): t for t in self.core.tasks}
        known = {h for _, h in grid if h is not None}
        for dataset, entries in self.settings.unavailable.items():
            for h, reason in entries.items():
                key = f"lora.unavailable.{dataset}.{h}"
                if h not in known:
                    raise KeyError(f"{key}: {h!r} is the harmonised id of no grid task (known: {sorted(known)})")
                if (dataset, h) in grid:
                    raise ValueError(f"{key}: the grid runs it (task {grid[(dataset, h)]!r}): remove the entry")
                if not str(reason).strip():
                    raise ValueError(f"{key}: give the reason it cannot run")
                out[f"{dataset}/{h}"] = (dataset, h, str(reason).strip())
        return out

    def _not_run(self, encoders: list[str], sources: list[str]) -> list[NotRun]:
        """The planned evaluations involving an unavailable set: an unavailable (dataset, harmonised id) is a source
        when its dataset and id are among the selected sources' (FOCUS: train datasets x train tasks), and a test
        set of every source of its id on another dataset (test_tasks auto)."""
        missing = self._unavailable()
        if not missing:
            return []
        reg = self.core.reg
        src_datasets = {reg.task(t)["dataset"] for t in sources}
        src_ids = {reg.task(t).get("harmonised") for t in sources}
        virtual = [v for v, (d, h, _) in missing.items() if d in src_datasets and h in src_ids]
        auto = self.settings.test_tasks == "auto"
        out = []
        for enc in encoders:
            for src in sources:  # a runnable adapter tested on an unavailable set
                d, h = reg.task(src)["dataset"], reg.task(src).get("harmonised")
                out += [NotRun(enc, src, v, r) for v, (vd, vh, r) in missing.items()
                        if auto and h is not None and vh == h and vd != d]
            for v in virtual:  # an adapter that cannot be trained: none of its evaluations run
                d, h, r = missing[v]
                tests = [v] + ([t for t in self.core.tasks if reg.task(t).get("harmonised") == h
                                and reg.task(t)["dataset"] != d]
                               + [w for w, (wd, wh, _) in missing.items() if wh == h and wd != d] if auto else [])
                out += [NotRun(enc, v, t, r if t == v or t in self.core.tasks else f"{r}; {missing[t][2]}")
                        for t in tests]
        return out

    def counts(self) -> dict[str, int]:
        """Planned adapter evaluations: in-domain and out-of-domain, those that run and those that cannot."""
        run_in = len(self.jobs)
        run_out = sum(len(j.test_tasks) - 1 for j in self.jobs.values())
        not_in = sum(n.in_domain for n in self.not_run)
        not_out = len(self.not_run) - not_in
        return {"in_domain": run_in + not_in, "out_of_domain": run_out + not_out, "in_domain_run": run_in,
                "out_of_domain_run": run_out, "in_domain_not_run": not_in, "out_of_domain_not_run": not_out}

    def skipped(self) -> list[dict]:
        """Skipped-table rows (retinabench.skipped) for the planned evaluations that cannot run: one per (source,
        test set), ``n`` = the MLLMs it concerns."""
        from retinabench import skipped as skip_table
        groups: dict[tuple[str, str, str], int] = {}
        for n in self.not_run:
            groups[(n.source, n.test, n.reason)] = groups.get((n.source, n.test, n.reason), 0) + 1
        return [skip_table.record("lora_table5", f"adapter {src} tested on {test} "
                                  f"({'in-domain' if src == test else 'out-of-domain'}) cannot run: {reason}",
                                  part=f"{src} -> {test}", n=k)
                for (src, test, reason), k in sorted(groups.items())]

    # -- base-model results (the mllm interface's jobs) ------------------------------------------------------
    def base_predictions(self, encoder: str, task: str) -> str | None:
        """The `mllm` job's predictions table holding ``encoder`` on ``task`` (None: no such job)."""
        for (interface, enc, _), j in sorted(self.interfaces.jobs.items()):
            if interface == "mllm" and enc == encoder and task in j.tasks:
                return j.predictions_path(self.core.R)
        return None

    def prompt_set(self) -> str:
        if self.train.prompt_set:
            return self.train.prompt_set
        from retinabench.prompts import load_prompts
        return load_prompts(self.interfaces.prompts_path).default("mllm")

    def problems(self) -> list[str]:
        """What stops the start-up: a test task without the base model's result on it (the deltas pair every
        adapter result with it), the adapter's prompt set left out of the base runs, unpinned entries."""
        if not self.enabled:
            return []
        from retinabench.plan.selection import unpinned_encoders
        out = unpinned_encoders(self.core.reg, sorted({j.encoder for j in self.jobs.values()}))
        sets = self.interfaces.settings["mllm"].prompt_sets
        if sets is not None and self.prompt_set() not in sets:
            out.append(f"the adapters are trained and tested with prompt set {self.prompt_set()!r}, which "
                       f"mllm.prompt_sets {list(sets)} leaves out: the base model has no result to pair with")
        for j in self.jobs.values():
            for t in j.test_tasks:
                if self.base_predictions(j.encoder, t) is None:
                    out.append(f"{j.encoder} adapter from {j.source} is tested on {t}, but the mllm interface does "
                               f"not run {j.encoder} on {t} (enable mllm for it, with {t} in a task set): no base "
                               "result to pair with")
        return out

    # -- paths -----------------------------------------------------------------------------------------------
    def job(self, wc) -> AdapterJob:
        return self.jobs[(wc.encoder, wc.task)]

    def train_dir(self, encoder: str, task: str) -> str:
        return self.core.path("lora_run", encoder=encoder, task=task)

    def train_outputs(self) -> dict[str, str]:
        core = self.core
        return {"adapter": core.path("lora_adapter"), "train_log": core.path("lora_train_log"),
                "compute": core.path("lora_compute")}

    def infer_outputs(self) -> dict[str, str]:
        core = self.core
        return {"predictions": core.path("predictions", source="mllm_lora", name="{task}"),
                "metrics": core.path("job_metrics", source="mllm_lora", name="{task}")}

    def prediction_files(self) -> dict[str, str]:
        """{"mllm_lora/<encoder>/<source task>": adapter predictions path}."""
        pattern = self.infer_outputs()["predictions"]
        return {f"mllm_lora/{e}/{t}": pattern.format(encoder=e, task=t) for (e, t) in sorted(self.jobs)}

    def delta_outputs(self) -> dict[str, str]:
        core = self.core
        return {**{k: core.path("lora_delta", table=k) for k in DELTA_TABLES}, "table5": core.path("lora_table5"),
                "figure": core.path("lora_figure", ext="png"), "figure_pdf": core.path("lora_figure", ext="pdf")}

    def targets(self) -> list[str]:
        if not self.jobs:
            return []
        return (list(self.prediction_files().values())
                + [self.infer_outputs()["metrics"].format(encoder=e, task=t) for (e, t) in sorted(self.jobs)]
                + list(self.delta_outputs().values()))

    # -- one job ---------------------------------------------------------------------------------------------
    def train_inputs(self, wc) -> dict:
        core, j = self.core, self.job(wc)
        d = core.task_dataset(j.source)
        return {"prompts": self.interfaces.prompts_path, "split": core.task_split(j.source),
                "manifest": core.path("manifest", dataset=d),
                **core.cache_files(d), **self.core.local_weights(wc.encoder)}

    def train_params(self, wc) -> dict:
        j = self.job(wc)
        s = self.settings
        return {"entry": self.core.reg.encoder(j.encoder), "task": self.core.reg.task(j.source),
                "train": s.train.plain(), "device": s.device, "processes": s.processes, "gpus": s.gpus,
                "dtype": self.interfaces.settings["mllm"].dtype}

    def infer_inputs(self, wc) -> dict:
        core, j = self.core, self.job(wc)
        out = {"adapter": self.train_outputs()["adapter"].format(encoder=j.encoder, task=j.source),
               "prompts": self.interfaces.prompts_path,
               "splits": [core.task_split(t) for t in j.test_tasks],
               "manifests": [core.path("manifest", dataset=d) for d in self.datasets(j)],
               **self.core.local_weights(wc.encoder)}
        out.update(self.interfaces.image_inputs("mllm", self.datasets(j)))  # the mllm interface's `inputs`
        return out

    def datasets(self, j: AdapterJob) -> list[str]:
        return list(dict.fromkeys(self.core.task_dataset(t) for t in j.test_tasks))

    def infer_params(self, wc) -> dict:
        j = self.job(wc)
        return {"entry": self.core.reg.encoder(j.encoder), "tasks": [self.core.reg.task(t) for t in j.test_tasks],
                "datasets": self.datasets(j), "settings": self.interfaces.settings["mllm"].plain(),
                "device": self.settings.device, "source": j.source}

    def infer_locations(self):
        """The inference job's ``locations`` param (CorePlan.located): ``native`` inputs' raw folders, merged into
        its ``job`` param as ``roots``."""
        return self.core.located(job=lambda wc: self.interfaces.image_params("mllm", self.datasets(self.job(wc))))

    def delta_inputs(self) -> dict:
        base = sorted(p for p in {self.base_predictions(j.encoder, t) for j in self.jobs.values() for t in j.test_tasks}
                      if p is not None)
        datasets = sorted({d for j in self.jobs.values() for d in self.datasets(j)})
        return {"adapters": list(self.prediction_files().values()), "base": base,
                "manifests": [self.core.path("manifest", dataset=d) for d in datasets]}

    def delta_params(self) -> dict:
        tasks = sorted({t for j in self.jobs.values() for t in j.test_tasks})
        return {"tasks": {t: self.core.reg.task(t) for t in tasks}, "deltas": self.settings.deltas.plain()}

    # -- resources ---------------------------------------------------------------------------------------------
    def _size(self, encoder: str) -> dict:
        from retinabench.registry.sizes import SIZE_CLASSES
        return SIZE_CLASSES[self.core.reg.encoder(encoder)["size_class"]]

    def train_resource(self, key: str):
        def value(wc):
            c = self._size(wc.encoder)
            if key == "gpu":
                return self.settings.gpus
            if key == "mem_mb":
                # each process holds a bf16 copy of the base model in host memory while loading it (x 1.5 for the
                # loader's buffers); at least the size class's host memory
                params_m = float(self.core.reg.encoder(wc.encoder).get("params_m") or 0.0)
                return max(int(c["mem_mb"]), int(self.settings.gpus * params_m * 2 * 1.5))
            return int(c["runtime"]) * 4  # one epoch over a training split: a few feature passes' worth
        return value

    def infer_resource(self, key: str):
        def value(wc):
            c, j = self._size(wc.encoder), self.job(wc)
            if key == "gpu":
                return 1
            if key == "mem_mb":
                return int(c["mem_mb"])
            return int(c["runtime"]) * len(self.datasets(j))
        return value

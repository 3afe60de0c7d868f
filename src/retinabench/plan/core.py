"""The core of the plan (workflow/rules/common.smk, data.smk, features.smk, probes.smk): what the config selects,
where every artifact of the data, features and frozen-probe layers goes, and per-job settings and resources."""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

from retinabench.registry.sizes import SIZE_CLASSES, feature_batch_size
from retinabench.plan.code import rule_code_hash
from retinabench.plan.paths import Paths
from retinabench.plan.run_lock import RunLock
from retinabench.settings import Config, PhantomSettings, load
from retinabench.plan.selection import dataset_tasks, plan


def alternatives(names) -> str:
    """A wildcard constraint matching exactly ``names`` (nothing when empty)."""
    return "|".join(re.escape(str(n)) for n in names) or "(?!)"


def merge_locations(params: dict) -> dict:
    """A job's params with its ``locations`` param (:meth:`CorePlan.located`) merged in: a mapping merged key by key
    into the param of the same name, anything else set; what a stage reads (workflow/scripts/stage.py)."""
    def merge(base, extra):
        if isinstance(base, Mapping) and isinstance(extra, Mapping):
            return {**base, **{k: merge(base.get(k), v) for k, v in extra.items()}}
        return extra
    out = {k: v for k, v in params.items() if k != "locations"}
    return merge(out, params.get("locations") or {})


def intended_executor(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The executor this run will use (--executor / -e, else the profile's `executor`), read from the command
    line: Snakemake picks the executor only after it has parsed the Snakefile."""
    import yaml
    argv = sys.argv[1:] if argv is None else argv
    env: Mapping[str, str] = os.environ if environ is None else environ
    for i, arg in enumerate(argv):
        if arg in ("--executor", "-e") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--executor="):
            return arg.split("=", 1)[1]
    profile = next((argv[i + 1] for i, a in enumerate(argv) if a == "--profile" and i + 1 < len(argv)),
                   env.get("SNAKEMAKE_PROFILE"))
    if profile:
        for folder in (profile, os.path.join(os.path.expanduser("~/.config/snakemake"), profile)):
            cfg = os.path.join(folder, "config.yaml")
            if os.path.isfile(cfg):
                with open(cfg) as fh:
                    return (yaml.safe_load(fh) or {}).get("executor")
    return None


class CorePlan:
    def __init__(self, config: dict | Config):
        """``config``: a config dict (validated here: every problem in one ConfigError) or a loaded Config."""
        self.settings = load(config)     # the typed configuration (retinabench.settings)
        self.config = config = self.settings.plain()  # the same as plain data: what rules and params read
        self.selection = plan(config)
        self.reg = self.selection.registries
        self.R = self.selection.results
        self.datasets, self.tasks, self.encoders = (self.selection.datasets, self.selection.tasks,
                                                    self.selection.encoders)
        self.cache_tag = f"{config['image_cache']['size']}_{config['image_cache']['resize']}"
        self.paths = Paths(self.R, cache_tag=self.cache_tag)  # every artifact path (retinabench.plan.paths)
        self.generated_roots = {d["root"]: name for name, d in self.reg.datasets.items() if d.get("generated")}
        self.local = intended_executor() in (None, "local", "dryrun")
        self.run_lock = RunLock(self.R)  # one writer per results folder (Snakefile onstart / onsuccess / onerror)

    alternatives_of = staticmethod(alternatives)

    @property
    def phantom_metadata(self) -> str:
        """The generated phantom's metadata file, wildcard ``generated_root``: under the results folder
        (``<results>/raw/<root>``, :meth:`~retinabench.plan.selection.Plan.dataset_root`), never under data_root."""
        return self.path("phantom_metadata")

    # -- locations: params that never decide a rerun ---------------------------------------------------------
    @staticmethod
    def located(**parts):
        """The ``locations`` param of a rule: where a job finds or keeps files (a raw folder under data_root,
        checkpoint folders and other paths under results), never what decides a rerun. Content decides: the raw
        fingerprint, manifests, sidecars and the other inputs. Snakemake leaves a param out of its params rerun
        trigger when the param's function takes ``input`` (a "derived" param: ``Job.non_derived_params``), so this
        param's function takes it, unused; workflow/scripts/stage.py merges the returned mapping into the job's
        params (``{"job": {"roots": ...}}`` adds ``roots`` to the ``job`` param), so a stage reads a location
        where it always did. ``parts``: name -> a value or a function of the wildcards."""
        def locations(wildcards, input) -> dict:  # noqa: ARG001 - ``input`` marks the param derived (see above)
            return {k: v(wildcards) if callable(v) else v for k, v in parts.items()}
        return locations

    def dataset_root(self, wc) -> str:
        """The raw folder of the job's dataset (a location: pass it through :meth:`located`)."""
        return self.selection.dataset_root(wc.dataset)

    # -- code, resources -----------------------------------------------------------------------------------
    @staticmethod
    def code(rule: str, *extra_modules: str) -> str:
        return rule_code_hash(rule, *extra_modules)

    def manifest_code(self, wc) -> str:
        """The manifest stage's code plus this dataset's adapter only (adding another adapter reruns nothing)."""
        from retinabench.data.adapters import ADAPTERS
        adapter = self.reg.dataset(wc.dataset)["adapter"]
        if adapter not in ADAPTERS:
            raise KeyError(f"no adapter {adapter!r}; known adapters: {sorted(ADAPTERS)}")
        return rule_code_hash("manifest", ADAPTERS[adapter].__module__)

    def encoder_resource(self, key: str):
        return lambda wc: SIZE_CLASSES[self.reg.encoder(wc.encoder)["size_class"]][key]

    def feature_settings(self, wc) -> dict:
        """The features config of one encoder's jobs, its batch size resolved from the size class."""
        features = self.config["features"]
        return {**features, "batch_size": feature_batch_size(self.reg.encoder(wc.encoder), features)}

    # -- paths ---------------------------------------------------------------------------------------------
    def task_dataset(self, task: str) -> str:
        return self.reg.task(task)["dataset"]

    def path(self, artifact: str, /, **values) -> str:
        """An artifact path by name (retinabench.plan.paths.PATHS); wildcards not given stay wildcards."""
        return self.paths.path(artifact, **values)

    def log(self, rule: str, /, **values) -> str:
        """A rule's log (retinabench.plan.paths.LOGS)."""
        return self.paths.log(rule, **values)

    def cache_files(self, dataset: str) -> dict[str, str]:
        return {"array": self.path("image_cache", dataset=dataset),
                "index": self.path("image_cache_index", dataset=dataset)}

    def task_split(self, task: str) -> str:
        return self.path("task_split", dataset=self.task_dataset(task), task=task)

    # -- encoder weights a job loads from a local path (a job reads only what it declares) ---------------------
    @property
    def weight_entries(self) -> list[str]:
        """Every encoder entry some job of this plan loads (the workflow plan adds fine-tuning, compute, the
        interfaces and LoRA to the config's encoders)."""
        return list(self.encoders)

    def local_weights(self, encoder: str) -> dict[str, str]:
        """``{"weights": path}`` for an entry loaded from a local ``weights_path`` (the demo's tiny models, built
        into the results folder by rule tiny_model), else nothing: every job loading the entry declares it, so
        the rule that builds it runs first and a missing file is Snakemake's error, not the job's."""
        path = self.reg.encoder(encoder).get("weights_path")
        return {"weights": path} if path else {}

    def tiny_models(self) -> dict[str, dict]:
        """{entry: its `tiny_model` build spec} of the planned entries a demo registry builds (rule tiny_model)."""
        return {n: self.reg.encoder(n)["tiny_model"] for n in self.weight_entries
                if self.reg.encoder(n).get("tiny_model")}

    def tiny_model_params(self, wc) -> dict:
        return self.tiny_models()[wc.name]

    def tiny_model_constraint(self) -> str:
        return alternatives(sorted(self.tiny_models()))

    def tiny_model_problems(self) -> list[str]:
        """Tiny-model entries whose weights_path is not the folder rule tiny_model writes."""
        out = []
        for name in self.tiny_models():
            want = self.tiny_model_folder().format(name=name)
            got = self.reg.encoder(name).get("weights_path")
            if got != want:
                out.append(f"encoder {name!r}: a tiny_model entry must have weights_path "
                           f"'{{results}}/tiny_models/{name}' (rule tiny_model builds it in the results folder: "
                           f"{want!r}), not {got!r}")
        return out

    def tiny_model_folder(self) -> str:
        return self.path("tiny_model")

    def feature_inputs(self, wc) -> dict[str, str]:
        """A features job: the dataset's image cache and the encoder's local weights."""
        return {**self.cache_files(wc.dataset), **self.local_weights(wc.encoder)}

    def features(self, encoder: str, dataset: str) -> str:
        return self.path("features", encoder=encoder, dataset=dataset)

    def images_of_task(self, task: str) -> dict[str, str]:
        """Image cache and split of a task (the inputs of every image-based job)."""
        return {**self.cache_files(self.task_dataset(task)), "split": self.task_split(task)}

    def index_files(self, dataset: str) -> list[str]:
        return [os.path.join(self.selection.dataset_root(dataset), f) for f in self.reg.dataset(dataset)["index_files"]]

    def index_inputs(self, dataset: str) -> list[str]:
        """The manifest job's index-file inputs: a generated dataset's (rule phantom writes them), or those of a
        dataset whose raw folder is missing (Snakemake then names them); none otherwise, because an input's path is
        itself a rerun trigger ("set of input files changed") and the raw fingerprint already covers every raw
        file's content, index files included: moving the raw folder reruns nothing."""
        entry = self.reg.dataset(dataset)
        if entry.get("generated") or not os.path.isdir(self.selection.dataset_root(dataset)):
            return self.index_files(dataset)
        return []

    def frozen(self, kind: str) -> list[str]:
        name = {"metrics": "job_metrics", "training_logs": "training_log"}.get(kind, kind)
        return [self.path(name, source="frozen", encoder=e, name=t) for e in self.encoders for t in self.tasks]

    def frozen_prediction_files(self) -> dict[str, str]:
        return {f"frozen/{e}/{t}": self.path("predictions", source="frozen", encoder=e, name=t)
                for e in self.encoders for t in self.tasks}

    # -- settings ------------------------------------------------------------------------------------------
    def phantom_settings(self, wc) -> dict:
        """The config's phantom settings, overridden per dataset by its registry `options` (checked by the same
        model)."""
        name = self.generated_roots[wc.generated_root]
        options = self.reg.dataset(name).get("options") or {}
        return PhantomSettings.of({**self.config["phantom"], **options}, f"dataset {name}: options").plain()

    @property
    def images_settings(self) -> dict:
        """The config's `images:` section (the manifest job's minimum image size)."""
        return self.settings.images.plain()

    def dataset_tasks(self, dataset: str) -> list[dict]:
        return dataset_tasks(self.reg, dataset)

    def protocol_settings(self, names) -> dict:
        """{section: settings} of the `features` protocols ``names`` (retinabench.protocols.registry), as plain
        data (job params)."""
        from retinabench.protocols.registry import PROTOCOLS
        PROTOCOLS.check(names, "features", "protocols")
        return {PROTOCOLS.get(n).section: PROTOCOLS.get(n).settings(self.settings).plain() for n in names}

    def frozen_settings(self) -> dict:
        c = self.config
        return {"names": c["protocols"], "seeds": c["seeds"], "regimes": c["regimes"],
                **self.protocol_settings(c["protocols"])}

    def targets(self) -> list[str]:
        targets = [self.path("metrics"), self.path("analysis_table", table="rank_summary", ext="csv"),
                   self.path("figure", figure="rank_distribution", ext="png")]
        targets += [self.path("exclusions", dataset=d) for d in self.datasets]
        targets += [self.path("duplicates", dataset=d) for d in self.datasets]
        if len(self.datasets) > 1:  # test images of one dataset that duplicate training images of another
            targets.append(self.path("cross_duplicates"))
        return targets

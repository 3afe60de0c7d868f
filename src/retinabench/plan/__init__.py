"""The one plan of a workflow run: every layer's targets, paths, per-job settings, resources and code hashes,
built once from the validated config, torch-free (the Snakefile builds it at parse time, in every job too).

``workflow/rules/*.smk`` declare rules only and ask this plan for everything else; a consumer asks the producer's
plan for paths (the reliability layer asks for every protocol's prediction files, the analysis layer for every
metrics file). One sub-plan per rule file: :class:`CorePlan` (common, data, features, probes),
:class:`FinetunePlan`, :class:`InterfacesPlan`, :class:`LoraPlan`, :class:`ReliabilityPlan`, :class:`AnalysisPlan`, :class:`SaliencyPlan`, :class:`ComputePlan`.
"""
from __future__ import annotations

import os
import sys

from retinabench.plan.analysis import AnalysisPlan
from retinabench.plan.core import CorePlan, alternatives, intended_executor
from retinabench.plan.finetune import FinetunePlan
from retinabench.plan.interfaces import InterfacesPlan
from retinabench.plan.lora import LoraPlan
from retinabench.plan.reliability import ReliabilityPlan
from retinabench.plan.compute import ComputePlan
from retinabench.plan.saliency import SaliencyPlan
from retinabench.plan.selection import ConfigError, check_config


class WorkflowPlan(CorePlan):
    def __init__(self, config: dict):
        super().__init__(config)
        self.finetune = FinetunePlan(self)
        self.interfaces = InterfacesPlan(self)
        self.lora = LoraPlan(self, self.interfaces)
        self.reliability = ReliabilityPlan(self, self.prediction_files)
        self.analysis = AnalysisPlan(self, self.metrics_files, self.reliability)
        self.saliency = SaliencyPlan(self, self.finetune)
        self.compute = ComputePlan(self, self.finetune)
        from retinabench.data.raw_state import RawState
        self.raw_states = {d: RawState(self.selection.dataset_root(d), self.path("dataset_folder", dataset=d)) for d in self.datasets
                           if not self.reg.dataset(d).get("generated")}
        self._refreshed: set[str] = set()

    @property
    def weight_entries(self) -> list[str]:
        """Every encoder entry a job loads: the config's encoders, fine-tuning's, the compute benchmark's, the
        interfaces' and LoRA's (rule tiny_model builds those of a demo registry)."""
        names = list(self.encoders)
        names += self.finetune.encoders if self.finetune.on else []
        names += self.compute.encoders if self.compute.on else []
        names += self.interfaces.encoders() + [e for e, _ in self.lora.jobs]
        return list(dict.fromkeys(names))

    # -- what downstream layers read -----------------------------------------------------------------------
    def prediction_files(self) -> dict[str, str]:
        """{"<source>/<encoder>/<task>": path} of every protocol's per-(encoder, task) predictions except transfer
        (the reliability plan adds its own), by kind in the protocol registry: one frozen table per (encoder, task)
        holds every `features` protocol of the config; each `images` protocol (fine-tuning, when enabled) has its
        own. Downstream layers (reliability, analysis) read this, never a hand-kept list."""
        from retinabench.protocols.registry import PROTOCOLS
        kinds = {PROTOCOLS.get(p).kind for p in self.config["protocols"]}
        files = self.frozen_prediction_files() if "features" in kinds else {}
        files.update(self.finetune.prediction_files())
        files.update(self.interfaces.prediction_files())  # `prompts` protocols: one table per (entry, task set)
        return files

    def metrics_files(self) -> list[str]:
        """Per-job metrics tables of every protocol the config runs (collect_metrics concatenates them)."""
        return self.frozen("metrics") + self.finetune.metrics_files() + self.interfaces.metrics_files()

    def all_targets(self) -> list[str]:
        return (self.targets() + self.analysis.targets() + self.reliability.targets() + self.finetune.targets()
                + self.saliency.targets() + self.compute.targets() + self.interfaces.targets()
                + self.lora.targets())

    def interface_targets(self) -> list[str]:
        """Target rule `interfaces`: the prompt-based protocols alone (their jobs, tables and per-job reliability
        tables), without the features / probes / analysis of `all` (config/interfaces_demo.yaml runs this)."""
        keys = self.interfaces.prediction_files()
        return self.interfaces.targets() + [self.reliability.job_table(k, kind) for k in keys
                                            for kind in self.reliability.kinds]

    def lora_targets(self) -> list[str]:
        """Target rule `lora`: train -> base + adapter inference -> paired deltas, without the features / probes /
        analysis of `all` (config/mllm_demo.yaml runs this)."""
        return self.lora.targets()

    def aggregate_targets(self) -> list[str]:
        """The tables and figures built from many jobs (metrics table, reliability and analysis outputs): what a
        failed run checks against their inputs (Snakefile `onerror`, retinabench.integrity.report_stale)."""
        return [self.path("metrics")] + self.reliability.targets() + self.analysis.targets()

    # -- start-up ------------------------------------------------------------------------------------------
    def missing_raw_folders(self) -> list[str]:
        """Selected datasets whose raw folder is gone although their manifest was built: their results are kept
        and nothing depending on them is rerun (Snakemake sees no newer input), so say so, naming each."""
        notes = []
        for dataset, state in self.raw_states.items():
            manifest = self.path("manifest", dataset=dataset)
            if not state.root.is_dir() and os.path.exists(manifest):
                notes.append(f"raw folder of dataset {dataset} is missing: {state.root} (is data_root right?); its "
                             f"results built from {manifest} are kept and nothing depending on it is rerun; "
                             f"`retinabench verify {dataset}` cannot check them until the folder is back")
        return notes

    def raw_fingerprint(self, dataset: str, *, main_process: bool) -> list[str]:
        """The dataset's raw fingerprint input (retinabench.data.raw_state), refreshed once per workflow start in
        the main process: a changed, added or removed raw file makes it newer than the manifest, which reruns.
        Generated datasets and datasets without a raw folder have none (Snakemake then reports the manifest's
        missing index files)."""
        if self.reg.dataset(dataset).get("generated") or not self.raw_states[dataset].root.is_dir():
            return []
        state = self.raw_states[dataset]
        if main_process and dataset not in self._refreshed:
            changes = state.refresh()
            self._refreshed.add(dataset)
            listed = changes["changed"] + changes["added"] + changes["removed"]
            if listed and os.path.exists(self.path("manifest", dataset=dataset)):
                print(f"retinabench: raw data of {dataset} changed since its manifest was built: "
                      f"{len(changes['changed'])} changed, {len(changes['added'])} added, "
                      f"{len(changes['removed'])} removed (e.g. {listed[:3]}); see {state.fingerprint_path}",
                      file=sys.stderr)
        return [str(state.fingerprint_path)]

    def start(self, *, main_process: bool) -> None:
        """What the main process checks before any job runs, all problems listed at once (ConfigError): raw changes
        first (a dataset whose raw data changed is rebuilt, not checked), then fractions, unpinned encoders,
        devices, class placement and knn.k on built manifests; saliency and compute settings. Remote jobs re-read
        the Snakefile and skip this. A lock on the results folder is announced here (a dry run goes on), and
        `snakemake --unlock` removes it (retinabench.plan.run_lock)."""
        if not main_process or self.run_lock.at_parse(sys.argv):  # `snakemake --unlock`: nothing else to check
            return
        for dataset in self.raw_states:
            self.raw_fingerprint(dataset, main_process=True)
        for note in self.missing_raw_folders():
            print(f"retinabench: warning: {note}", file=sys.stderr)
        for note in check_config(self.config, self.selection, local=self.local):
            print(f"retinabench: {note}", file=sys.stderr)
        self.interfaces.print_notes()
        unpinned = self.interfaces.problems() + self.tiny_model_problems()
        if unpinned:
            raise ConfigError([f"zeroshot / mllm: {p}" for p in unpinned])
        lora = self.lora.problems()
        if lora:
            raise ConfigError([f"lora: {p}" for p in lora])
        sal_devices, _ = self.saliency.problems()
        if sal_devices:
            raise ConfigError(sal_devices)
        compute = self.compute.problems()
        if compute:
            raise ConfigError([f"compute: {p}" for p in compute])

    def take_run_lock(self, *, enabled: bool) -> None:
        """The Snakefile's onstart: the results folder's run lock (RunLockError naming its holder when another run
        has it). ``enabled`` False (``--nolock``) skips it, as Snakemake skips its own lock."""
        if not enabled:
            print(f"retinabench: --nolock: the results folder {self.run_lock.results} is not locked; another run "
                  f"on it may delete or overwrite this run's outputs", file=sys.stderr)
            return
        self.run_lock.acquire()
        print(f"retinabench: locked the results folder {self.run_lock.results} for this run ({self.run_lock.path}, "
              f"removed when the run ends)", file=sys.stderr)


__all__ = ["AnalysisPlan", "ComputePlan", "CorePlan", "FinetunePlan", "ReliabilityPlan", "SaliencyPlan",
           "InterfacesPlan", "LoraPlan", "WorkflowPlan", "alternatives", "intended_executor"]

"""The stage registry: one entry per Snakemake rule name, refusing duplicates.

A stage is registered under the name of the rule that runs it (``@stage("frozen")``), so rule file, pipeline
module and stage are one name and one hop apart: ``workflow/rules/probes.smk`` rule ``frozen`` ->
:mod:`retinabench.pipeline.probes` ``@stage("frozen")``. Pipeline modules import nothing heavy at module level
(torch is imported inside the stages that need it), so loading the registry is cheap and torch-free.
"""
from __future__ import annotations

import importlib
from typing import Callable

# One pipeline module per workflow/rules/*.smk file (common.smk and resources.smk hold no stages).
MODULES = ("data", "features", "probes", "finetune", "interfaces", "lora", "reliability", "analysis", "saliency", "compute")


class StageRegistry:
    def __init__(self) -> None:
        self._stages: dict[str, Callable] = {}
        self._loaded = False

    def register(self, *rules: str) -> Callable[[Callable], Callable]:
        """Decorator: register the function as the stage of ``rules`` (a rule and its `use rule ... as` copies)."""
        def decorate(fn: Callable) -> Callable:
            for rule in rules:
                self.add(rule, fn)
            return fn
        return decorate

    def add(self, rule: str, fn: Callable) -> None:
        if rule in self._stages and self._stages[rule] is not fn:
            old = self._stages[rule]
            raise ValueError(f"stage {rule!r} is registered twice: {old.__module__}.{old.__qualname__} and "
                             f"{fn.__module__}.{fn.__qualname__}")
        self._stages[rule] = fn

    def load(self) -> StageRegistry:
        if not self._loaded:
            for name in MODULES:
                importlib.import_module(f"retinabench.pipeline.{name}")
            self._loaded = True
        return self

    def get(self, rule: str) -> Callable:
        self.load()
        try:
            return self._stages[rule]
        except KeyError:
            raise KeyError(f"no stage for rule {rule!r}; known: {sorted(self._stages)}") from None

    def names(self) -> list[str]:
        return sorted(self.load()._stages)

    def __contains__(self, rule: str) -> bool:
        return rule in self.load()._stages


STAGES = StageRegistry()
stage = STAGES.register

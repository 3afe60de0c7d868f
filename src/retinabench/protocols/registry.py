"""The protocol registry: every protocol the benchmark runs, with one predictions contract
(retinabench.schemas.PREDICTIONS), as data. Torch-free: a protocol's code is imported only when it runs.

A :class:`Protocol` declares

* ``kind`` — what it consumes: ``features`` (cached frozen features: kNN, linear, logistic, centroid probes; run
  by the frozen and transfer jobs through ``fit`` / ``predict``), ``images`` (trains on the image cache: full
  fine-tuning, augmented linear probing; LoRA SFT of MLLMs) or ``prompts`` (image-text models and MLLMs
  prompted per class: zero-shot, MLLM yes/no; no training);
* ``section`` — its config section (``knn:``, ``linear:``, ...), whose model in :mod:`retinabench.settings` holds
  its settings, their types and defaults (:meth:`Protocol.settings` returns it, typed);
* ``module`` — where its code lives: for ``features`` protocols ``fit(x_train, y_train, x_val, y_val, n_classes, *,
  seed, balanced, settings) -> (model, training-log rows or None)`` and ``predict(model, x) -> [n, n_classes]``
  probabilities; for the other kinds the job function (``module:function``) their pipeline stage calls;
* ``deterministic`` — runs once (seed 0) instead of once per seed;
* ``family`` — the protocol names one job of it writes (``zeroshot`` writes ``zeroshot`` and ``zeroshot_focus``).

A new frozen probe is one module (``fit`` / ``predict``) + one entry here + its settings model and config section
(retinabench.settings); the frozen and transfer jobs, the config checks and the reliability / analysis layers
pick it up from here.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pydantic import BaseModel

from retinabench.settings import Section, section_model

KINDS = ("features", "images", "prompts")


@dataclass(frozen=True)
class Protocol:
    name: str
    kind: str
    module: str
    section: str | None = None
    deterministic: bool = False
    family: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"protocol {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.section is not None:
            section_model(self.section)  # a section the settings declare

    def code(self):
        module, _, _ = self.module.partition(":")
        return importlib.import_module(module)

    def fit(self, *args, **kwargs):
        return self.code().fit(*args, **kwargs)

    def predict(self, model, x):
        return self.code().predict(model, x)

    def job(self) -> Callable:
        module, _, fn = self.module.partition(":")
        if not fn:
            raise TypeError(f"protocol {self.name!r} ({self.kind}) has no job function (module:function)")
        return getattr(importlib.import_module(module), fn)

    @property
    def settings_model(self) -> type[Section]:
        if self.section is None:
            raise TypeError(f"protocol {self.name!r} has no settings section")
        return section_model(self.section)

    def settings(self, config: Mapping[str, Any] | BaseModel) -> Any:
        """Its typed settings: its section of ``config`` (a whole config or job params holding the section),
        validated by the section's model (unknown keys are an error naming them, with a "did you mean")."""
        return self.settings_model.from_config(config)


class ProtocolRegistry:
    def __init__(self) -> None:
        self._protocols: dict[str, Protocol] = {}

    def register(self, protocol: Protocol) -> Protocol:
        names = (protocol.name, *protocol.family)
        taken = [n for n in names if n in self._protocols or n in self._family_names()]
        if taken:
            raise ValueError(f"protocol name(s) {taken} are registered twice (new: {protocol.module})")
        self._protocols[protocol.name] = protocol
        return protocol

    def _family_names(self) -> set[str]:
        return {n for p in self._protocols.values() for n in p.family}

    def get(self, name: str) -> Protocol:
        try:
            return self._protocols[name]
        except KeyError:
            raise KeyError(f"unknown protocol {name!r}; known: {sorted(self._protocols)}") from None

    def names(self, kind: str | None = None) -> list[str]:
        return [n for n, p in self._protocols.items() if kind is None or p.kind == kind]

    def check(self, names, kind: str, where: str) -> None:
        """``names`` must be protocols of ``kind`` (the error lists the known ones)."""
        bad = [n for n in names if n not in self.names(kind)]
        if bad:
            raise ValueError(f"{where}: unknown {kind} protocol(s) {bad}; known: {self.names(kind)}")


PROTOCOLS = ProtocolRegistry()
register = PROTOCOLS.register

# -- frozen features ---------------------------------------------------------------------------------------------
register(Protocol("knn", "features", "retinabench.protocols.knn", section="knn", deterministic=True,
                  description="weighted kNN on cosine similarity (OcularBench)"))
register(Protocol("linear", "features", "retinabench.protocols.linear", section="linear",
                  description="linear head on cached features, AdamW + cosine schedule, best validation epoch"))
register(Protocol("logreg", "features", "retinabench.protocols.logreg", section="logreg", deterministic=True,
                  description="class-balanced logistic regression; logreg.variant: ours (standardised input) or "
                              "focus (L2-normalised input, FOCUS)"))
register(Protocol("centroid", "features", "retinabench.protocols.centroid", section="centroid", deterministic=True,
                  description="nearest class centroid (prototype) on cosine similarity"))
# -- images --------------------------------------------------------------------------------------------------------
register(Protocol("finetune", "images", "retinabench.protocols.finetune:run_finetune", section="finetune",
                  description="full fine-tuning, the paper's two-stage learning-rate sweep"))
register(Protocol("linear_aug", "images", "retinabench.protocols.finetune:run_finetune", section="finetune",
                  description="frozen encoder, linear head trained on augmented images (the paper's linear probe)"))

# -- prompts (retinabench.protocols.interfaces: job planning; one job per entry x task set) ----------------------
register(Protocol("zeroshot", "prompts", "retinabench.protocols.zeroshot:run", section="zeroshot", deterministic=True,
                  family=("zeroshot", "zeroshot_focus"),
                  description="CLIP-like zero-shot: the model's own head (zeroshot) and FOCUS's x100 softmax "
                              "(zeroshot_focus)"))
register(Protocol("mllm", "prompts", "retinabench.protocols.mllm:run", section="mllm", deterministic=True,
                  family=("mllm", "mllm_renorm"),
                  description="MLLM yes/no prompting: raw p_yes (mllm, FOCUS) and p_yes/(p_yes+p_no) (mllm_renorm), "
                              "one parsed answer, invalid answers kept"))


def frozen_protocols() -> list[str]:
    return PROTOCOLS.names("features")


# -- LoRA SFT of MLLMs (workflow/rules/lora.smk): trains on the image cache, then answers with the mllm job function
register(Protocol("mllm_lora", "images", "retinabench.protocols.lora_launch:train_job", section="lora",
                  deterministic=True, family=("mllm_lora", "mllm_lora_renorm"),
                  description="LoRA SFT of an MLLM on a source task's training split (FOCUS), answered like mllm / "
                              "mllm_renorm by the adapted model; paired with the base model in- and out-of-domain"))

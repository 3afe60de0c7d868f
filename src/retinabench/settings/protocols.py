"""Settings of the protocols of retinabench.protocols.registry: the `features` probes (knn, linear, logreg,
centroid) and the `prompts` interfaces (zeroshot, mllm). The registry finds a protocol's model through its
section (:func:`retinabench.settings.section_model`)."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from retinabench.settings.base import (Auto, Device, Fraction, Names, NonNegativeFloat, PositiveFloat, PositiveInt,
                                       Regimes, Section)

# `k: auto` -> min(AUTO_K, training images) (retinabench.protocols.knn.resolve_k).
AUTO_K = 20


class KnnSettings(Section):
    """Weighted kNN on cosine similarity (retinabench.protocols.knn, OcularBench)."""

    section: ClassVar[str] = "knn"
    k: PositiveInt | Auto = Field(20, description=f"neighbours; auto: min({AUTO_K}, training images), recorded per "
                                                  "job; a number above the training set is an error")
    temperature: PositiveFloat = Field(0.07, description="votes exp(similarity / temperature)")


class LinearSettings(Section):
    """Linear probe on cached features: AdamW, warm-up + cosine, best validation epoch
    (retinabench.protocols.linear)."""

    section: ClassVar[str] = "linear"
    epochs: PositiveInt = Field(100, description="bookkeeping epochs of steps_per_epoch optimisation steps")
    steps_per_epoch: PositiveInt = Field(25, description="optimisation steps per bookkeeping epoch")
    batch_size: PositiveInt = Field(64, description="feature vectors per step")
    lr: PositiveFloat = Field(0.001, description="AdamW learning rate")
    weight_decay: NonNegativeFloat = Field(0.0001, description="AdamW weight decay")
    warmup_frac: Fraction = Field(0.1, description="linear warm-up over this fraction of the steps, then cosine "
                                                   "decay")


class LogregSettings(Section):
    """FOCUS-style logistic regression, class-balanced, standardised input (retinabench.protocols.logreg)."""

    section: ClassVar[str] = "logreg"
    C: PositiveFloat = Field(1.0, description="inverse regularisation strength (scikit-learn)")
    max_iter: PositiveInt = Field(2000, description="solver iterations")


class CentroidSettings(Section):
    """Nearest class centroid (prototype) probe on cosine similarity (retinabench.protocols.centroid)."""

    section: ClassVar[str] = "centroid"
    temperature: PositiveFloat = Field(0.07, description="softmax temperature of the cosine scores (calibration "
                                                         "only: accuracy and AUROC do not depend on it)")


# -- the prompt-based interfaces: one GPU job per (registry entry, task set) ------------------------------------
class ZeroShotSettings(Section):
    """What a zero-shot job reads (retinabench.protocols.zeroshot.run)."""

    prompt_sets: Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description="prompt sets of the prompt registry to run; null: every set that covers a task")
    regimes: Regimes = Field(["u-u"], description="which rows are predicted (zero-shot trains nothing)")
    batch_size: PositiveInt = Field(64, description="images per forward pass")
    device: Device = Field("auto", description="auto: CUDA if present")


class _Planned(Section):
    """The planning keys of an interface section (which jobs run)."""

    enabled: bool = Field(False, description="opt-in")
    encoders: Names | None = Field(None, description="registry entries; null: every entry declaring the interface")
    task_sets: dict[str, Annotated[list[str], Field(min_length=1)]] | None = Field(
        None, description="{name: [tasks]}, one job per entry and set; null: one set `all` of the config's tasks")


class ZeroShotSection(ZeroShotSettings, _Planned):
    """Zero-shot prompting of image-text models: protocols zeroshot (the model's own head) and zeroshot_focus
    (FOCUS's x100 softmax)."""

    section: ClassVar[str] = "zeroshot"

    def job(self) -> ZeroShotSettings:
        """The job's settings (the section without its planning keys)."""
        return ZeroShotSettings.model_validate(self.model_dump(include=set(ZeroShotSettings.model_fields)))


class MLLMSettings(ZeroShotSettings):
    """What an MLLM yes/no job reads (retinabench.protocols.mllm.run)."""

    batch_size: PositiveInt = Field(8, description="images per generation batch")
    max_new_tokens: PositiveInt = Field(8, description="greedy decoding; the answer must start within it")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="auto: bfloat16 on CUDA, float32 on CPU")


class MLLMSection(MLLMSettings, _Planned):
    """MLLM yes/no prompting: protocols mllm (raw p_yes, FOCUS) and mllm_renorm (p_yes / (p_yes + p_no)); one
    parsed answer, invalid answers kept."""

    section: ClassVar[str] = "mllm"

    def job(self) -> MLLMSettings:
        """The job's settings (the section without its planning keys)."""
        return MLLMSettings.model_validate(self.model_dump(include=set(MLLMSettings.model_fields)))

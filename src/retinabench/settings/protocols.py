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


# Logistic-probe variants (retinabench.protocols.logreg), ours first (the default), and each one's solver
# iterations: the one place max_iter is stated (`logreg.max_iter: auto` reads it).
LOGREG_VARIANTS = ("ours", "focus")
LOGREG_MAX_ITER = {"ours": 2000, "focus": 1000}


class LogregSettings(Section):
    """Logistic regression, class-balanced (retinabench.protocols.logreg): ours standardises the features, FOCUS's
    L2-normalises them."""

    section: ClassVar[str] = "logreg"
    variant: Literal["ours", "focus"] = Field(
        "ours", description="ours: standardised features (StandardScaler); focus: L2-normalised features, no scaler "
                            "(FOCUS's LogisticRegression(max_iter=1000, class_weight='balanced'))")
    C: PositiveFloat = Field(1.0, description="inverse regularisation strength (scikit-learn)")
    max_iter: PositiveInt | Auto = Field("auto", description="solver iterations; auto: the variant's (ours "
                                                             f"{LOGREG_MAX_ITER['ours']}, focus "
                                                             f"{LOGREG_MAX_ITER['focus']})")

    @property
    def iterations(self) -> int:
        """max_iter resolved: the configured number, or the variant's."""
        return LOGREG_MAX_ITER[self.variant] if self.max_iter == "auto" else int(self.max_iter)


class CentroidSettings(Section):
    """Nearest class centroid (prototype) probe on cosine similarity (retinabench.protocols.centroid)."""

    section: ClassVar[str] = "centroid"
    temperature: PositiveFloat = Field(0.07, description="softmax temperature of the cosine scores (calibration "
                                                         "only: accuracy and AUROC do not depend on it)")


# -- the prompt-based interfaces: one GPU job per (registry entry, task set) ------------------------------------
class _PromptJob(Section):
    """What every prompt-based job reads."""

    prompt_sets: Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description="prompt sets of the prompt registry to run; null: every set that covers a task")
    regimes: Regimes = Field(["u-u"], description="which rows are predicted (zero-shot trains nothing)")
    batch_size: PositiveInt = Field(64, description="images per forward pass")
    device: Device = Field("auto", description="auto: CUDA if present")
    inputs: Literal["cache", "native"] = Field(
        "cache", description="the images a model receives: cache (the image cache every vision encoder sees, "
                             "resized to the model's input size) or native (FOCUS: the original file, decoded, "
                             "through the model's own processor: its resize, crop or dynamic resolution)")


class ZeroShotSettings(_PromptJob):
    """What a zero-shot job reads (retinabench.protocols.zeroshot.run)."""

    siglip_text_padding: Literal["max_length", "focus"] = Field(
        "max_length", description="transformers SigLIP prompts: max_length (each text padded to the text tower's "
                                  "length, as SigLIP was trained) or focus (FOCUS: padding=True, a task's class "
                                  "prompts tokenised together, padded to the longest); FLAIR (padding enters its "
                                  "text embedding): one call per class, or focus: all classes in one call")


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


class MLLMSettings(_PromptJob):
    """What an MLLM yes/no job reads (retinabench.protocols.mllm.run)."""

    batch_size: PositiveInt = Field(8, description="images per generation batch")
    max_new_tokens: PositiveInt = Field(8, description="greedy decoding; the answer must start within it (FOCUS: "
                                                      "128)")
    invalid_answers: Literal["keep_as_wrong", "drop"] = Field(
        "keep_as_wrong", description="an answer that is neither yes nor no: keep_as_wrong (kept, y_pred -1, wrong in "
                                     "every hard-decision metric) or drop (FOCUS: left out of the predictions, counted "
                                     "in n_answers / n_dropped); invalid_rate is reported either way")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="auto: bfloat16 on CUDA, float32 on CPU")
    backend: Literal["transformers", "vllm"] = Field(
        "transformers", description="the inference engine: transformers (batched generate(), prompts sorted by "
                                    "length) or vllm (vLLM's offline engine in its own conda environment, "
                                    "envs/vllm.yaml; p_yes from the first token's log-probabilities of the same "
                                    "request); same prompts, parser and predictions either way")


class MLLMSection(MLLMSettings, _Planned):
    """MLLM yes/no prompting: protocols mllm (raw p_yes, FOCUS) and mllm_renorm (p_yes / (p_yes + p_no)); one
    parsed answer, invalid answers kept as wrong or dropped (invalid_answers)."""

    section: ClassVar[str] = "mllm"

    def job(self) -> MLLMSettings:
        """The job's settings (the section without its planning keys)."""
        return MLLMSettings.model_validate(self.model_dump(include=set(MLLMSettings.model_fields)))

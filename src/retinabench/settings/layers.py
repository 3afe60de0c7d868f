"""Sections of the opt-in layers: saliency maps of the fine-tuned models (`saliency:`), the compute benchmark
(`compute:`) and LoRA SFT of MLLMs (`lora:`, with its training settings `lora.train`)."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from retinabench.settings.base import (Auto, BootstrapUnit, Device, Distinct, FinetuneProtocols, Names,
                                       NonNegativeFloat, NonNegativeInt, OpenFraction, PairedMetric, PositiveInt,
                                       Precision, Section, Seed)

SALIENCY_BASELINES = ("zeros", "black")
SALIENCY_NT_TYPES = ("smoothgrad", "smoothgrad_sq", "vargrad")
SALIENCY_SIGNS = ("absolute_value", "positive")


class ClaheSettings(Section):
    """scikit-image equalize_adapthist of the grayscale map."""

    clip_limit: Annotated[float, Field(gt=0, le=1)] = Field(0.01, description="contrast clip limit")
    kernel_size: Annotated[int, Field(ge=2)] | None = Field(None, description="null: scikit-image's default")
    nbins: Annotated[int, Field(ge=2)] = Field(256, description="histogram bins")


class SaliencySettings(Section):
    """Saliency maps of the fine-tuned models: integrated gradients in a NoiseTunnel, then grayscale + CLAHE
    (retinabench.saliency, workflow/rules/saliency.smk)."""

    section: ClassVar[str] = "saliency"
    # Keys that select jobs or only change the figure: not part of a saliency job's result.
    NOT_RESULT: ClassVar[tuple[str, ...]] = ("enabled", "encoders", "tasks", "protocols", "checkpoint_seed",
                                             "colormap", "threads")
    enabled: bool = Field(False, description="opt-in: needs finetune.enabled (its jobs then also keep their best "
                                             "weights)")
    encoders: Names | None = Field(None, description="null: fine-tuning's encoders")
    tasks: Names | None = Field(None, description="null: fine-tuning's tasks")
    protocols: FinetuneProtocols | None = Field(None, description="null: fine-tuning's protocols")
    checkpoint_seed: Seed | None = Field(None, description="null: the first fine-tuning seed")
    train_regime: Literal["u", "b"] = Field("u", description="u: models trained on all training images; b: on the "
                                                             "class-balanced undersample")
    images_per_class: PositiveInt = Field(1, description="test images per class, by a seeded hash of their ids (the "
                                                         "same for every encoder)")
    selection_seed: Seed = Field(0, description="seed of the test-image selection hash")
    nt_type: Literal["smoothgrad", "smoothgrad_sq", "vargrad"] = Field(
        "smoothgrad", description="Captum NoiseTunnel around IntegratedGradients, for the predicted class")
    nt_samples: PositiveInt = Field(50, description="noisy copies per image")
    stdev: NonNegativeFloat = Field(0.3, description="Gaussian noise sd, in normalised input units")
    n_steps: Annotated[int, Field(ge=2)] = Field(50, description="integrated-gradients points (Captum's default)")
    baseline: Literal["zeros", "black"] = Field("zeros", description="zeros (normalised; Captum's default) | black")
    nt_samples_batch_size: PositiveInt | None = Field(1, description="noisy copies per IG call (memory only)")
    internal_batch_size: PositiveInt | None = Field(50, description="IG points per forward pass (memory only)")
    noise_seed: Seed = Field(0, description="seed of the NoiseTunnel noise")
    sign: Literal["absolute_value", "positive"] = Field("absolute_value", description="grayscale: |sum over "
                                                                                     "channels| | positive")
    clip_percentile: Annotated[float, Field(gt=0, le=100)] = Field(99.0, description="grayscale maps scaled to [0, 1] "
                                                                                     "at this percentile")
    clahe: ClaheSettings = ClaheSettings()
    colormap: str = Field("inferno", description="matplotlib colormap of the figure")
    device: Device = Field("auto", description="auto: CUDA if present")
    threads: PositiveInt = Field(4, description="a saliency job's threads")

    def job(self) -> dict:
        """A saliency job's settings as plain data (its params): what its result depends on."""
        return self.plain(exclude=set(self.NOT_RESULT))


class InferenceBenchmark(Section):
    """Inference latency and memory: forward passes on test images."""

    batch_size: PositiveInt = Field(1, description="images per forward pass (1, as the paper)")
    warmup: NonNegativeInt = Field(10, description="untimed passes first")
    images: PositiveInt | None = Field(None, description="null: the whole test split")


class TrainingBenchmark(Section):
    """Training time per step and memory: fine-tuning's own train step."""

    batch_size: PositiveInt = Field(64, description="training images per step")
    warmup: NonNegativeInt = Field(3, description="untimed steps first")
    steps: PositiveInt = Field(25, description="timed steps")
    protocols: FinetuneProtocols = Field(["finetune", "linear_aug"], description="training phases benchmarked")
    distinct_batches: PositiveInt = Field(4, description="distinct batches cycled through")


class ComputeSettings(Section):
    """The compute benchmark per encoder (retinabench.compute, workflow/rules/compute.smk); its numbers belong to
    the device the jobs run on."""

    section: ClassVar[str] = "compute"
    # Keys that only select jobs: not part of a benchmark job's result.
    NOT_RESULT: ClassVar[tuple[str, ...]] = ("enabled", "encoders")
    enabled: bool = Field(False, description="opt-in (GPU time)")
    encoders: Names | None = Field(None, description="null: the config's encoders")
    task: str | None = Field(None, description="images of this task's test / train split; null: the config's first "
                                               "task")
    device: Device = Field("auto", description="auto: CUDA if present")
    precision: Precision = Field("auto", description="auto: bf16 autocast on CUDA (as features and fine-tuning), "
                                                     "fp32 on CPU")
    threads: PositiveInt = Field(4, description="the jobs' threads (CPU compute threads; on CUDA the host side)")
    inference: InferenceBenchmark = InferenceBenchmark()
    training: TrainingBenchmark = TrainingBenchmark()

    def job(self) -> dict:
        """A benchmark job's settings as plain data (its params)."""
        return self.plain(exclude=set(self.NOT_RESULT))


LABEL_MASKS = ("answer", "full")  # answer: loss on the assistant turn only (default); full: FOCUS (whole prompt)
LORA_TARGETS = ("language_model", "all_linear")  # ours | FOCUS (peft target_modules="all-linear")
LORA_MODULES_TO_SAVE = ("none", "focus")  # focus: lm_head + embed_tokens trained in full (FOCUS's train_sft.py)
EFFECTIVE_BATCH_RULES = ("keep", "per_process")  # ours (accumulation / W) | FOCUS (batch x accumulation x W)


class LoraSettings(Section):
    """LoRA training of one adapter (retinabench.protocols.lora): r 16, alpha 16, dropout 0.05, 1 epoch, lr 2e-5,
    batch 4 x accumulation 4 (1 x 8 for the 27B size class) as FOCUS's train_sft.py / run_sft.sh; targets,
    modules_to_save, label_mask and effective_batch default to ours, `focus` values reproduce FOCUS."""

    r: PositiveInt = Field(16, description="LoRA rank")
    alpha: PositiveInt = Field(16, description="LoRA alpha (scaling alpha / r)")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(0.05, description="LoRA dropout")
    bias: Literal["none"] = Field("none", description="FOCUS trains no biases")
    epochs: float = Field(1.0, description="training epochs over the source task's training split")
    lr: float = Field(2e-5, description="learning rate")
    scheduler: str = Field("linear", description="transformers lr_scheduler_type")
    warmup_steps: int = Field(0, description="scheduler warm-up steps")
    weight_decay: float = Field(0.0, description="AdamW weight decay")
    batch_size: PositiveInt = Field(4, description="per-device batch")
    grad_accum: PositiveInt = Field(4, description="gradient accumulation steps")
    large_min_params_m: float = Field(20000.0, description="the 27B size class (Gemma-3-27B, MedGemma-27B) from "
                                                           "this many million parameters: large_batch_size x "
                                                           "large_grad_accum")
    large_batch_size: PositiveInt = Field(1, description="per-device batch of the 27B size class")
    large_grad_accum: PositiveInt = Field(8, description="accumulation of the 27B size class")
    max_steps: int = Field(-1, description="> 0: stop after that many optimizer steps (tests, smoke runs)")
    save_steps: PositiveInt = Field(50, description="checkpoint every this many optimizer steps (a killed job "
                                                    "resumes)")
    save_total_limit: int = Field(2, description="checkpoints kept")
    keep_checkpoints: bool = Field(False, description="false: delete the checkpoint folder once the adapter is "
                                                      "written")
    seed: int = Field(0, description="seed of LoRA's initialisation and the data order")
    prompt_set: str | None = Field(None, description="null: the prompt registry's default mllm set")
    label_mask: Literal["answer", "full"] = Field("answer", description="answer: loss on the assistant turn only; "
                                                                        "full: every text token of the conversation, "
                                                                        "image tokens and pads excluded (FOCUS)")
    targets: Literal["language_model", "all_linear"] = Field(
        "language_model", description="language_model: every nn.Linear of the language model; all_linear: every "
                                      "linear module, vision tower and projector included, lm_head excluded (peft "
                                      "target_modules='all-linear'; FOCUS)")
    modules_to_save: Literal["none", "focus"] = Field(
        "none", description="focus: lm_head and embed_tokens trained in full beside LoRA (FOCUS; not for a pure "
                            "Llama model: a hub id with llama and without llava)")
    train_balanced: bool = Field(False, description="true: the balanced subset of the training split only")
    precision: Precision = Field("auto", description="auto: bf16 on CUDA, fp32 on CPU")
    gradient_checkpointing: Auto | bool = Field("auto", description="auto: on CUDA only")
    effective_batch: Literal["keep", "per_process"] = Field(
        "keep", description="keep: under W processes (one per GPU) the accumulation is divided by W, so the effective "
                            "batch stays batch x accumulation; per_process: every process runs batch x accumulation, "
                            "effective batch x W (FOCUS: 4 x 4 x 4 GPUs = 64, 27B class 1 x 8 x 4 = 32)")

    def batching(self, entry: dict) -> tuple[int, int]:
        """(per-device batch, gradient accumulation) for an encoder entry: 1 x 8 for the 27B class."""
        if float(entry.get("params_m") or 0.0) >= self.large_min_params_m:
            return self.large_batch_size, self.large_grad_accum
        return self.batch_size, self.grad_accum

    def per_process(self, entry: dict, world_size: int) -> tuple[int, int]:
        """(per-device batch, accumulation) for one of ``world_size`` processes (see ``effective_batch``)."""
        batch, accum = self.batching(entry)
        if world_size > 1 and self.effective_batch == "keep":
            if accum % world_size:
                raise ValueError(f"lora: gradient accumulation {accum} is not divisible by the {world_size} "
                                 "processes; the effective batch cannot be kept (set grad_accum to a multiple, or "
                                 "effective_batch: per_process for batch x accumulation x processes)")
            accum //= world_size
        return batch, accum

    def record(self) -> dict:
        return self.plain()


class LoraDeltas(Section):
    """Adapter - base paired deltas (FOCUS Table 5; retinabench.reliability.adapter_deltas)."""

    unit: BootstrapUnit = Field("patient", description="bootstrap unit; image: FOCUS")
    n_boot: Annotated[int, Field(ge=1000)] = Field(1000, description="bootstrap resamples")
    seed: int = Field(0, description="seed of the resampling")
    level: OpenFraction = Field(0.95, description="confidence level")
    metrics: Annotated[list[PairedMetric], Field(min_length=1, json_schema_extra={"uniqueItems": True}),
                       Distinct] = Field(["auroc", "auprc", "accuracy", "f1", "ece"], description="metrics compared")
    variant: Literal["invalid_wrong", "valid_both"] = Field("invalid_wrong", description="Table 5's hard-decision "
                                                                                         "variant for invalid answers")


class LoraSection(Section):
    """LoRA SFT of MLLMs, one adapter per (MLLM, source task), evaluated in-domain and on every other grid task of
    the same task / harmonised id, paired with the base model (workflow/rules/lora.smk, docs/lora.md)."""

    section: ClassVar[str] = "lora"
    enabled: bool = Field(False, description="opt-in (needs mllm enabled for the same MLLMs and test tasks: the "
                                             "base results)")
    encoders: Names | None = Field(None, description="null: the MLLMs the mllm interface runs")
    sources: list[str] = Field([], description="source tasks: task names or fnmatch patterns, e.g. [brset_*, "
                                               "mbrset_*] (FOCUS); a single name is a list of one")
    test_tasks: Auto | Annotated[list[str], Field(min_length=1)] = Field(
        "auto", description="auto: each source task + every grid task sharing its harmonised id (out-of-domain)")
    unavailable: dict[str, dict[str, str]] = Field(
        {}, description="{dataset: {harmonised id: why}}: a study's adapter sources / test sets this grid cannot run "
                        "(no such task here); planned with test_tasks auto (a source when its dataset and harmonised "
                        "id are a selected source's) and recorded as not run with the reason")
    gpus: PositiveInt = Field(4, description="a training job's GPUs (one process each); inference jobs take 1")
    processes: Auto | PositiveInt = Field("auto", description="training processes; auto: one per visible GPU, at "
                                                              "most gpus (1 on CPU); an int forces a process group")
    device: Device = Field("auto", description="auto: CUDA if present")
    threads: PositiveInt = Field(4, description="a training job's CPU threads, shared by its processes")
    train: LoraSettings = LoraSettings()
    deltas: LoraDeltas = LoraDeltas()

    @field_validator("sources", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

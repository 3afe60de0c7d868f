"""Sections of fine-tuning (`finetune:`, with its augmentations) and of the two-stage learning-rate sweep
(`sweep:`): retinabench.protocols.finetune / augment / sweep, workflow/rules/finetune.smk."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from retinabench.settings.base import (FINETUNE_PROTOCOLS, Auto, Device, FinetuneProtocols, Fraction, LearningRates,
                                       Names, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                                       Precision, Regimes, Section, Seeds)


class AugmentSettings(Section):
    """Training augmentations, seeded per sample (retinabench.protocols.augment; the paper's list). `crop` and
    `order` pick the pipeline: the geometric zoom (the default) or the OcularBench authors' torchvision pipeline
    (`random_resized_crop`, `crop_last`, sharpness 0.2: config/ocularbench.yaml)."""

    RATIO: ClassVar[tuple[float, float]] = (3.0 / 4.0, 4.0 / 3.0)  # torchvision RandomResizedCrop's default

    enabled: bool = Field(True, description="false: no augmentation (the images as cached)")
    crop: Literal["zoom", "random_resized_crop"] = Field(
        "zoom", description="zoom: a crop of area s ~ U(scale), aspect kept, as a zoom by 1/sqrt(s) (s > 1 zooms "
                            "out); random_resized_crop: torchvision RandomResizedCrop's sampling (area and ratio, "
                            "10 tries for a crop inside the image, else a centre crop: in effect s <= 1)")
    order: Literal["geometry_first", "crop_last"] = Field(
        "geometry_first", description="geometry_first: crop and rotation, flips, sharpness, colour jitter; "
                                      "crop_last (the authors' build_transform): flips, rotation, sharpness, colour "
                                      "jitter, crop")
    scale: Annotated[list[PositiveFloat], Field(min_length=2, max_length=2)] = Field(
        [0.8, 1.2], description="[min, max] crop area as a fraction of the image area (above 1: zoom zooms out, "
                                "random_resized_crop retries)")
    ratio: Annotated[list[PositiveFloat], Field(min_length=2, max_length=2)] = Field(
        list(RATIO), description="[min, max] crop aspect ratio (width / height) of random_resized_crop, "
                                 "log-uniform; zoom keeps the image's")
    rotation: NonNegativeFloat = Field(5.0, description="degrees, uniform in [-rotation, +rotation]")
    hflip: Fraction = Field(0.5, description="probability of a horizontal flip")
    vflip: Fraction = Field(0.5, description="probability of a vertical flip")
    sharpness: NonNegativeFloat = Field(1.0, description="factor of v2.RandomAdjustSharpness (below 1 blurs); 1: off")
    sharpness_p: Fraction = Field(0.5, description="probability of the sharpness adjustment")
    brightness: NonNegativeFloat = Field(0.2, description="factor uniform in [1 - b, 1 + b] (v2.ColorJitter)")
    contrast: NonNegativeFloat = Field(0.2, description="factor uniform in [1 - c, 1 + c]")
    saturation: NonNegativeFloat = Field(0.1, description="factor uniform in [1 - s, 1 + s]")
    hue: Annotated[float, Field(ge=0, le=0.5)] = Field(0.1, description="shift uniform in [-hue, hue]")
    where: Literal["auto", "loader", "device"] = Field(
        "auto", description="auto: on the device on CUDA, in the data loader on CPU")

    @model_validator(mode="after")
    def _ordered_scale(self):
        for key in ("scale", "ratio"):
            lo, hi = getattr(self, key)
            if not lo <= hi:
                raise ValueError(f"finetune.augment.{key} must be [min, max] with min <= max, got {[lo, hi]}")
        if self.crop == "zoom" and tuple(self.ratio) != self.RATIO:
            raise ValueError(f"finetune.augment.ratio {self.ratio} needs crop: random_resized_crop (zoom keeps the "
                             "image's aspect ratio)")
        return self


class TrainConfig(Section):
    """What one fine-tuning run reads (retinabench.protocols.finetune.Trainer / fit); the `finetune:` section
    adds which jobs run."""

    # Fields that cannot change a run's result (by design), left out of the checkpoint fingerprint.
    NO_EFFECT: ClassVar[tuple[str, ...]] = ("checkpoint_every", "num_workers")

    epochs: PositiveInt = Field(100, description="bookkeeping epochs of steps_per_epoch optimisation steps")
    steps_per_epoch: PositiveInt = Field(25, description="optimisation steps per bookkeeping epoch")
    batch_size: PositiveInt = Field(64, description="training images per step")
    eval_batch_size: PositiveInt = Field(128, description="images per forward pass when predicting")
    lr_encoder: PositiveFloat = Field(1.0e-5, description="used only with sweep.enabled false (else the sweep's "
                                                          "choice per encoder)")
    lr_classifier: PositiveFloat = Field(1.0e-3, description="as lr_encoder")
    weight_decay: NonNegativeFloat = Field(1.0e-4, description="as the cached linear probe, so linear and linear_aug "
                                                               "differ only by caching")
    warmup_frac: Fraction = Field(0.1, description="linear warm-up over this fraction of the steps, then cosine decay")
    checkpoint_every: PositiveInt = Field(10, description="epochs; a killed job resumes from its last checkpoint")
    device: Device = Field("auto", description="auto: CUDA if present")
    precision: Precision = Field("auto", description="auto: bf16 autocast on CUDA, fp32 on CPU")
    channels_last: Auto | bool = Field("auto", description="auto: on CUDA")
    compile: bool = Field(False, description="torch.compile the model")
    num_workers: Auto | NonNegativeInt = Field(
        "auto", description="data-loader workers; auto: the rule's threads - 1 on CUDA, 0 on CPU (compute owns the "
                            "cores there)")
    augment: AugmentSettings = AugmentSettings()

    def result_fields(self) -> dict:
        """The fields a run's result depends on (its checkpoint fingerprint)."""
        return self.plain(include=set(TrainConfig.model_fields) - set(self.NO_EFFECT))

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch


class _FinetunePlanning(Section):
    enabled: bool = Field(False, description="opt-in (GPU-sized); config/finetune_demo.yaml is a small CPU demo")
    protocols: FinetuneProtocols = Field(list(FINETUNE_PROTOCOLS), description="finetune: full fine-tuning; "
                                         "linear_aug: frozen encoder, linear head on augmented images")
    encoders: Names | None = Field(None, description="null: the config's encoders")
    tasks: Names | None = Field(None, description="null: the config's tasks")
    seeds: Seeds | None = Field(None, description="null: the config's seeds")
    regimes: Regimes | None = Field(None, description="null: the config's regimes")

    @field_validator("protocols", mode="before")
    @classmethod
    def _known(cls, value):
        bad = sorted({str(v) for v in value} - set(FINETUNE_PROTOCOLS)) if isinstance(value, list) else []
        if bad:
            hint = " (LoRA SFT of MLLMs is its own stage: config `lora:`)" if any("lora" in b for b in bad) else ""
            raise ValueError(f"unknown {bad}; expected a subset of {list(FINETUNE_PROTOCOLS)}{hint}")
        return value


class FinetuneSettings(TrainConfig, _FinetunePlanning):
    """Full fine-tuning and the augmented linear probe, one job per (protocol, encoder, task, seed)
    (workflow/rules/finetune.smk)."""

    section: ClassVar[str] = "finetune"
    # What selects jobs rather than shaping one (left out of a job's params: editing it reruns nothing).
    NOT_RESULT: ClassVar[tuple[str, ...]] = ("enabled", "protocols", "encoders", "tasks", "seeds", "regimes",
                                             "threads")
    keep_checkpoints: bool = Field(False, description="keep a job's checkpoints once its outputs are written")
    threads: PositiveInt = Field(4, description="the fine-tuning rules' threads (capped by --cores)")


# stage -> (protocol, the learning rate it sweeps)
SWEEP_STAGES = {1: ("linear_aug", "lr_classifier"), 2: ("finetune", "lr_encoder")}


class SweepGrid(Section):
    """One encoder's own grids (a missing one: the sweep's)."""

    lr_classifier: LearningRates | None = Field(None, description="null: sweep.lr_classifier")
    lr_encoder: LearningRates | None = Field(None, description="null: sweep.lr_encoder")


class SweepSettings(Section):
    """The paper's two-stage learning-rate sweep per encoder; the pick: lowest validation loss
    (retinabench.protocols.sweep)."""

    section: ClassVar[str] = "sweep"
    enabled: bool = Field(True, description="with finetune.enabled; false: finetune.lr_encoder / lr_classifier")
    task: str | None = Field(None, description="null: the first fine-tuned task")
    sensitivity_task: str | None = Field("auto", description="auto: the second fine-tuned task, if any; null: none")
    sensitivity_encoders: Names | None = Field(None, description="encoders the sensitivity task repeats both stages "
                                                                 "for; null: every fine-tuned encoder")
    sensitivity_regimes: Regimes | None = Field(
        None, description="regimes of the sensitivity task's runs; null: sweep.regimes ([b-b]: trained, validated and "
                          "tested on the task's class-balanced subsets)")
    lr_classifier: LearningRates = Field([1.0e-4, 1.0e-3, 1.0e-2], description="stage 1 (linear_aug)")
    lr_encoder: LearningRates = Field([1.0e-7, 1.0e-6, 1.0e-5, 1.0e-4, 1.0e-3],
                                      description="stage 2 (finetune), stage 1's lr_classifier fixed")
    seeds: Seeds = Field([0], description="seeds of each learning rate's runs (the pick averages over them)")
    regimes: Regimes = Field(["u-u"], description="regimes of each run (their training regimes are trained)")
    epochs: PositiveInt | None = Field(None, description="null: finetune.epochs")
    steps_per_epoch: PositiveInt | None = Field(None, description="null: finetune.steps_per_epoch")
    encoders: dict[str, SweepGrid] = Field({}, description="per-encoder grids: {name: {lr_classifier: [...], "
                                                           "lr_encoder: [...]}}")

    def grid(self, encoder: str) -> dict[str, list[float]]:
        """The learning-rate grids of ``encoder`` (sorted): the sweep's, overridden by ``encoders.<encoder>``."""
        own = self.encoders.get(encoder, SweepGrid())
        return {k: sorted(float(v) for v in (getattr(own, k) or getattr(self, k)))
                for k in ("lr_classifier", "lr_encoder")}

    def tasks(self, finetune_tasks: list[str]) -> tuple[str, str | None]:
        """(sweep task, sensitivity task or None) for the fine-tuned tasks ``finetune_tasks``."""
        task = self.task or (finetune_tasks[0] if finetune_tasks else None)
        if task is None:
            raise ValueError("sweep: no task to sweep on (set sweep.task)")
        sens = self.sensitivity_task
        if sens == "auto":
            sens = next((t for t in finetune_tasks if t != task), None)
        if sens == task:
            raise ValueError(f"sweep.sensitivity_task must differ from sweep.task ({task!r})")
        return task, sens

    def sensitivity_of(self, encoders: list[str]) -> list[str]:
        """The encoders of ``encoders`` (the fine-tuned ones, in their order) the sensitivity task repeats the
        sweep for; a listed encoder that is not fine-tuned is an error."""
        if self.sensitivity_encoders is None:
            return list(encoders)
        unknown = [e for e in self.sensitivity_encoders if e not in encoders]
        if unknown:
            raise ValueError(f"sweep.sensitivity_encoders {unknown} are not fine-tuned encoders of this config "
                             f"(finetune.encoders / encoders: {list(encoders)})")
        return [e for e in encoders if e in self.sensitivity_encoders]

    def run_regimes(self, sensitivity: bool) -> list[str]:
        """The regimes of the sweep task's runs (``sensitivity`` False) or of the sensitivity task's."""
        return list(self.sensitivity_regimes if sensitivity and self.sensitivity_regimes else self.regimes)

    def train_config(self, finetune: TrainConfig, **overrides) -> TrainConfig:
        """The fine-tuning settings a sweep run trains with: its own epochs / steps when set, ``overrides``."""
        own = {k: getattr(self, k) for k in ("epochs", "steps_per_epoch") if getattr(self, k) is not None}
        return finetune.model_copy(update={**own, **overrides})

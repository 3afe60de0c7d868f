"""The root model of a configuration: every top-level key and section, each default declared once, and
:func:`load`, the one way a config dict (config/config.yaml, --configfile files, --config values) becomes typed
settings."""
from __future__ import annotations

from typing import Annotated, Any, Mapping

from pydantic import Field

from retinabench.settings.base import FeatureProtocols, Names, Native, Regimes, Section, Seeds
from retinabench.settings.data import (DuplicatesSettings, FeaturesSettings, ImageCacheSettings, ImagesSettings,
                                       PhantomSettings, RankingSettings, RegistriesSettings, SplitSettings)
from retinabench.settings.errors import validate
from retinabench.settings.finetune import FinetuneSettings, SweepSettings
from retinabench.settings.layers import ComputeSettings, LoraSection, SaliencySettings
from retinabench.settings.protocols import (CentroidSettings, KnnSettings, LinearSettings, LogregSettings,
                                            MLLMSection, ZeroShotSection)
from retinabench.settings.reliability import AnalysisSettings, ReliabilitySettings


class Config(Section):
    """A retinabench workflow configuration: config/config.yaml, overridden by --configfile files and --config
    values."""

    results: str = Field("results", description="output root (git-ignored)")
    data_root: str = Field("data", description="folder holding real datasets' raw folders; generated ones (the "
                                               "phantom) go to <results>/raw")
    registries: RegistriesSettings = RegistriesSettings()
    datasets: Names = Field(["phantom", "phantom_siteb"], min_length=1,
                            description="datasets of the dataset registry (phantom_siteb: second device/site, "
                                        "controlled domain shift)")
    tasks: Names = Field([], description="tasks of the task registry; empty: every task of the selected datasets")
    encoders: Names = Field(["efficientnet_lite0_in1k", "resnet18_random", "vit_tiny_random"], min_length=1,
                            description="encoders of the encoder registry")
    protocols: FeatureProtocols = Field(["knn", "linear", "logreg"],
                                        description="`features` protocols on cached features "
                                                    "(retinabench.protocols.registry)")
    seeds: Seeds = Field([0, 1, 2], description="seeds of the seeded protocols (deterministic ones run seed 0)")
    regimes: Regimes = Field(["u-u", "u-b", "b-b", "b-u"],
                             description="training-test regimes: u = all images, b = the class-balanced undersample")
    input_size: Native | Annotated[int, Field(ge=32)] = Field(
        "native", description="side of the square input every image encoder runs at (features, fine-tuning, "
                              "compute, saliency, zero-shot): native: each entry's registry input_size; an integer: "
                              "every encoder at that size, ViT position embeddings interpolated (timm / open_clip: "
                              "resampled at load; transformers: interpolate_pos_encoding); OcularBench: 224 "
                              "(docs/encoders.md)")
    split: SplitSettings = SplitSettings()
    duplicates: DuplicatesSettings = DuplicatesSettings()
    images: ImagesSettings = ImagesSettings()
    image_cache: ImageCacheSettings = ImageCacheSettings()
    features: FeaturesSettings = FeaturesSettings()
    knn: KnnSettings = KnnSettings()
    linear: LinearSettings = LinearSettings()
    logreg: LogregSettings = LogregSettings()
    centroid: CentroidSettings = CentroidSettings()
    zeroshot: ZeroShotSection = ZeroShotSection()
    mllm: MLLMSection = MLLMSection()
    ranking: RankingSettings = RankingSettings()
    analysis: AnalysisSettings = AnalysisSettings()
    phantom: PhantomSettings = PhantomSettings()
    reliability: ReliabilitySettings = ReliabilitySettings()
    finetune: FinetuneSettings = FinetuneSettings()
    sweep: SweepSettings = SweepSettings()
    saliency: SaliencySettings = SaliencySettings()
    compute: ComputeSettings = ComputeSettings()
    lora: LoraSection = LoraSection()


def load(config: Mapping[str, Any] | Config) -> Config:
    """The typed configuration of a config dict; every problem (unknown keys with a "did you mean", wrong types,
    values out of range, contradictions within a section) in one
    :class:`~retinabench.settings.errors.ConfigError`."""
    return config if isinstance(config, Config) else validate(Config, dict(config))


def section_model(name: str) -> type[Section]:
    """The model of the top-level section ``name`` (``knn`` -> KnnSettings)."""
    try:
        annotation = Config.model_fields[name].annotation
    except KeyError:
        raise KeyError(f"no config section {name!r}; sections: {sorted(Config.model_fields)}") from None
    if not (isinstance(annotation, type) and issubclass(annotation, Section)):
        raise TypeError(f"config key {name!r} is a value, not a section")
    return annotation

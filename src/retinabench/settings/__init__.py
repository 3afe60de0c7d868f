"""Every configurable setting, once: one pydantic model per config section (``extra="forbid"``, each default
declared on its field), composed by the root :class:`Config`. Torch-free (the Snakefile parse imports it).

* :func:`load` turns a config dict into a :class:`Config`, every problem in one :class:`ConfigError` (unknown
  keys with a "did you mean"); the Snakefile and the CLI load every config through it, and what the workflow
  reads is the loaded config's :meth:`~Config.plain` dump (coerced values, defaults filled).
* ``Section.from_config(config)`` reads one section of a config (or of job params holding it); a stage rebuilds
  its typed settings from its params with ``Model.of(params[...])``.
* ``python -m retinabench.settings schema|docs`` writes workflow/schemas/config.schema.yaml and
  docs/configuration.md from the models (tests/test_settings.py fails when the committed files differ).
* config/config.yaml documents the same defaults; tests/test_settings.py pins that they agree.

Modules: :mod:`.base` (the Section base and shared value types), :mod:`.errors` (messages), :mod:`.data`,
:mod:`.protocols`, :mod:`.finetune`, :mod:`.reliability` (and analysis), :mod:`.layers` (saliency, compute,
LoRA), :mod:`.config` (the root), :mod:`.generate` (schema and docs).
"""
from retinabench.settings.base import (BOOTSTRAP_UNITS, DEVICE_PATTERN, FINETUNE_PROTOCOLS, REGIMES, Section)
from retinabench.settings.config import Config, load, section_model
from retinabench.settings.data import (DuplicatesSettings, FeaturesSettings, ImageCacheSettings, ImagesSettings,
                                       PhantomSettings, RankingSettings, RegistriesSettings, SplitSettings)
from retinabench.settings.errors import ConfigError
from retinabench.settings.finetune import (SWEEP_STAGES, AugmentSettings, FinetuneSettings, SweepSettings,
                                           TrainConfig)
from retinabench.settings.layers import (LABEL_MASKS, SALIENCY_BASELINES, SALIENCY_NT_TYPES, SALIENCY_SIGNS,
                                         ComputeSettings, LoraSection, LoraSettings, SaliencySettings)
from retinabench.settings.protocols import (AUTO_K, CentroidSettings, KnnSettings, LinearSettings, LogregSettings,
                                            MLLMSection, MLLMSettings, ZeroShotSection, ZeroShotSettings)
from retinabench.settings.reliability import AnalysisSettings, AttributeSettings, ReliabilitySettings

__all__ = ["AUTO_K", "AnalysisSettings", "AttributeSettings", "AugmentSettings", "BOOTSTRAP_UNITS",
           "CentroidSettings", "ComputeSettings", "Config", "ConfigError", "DEVICE_PATTERN", "DuplicatesSettings",
           "FINETUNE_PROTOCOLS", "FeaturesSettings", "FinetuneSettings", "ImageCacheSettings", "ImagesSettings",
           "KnnSettings", "LABEL_MASKS", "LinearSettings", "LogregSettings", "LoraSection", "LoraSettings",
           "MLLMSection", "MLLMSettings", "PhantomSettings", "REGIMES", "RankingSettings", "RegistriesSettings",
           "ReliabilitySettings", "SALIENCY_BASELINES", "SALIENCY_NT_TYPES", "SALIENCY_SIGNS", "SWEEP_STAGES",
           "SaliencySettings", "Section", "SplitSettings", "SweepSettings", "TrainConfig", "ZeroShotSection",
           "ZeroShotSettings", "load", "section_model"]

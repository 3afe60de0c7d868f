"""The base of every config section model and the value types the sections share.

A section is a pydantic model with ``extra="forbid"`` (an unknown key is an error, reported with a "did you mean"
by :mod:`retinabench.settings.errors`), frozen (settings are read, never edited), every default declared on its
field. Values given as strings, as Snakemake's ``--config`` gives them (``knn={k: 5000}`` arrives as
``{"k": "5000"}``), are coerced by pydantic's lax mode; ``null`` / ``~`` become None where a field admits None.
Torch-free: the Snakefile parse imports this.
"""
from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, ClassVar, Literal, Mapping, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

REGIMES = ("u-u", "u-b", "b-b", "b-u")
Regime = Literal["u-u", "u-b", "b-b", "b-u"]
# The `features` protocols of retinabench.protocols.registry (tests/protocols/test_registry.py pins the two).
FeatureProtocol = Literal["knn", "linear", "logreg", "centroid"]
# The `images` protocols trained by the fine-tuning stage (retinabench.protocols.finetune).
FinetuneProtocol = Literal["finetune", "linear_aug"]
FINETUNE_PROTOCOLS: tuple[FinetuneProtocol, ...] = ("finetune", "linear_aug")
# Metrics the ranking, the paired bootstrap and the LoRA deltas accept (retinabench.metrics).
RankMetric = Literal["accuracy", "balanced_accuracy", "auroc", "auprc", "f1_macro", "kappa"]
PairedMetric = Literal["auroc", "auprc", "accuracy", "f1", "ece"]
BOOTSTRAP_UNITS = ("patient", "image")
BootstrapUnit = Literal["patient", "image"]
Precision = Literal["auto", "bf16", "fp32"]
# A torch device name; whether it exists where the jobs run is checked at start-up
# (retinabench.plan.selection.device_problems).
DEVICE_PATTERN = r"^(auto|cpu|mps|cuda(:(\d+))?)$"


def _device(value: str) -> str:
    if not re.match(DEVICE_PATTERN, value):
        raise ValueError("not a device (auto, cpu, cuda, cuda:N or mps)")
    return value


Device = Annotated[str, AfterValidator(_device), Field(json_schema_extra={"pattern": DEVICE_PATTERN})]

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Seed = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1)]
OpenFraction = Annotated[float, Field(gt=0, lt=1)]
Auto = Literal["auto"]
Native = Literal["native"]


def _no_duplicates(values: list) -> list:
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise ValueError(f"each entry may appear once; repeated: {seen}")
    return values


_UNIQUE = {"uniqueItems": True}
Distinct = AfterValidator(_no_duplicates)
# Lists whose entries are distinct (JSON schema uniqueItems); the non-empty ones say so (minItems 1).
Names = Annotated[list[str], Field(json_schema_extra=_UNIQUE), Distinct]
Regimes = Annotated[list[Regime], Field(min_length=1, json_schema_extra=_UNIQUE), Distinct]
Seeds = Annotated[list[Seed], Field(min_length=1, json_schema_extra=_UNIQUE), Distinct]
FeatureProtocols = Annotated[list[FeatureProtocol], Field(min_length=1, json_schema_extra=_UNIQUE), Distinct]
FinetuneProtocols = Annotated[list[FinetuneProtocol], Field(min_length=1, json_schema_extra=_UNIQUE), Distinct]
PairedMetrics = Annotated[list[PairedMetric], Field(min_length=1, json_schema_extra=_UNIQUE), Distinct]
LearningRates = Annotated[list[PositiveFloat], Field(min_length=1, json_schema_extra=_UNIQUE), Distinct]


def _admits_none(annotation: Any) -> bool:
    if typing.get_origin(annotation) is Annotated:
        return _admits_none(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return any(_admits_none(a) for a in typing.get_args(annotation))
    return annotation is type(None)


class Section(BaseModel):
    """A config section: unknown keys are errors, defaults live on the fields, values are read-only."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
    # The section's key in the config (set by the root Config's sections; None for nested parts).
    section: ClassVar[str | None] = None

    @field_validator("*", mode="before")
    @classmethod
    def _yaml_null(cls, value: Any, info: ValidationInfo) -> Any:
        """``null`` / ``~`` typed as a string (``--config 'sweep={task: null}'``) is None where None is allowed."""
        if isinstance(value, str) and value in ("null", "Null", "NULL", "~") and info.field_name is not None:
            if _admits_none(cls.model_fields[info.field_name].annotation):
                return None
        return value

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | BaseModel | None):
        """This section of ``config`` (a whole config, or job params that hold the section under its key),
        validated; a missing or null section is all defaults. Problems raise one
        :class:`~retinabench.settings.errors.ConfigError` naming each dotted key."""
        from retinabench.settings.errors import validate
        if cls.section is None:
            raise TypeError(f"{cls.__name__} is not a top-level config section")
        if isinstance(config, BaseModel):  # a loaded Config: its section is typed already
            return getattr(config, cls.section)
        return validate(cls, (config or {}).get(cls.section) or {}, prefix=cls.section)

    @classmethod
    def of(cls, values: Mapping[str, Any] | None, where: str | None = None):
        """The model built from ``values`` (a section's dict, e.g. a stage's params); problems raise one
        ConfigError with keys prefixed by ``where`` (default: the section name)."""
        from retinabench.settings.errors import validate
        if isinstance(values, cls):
            return values
        return validate(cls, dict(values or {}), prefix=where if where is not None else cls.section)

    def plain(self, **kwargs) -> dict[str, Any]:
        """The settings as plain JSON-able data (Snakemake params, provenance records)."""
        return self.model_dump(mode="json", **kwargs)

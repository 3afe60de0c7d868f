"""Sections of the reliability layer (`reliability:`, docs/reliability.md) and of the analysis layer
(`analysis:`, workflow/rules/analysis.smk)."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import Field, field_validator, model_validator

from retinabench.settings.base import (BootstrapUnit, Distinct, FeatureProtocols, OpenFraction, PairedMetric,
                                       PositiveFloat, PositiveInt, Regime, Section, Seed)


class BootstrapSettings(Section):
    """Bootstrap confidence intervals."""

    n_boot: Annotated[int, Field(ge=1000)] = Field(1000, description="resamples (at least 1000)")
    seed: Seed = Field(0, description="seed of the resampling")
    level: OpenFraction = Field(0.95, description="confidence level")
    unit: BootstrapUnit = Field("patient", description="resampling unit: patient (a patient's images are drawn "
                                                       "together, so correlated eyes and repeat images do not "
                                                       "shrink the intervals) or image (FOCUS's, to reproduce it)")
    summary: Literal["two_stage", "one_stage"] = Field(
        "two_stage", description="domain-level CIs: two_stage (comparisons resampled, each with its own image-level "
                                 "replicate) or one_stage (the comparisons' point deltas resampled: FOCUS)")


class AttributeSettings(Section):
    """A fairness attribute or quality stratum: a manifest column and either a cut (median | number) or groups."""

    name: str = Field(description="the attribute's name in the tables")
    column: str = Field(description="manifest column")
    cut: Literal["median"] | int | float | None = Field(
        None, description="median: above the median of the analysed rows vs the rest; a number: below vs at or "
                          "above it")
    groups: Annotated[list[str], Field(min_length=2)] | None = Field(None, description="categorical groups")
    min_group_size: PositiveInt | None = Field(None, description="null: the section's min_group_size")

    @model_validator(mode="after")
    def _cut_or_groups(self):
        if self.cut is not None and self.groups is not None:
            raise ValueError(f"attribute {self.name!r}: give either cut or groups, not both")
        return self


class HarmonisedSettings(Section):
    """A harmonised binary task; tasks join one with `harmonised:` in the task registry."""

    definition: str | None = Field(None, description="what the harmonised label means")
    not_supported: dict[str, str] = Field({}, description="{dataset: why it cannot take part}")


class TransferSettings(Section):
    """Cross-dataset transfer of the frozen probes (retinabench.protocols.transfer)."""

    protocols: FeatureProtocols = Field(["linear", "logreg"], description="frozen probes trained for transfer")
    seeds: Annotated[list[Seed], Field(min_length=1)] = Field([0], description="seeds of the seeded probes")
    regimes: Annotated[list[Regime], Field(min_length=1)] = Field(["u-u"], description="training-test regimes")


class PairSide(Section):
    """One model of a configured pair."""

    encoder: str = Field(description="encoder of the encoder registry")
    protocol: str = Field(description="protocol whose predictions are compared")
    source: str = Field("frozen", description="prediction source (frozen, transfer, finetune, an interface, ...)")


class PairSettings(Section):
    """A configured model pair; delta = b - a."""

    a: PairSide
    b: PairSide


class PairedSettings(Section):
    """Model-vs-model paired bootstrap (retinabench.reliability.paired); delta = model b - model a."""

    sources: list[str] = Field(["frozen", "transfer"], description="prediction sources compared (transfer: "
                                                                  "out-of-domain, train dataset != test dataset)")
    protocols: list[str] | None = Field(None, description="null: every protocol")
    regime: Regime = Field("u-u", description="regime of the compared test rows")
    metrics: Annotated[list[PairedMetric], Field(min_length=1)] = Field(
        ["auroc", "auprc", "accuracy", "f1", "ece"], description="metrics compared (macro variants on multi-class "
                                                                 "tasks)")
    pairs: list[PairSettings] = Field([], description="[] : every encoder pair within a (source, protocol), a = the "
                                                      "encoder listed first in the config")
    domain: list[str] = Field(["modality", "shift"], min_length=1,
                              description="domain-level summaries: by task registry field(s) and/or shift (in- vs "
                                          "out-of-domain); a single name is a list of one")

    @field_validator("domain", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class FiguresSettings(Section):
    """Which predictions the reliability figures draw."""

    source: str = Field("frozen", description="prediction source drawn")
    protocol: str | None = Field(None, description="null: linear when run, else the first protocol")
    regime: Regime = Field("u-u", description="regime drawn")
    seed: int = Field(0, description="seed drawn")
    threshold: str = Field("y_pred", description="y_pred: the protocols' own decisions")
    metric: str = Field("accuracy", description="metric of the fairness and subgroup figures")


# Conventions the protocol-sensitivity analysis (retinabench.reliability.sensitivity) runs both values of, each as
# (variant a = ours, variant b = the paper's); docs/reliability.md, "Protocol sensitivity".
SENSITIVITY_CONVENTIONS = {
    "logreg.variant": ("ours", "focus"),
    "features.probe_embedding": ("pre_projection", "projected_l2"),
    "input_size": ("native", "224"),
    "mllm.invalid_answers": ("keep_as_wrong", "drop"),
    "reliability.bootstrap.summary": ("two_stage", "one_stage"),
    "reliability.bootstrap.unit": ("patient", "image"),
    "reliability.ece_bin_edges": ("right_closed", "focus"),
}
SensitivityConvention = Literal["logreg.variant", "features.probe_embedding", "input_size", "mllm.invalid_answers",
                                "reliability.bootstrap.summary", "reliability.bootstrap.unit",
                                "reliability.ece_bin_edges"]


class ProtocolSensitivitySettings(Section):
    """Both values of each named protocol convention on the same features or predictions, with paired CIs
    (retinabench.reliability.sensitivity; docs/reliability.md, "Protocol sensitivity")."""

    enabled: bool = Field(False, description="opt-in: rule protocol_sensitivity (a table and a figure)")
    conventions: Annotated[list[SensitivityConvention], Field(min_length=1, json_schema_extra={"uniqueItems": True}),
                           Distinct] = Field(list(get_args(SensitivityConvention)), description="conventions compared")
    metrics: Annotated[list[Literal["auroc", "ece", "accuracy"]], Field(min_length=1,
                                                                         json_schema_extra={"uniqueItems": True}),
                       Distinct] = Field(["auroc", "ece", "accuracy"],
                                         description="metric families compared (macro AUROC / top-label ECE on "
                                                     "multi-class tasks), overall and as fairness gaps")
    attributes: list[str] | None = Field(None, description="fairness attributes whose gaps are compared; null: "
                                                           "fairness_score_attributes")
    regime: Regime = Field("u-u", description="regime of the refitted probes and of the compared test rows")


def _attribute(name: str, column: str, **kw) -> AttributeSettings:
    return AttributeSettings(name=name, column=column, **kw)


# ECE bin edge conventions (retinabench.metrics.calibration.ece_bins): ours first (the default), then FOCUS's.
ECE_BIN_EDGES = ("right_closed", "focus")


class ReliabilitySettings(Section):
    """Calibration, thresholds, fairness, transfer and the paired bootstrap (docs/reliability.md)."""

    section: ClassVar[str] = "reliability"
    n_bins: Annotated[int, Field(ge=2)] = Field(10, description="equal-width ECE / reliability-diagram bins")
    ece_bin_edges: Literal["right_closed", "focus"] = Field(
        "right_closed", description="ECE / reliability-diagram bin edges: right_closed: bin i is (i/n, (i+1)/n], 0 in "
                                    "bin 0; focus: [i/n, (i+1)/n), 1 in the last bin (FOCUS's code)")
    ece_one_class_strata: Literal["compute", "focus"] = Field(
        "compute", description="ECE of a fairness group or quality stratum holding one class: compute (a value, "
                               "so its ECE gap has one); focus: none, reason recorded, no ECE gap (FOCUS)")
    threshold_rule: Literal["youden", "f1"] = Field(
        "youden", description="validation-chosen threshold (binary tasks); the protocols' own decisions (threshold "
                              "y_pred, never recomputed from p) are always reported")
    bootstrap: BootstrapSettings = BootstrapSettings()
    temperature_min_per_class: PositiveInt = Field(
        30, description="validation rows of every class needed to fit temperature scaling; below: not fitted, the "
                        "reason recorded, no scaled variant (1: fit whenever possible)")
    n_permutations: PositiveInt = Field(1000, description="group-label permutations of the fairness / quality "
                                                          "gaps' test of no gap (seeded by bootstrap.seed)")
    min_group_size: PositiveInt = Field(10, description="rows per fairness group below which its gaps are skipped "
                                                        "(reason recorded)")
    min_quality_group_size: PositiveInt = Field(5, description="as min_group_size, for the quality strata")
    attributes: list[AttributeSettings] = Field(
        [_attribute("age_median", "age", cut="median"), _attribute("age", "age", cut=60),
         _attribute("sex", "sex", groups=["female", "male"])],
        description="fairness attributes (age_median: FOCUS; age <60 / >=60: OcularBench)")
    quality: list[AttributeSettings] = Field(
        [_attribute("quality", "quality", groups=["good", "poor"])],
        description="quality strata: gaps in accuracy, AUROC, AUPRC, F1, ECE (FOCUS)")
    fairness_score_attributes: list[str] = Field(["age_median", "sex"], description="attributes the fairness "
                                                                                   "summary score averages")
    harmonised: dict[str, HarmonisedSettings] = Field(
        {}, description="harmonised binary tasks: {id: {definition, not_supported: {dataset: reason}}}")
    transfer: TransferSettings = TransferSettings()
    paired: PairedSettings = PairedSettings()
    figures: FiguresSettings = FiguresSettings()
    protocol_sensitivity: ProtocolSensitivitySettings = ProtocolSensitivitySettings()


class SubsetsSettings(Section):
    """Task subsets the subset analyses rank (a key left out: no subsets of it)."""

    modality: list[str] = Field([], description="task modalities ranked as subsets (e.g. cfp, oct)")
    family: list[str] = Field([], description="task families ranked as subsets (the task registry's family)")


class AnalysisSettings(Section):
    """Statistics, figures, tables and the report (workflow/rules/analysis.smk)."""

    section: ClassVar[str] = "analysis"
    alpha: OpenFraction = Field(0.05, description="significance level, all tests two-sided")
    split: Literal["val", "test"] = Field("test", description="split the ranks and tables report")
    alternative_metrics: Annotated[
        list[Literal["accuracy", "balanced_accuracy", "auroc", "auprc", "f1_macro", "kappa", "ece", "ece_top_label"]],
        Field(json_schema_extra={"uniqueItems": True}), Distinct] = Field(
        ["balanced_accuracy", "auroc"], description="ranked and reported beside ranking.metric")
    protocol: str | None = Field(
        None, description="protocol of the main rank figure, CD, subset, leakage, top-k and fairness analyses; null: "
                          "finetune_protocol when ranked (covers every encoder, task and regime: the paper's "
                          "headline protocol), else fallback_protocol (named in titles)")
    fallback_protocol: str = Field("linear", description="analysis protocol when fine-tuning is not ranked")
    subsets: SubsetsSettings = SubsetsSettings(modality=["cfp", "oct"], family=["dr_staging", "glaucoma"])
    top_k: PositiveInt = Field(8, description="top-k rankings after excluding high-leakage datasets")
    finetune_protocol: str = Field("finetune", description="FT side of the FT-LP gap figure, once both protocols "
                                                           "run")
    linear_protocol: str = Field("linear_aug", description="LP side: the paper's linear probe (frozen encoder, same "
                                                           "trainer, augmentations)")
    subgroup_metrics: str | None = Field(None, description="subgroup metrics table under results; null: the "
                                                           "reliability layer's reliability/subgroup_metrics.parquet")
    subgroup_pairs: dict[str, Annotated[list[str], Field(min_length=2, max_length=2)]] = Field(
        {"age": ["<60", ">=60"], "sex": ["female", "male"]},
        description="{attribute: [group a, group b]} compared in the fairness family")
    lr_sweep_metrics: str | None = Field(None, description="learning-rate sweep table under results; null: the "
                                                           "sweep's sweep/lr_sensitivity.parquet when fine-tuning "
                                                           "runs")
    lr_reference: PositiveFloat | None = Field(None, description="sub-optimal lr of the sensitivity analysis; null: "
                                                                 "the worst on validation")

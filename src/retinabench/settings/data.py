"""Sections of the data layers: registries, split, duplicates, images, image cache, features, the phantom, and
the ranking the analysis reports."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from retinabench.settings.base import Auto, Device, Distinct, OpenFraction, PositiveInt, RankMetric, Regime, Section


# One registry file or a list of them: a user's file beside the shipped one (docs/datasets.md); a name defined in two
# files is refused (retinabench.registry.load_registries).
RegistryFiles = str | Annotated[list[str], Field(min_length=1, json_schema_extra={"uniqueItems": True}), Distinct]


class RegistriesSettings(Section):
    """The registry files the run reads (retinabench.registry; docs/datasets.md). The dataset, task and encoder
    registries each take one file or a list of files, read in order; a name defined in two files is an error."""

    section: ClassVar[str] = "registries"
    datasets: RegistryFiles = Field("config/datasets.yaml",
                                    description="dataset registry file(s) (adapter, raw root, index files)")
    tasks: RegistryFiles = Field("config/tasks.yaml", description="task registry file(s) (dataset, label, classes)")
    encoders: RegistryFiles = Field("config/encoders.yaml",
                                    description="encoder registry file(s); each file's lock file sits beside it "
                                                "(encoders.yaml -> encoders.lock.yaml)")
    prompts: str = Field("config/prompts.yaml", description="prompt registry of the zeroshot / mllm protocols")


class SplitFractions(Section):
    """Fractions of patient groups per split; each in (0, 1), together 1."""

    train: OpenFraction = Field(0.70, description="fraction of patient groups in the training split")
    val: OpenFraction = Field(0.15, description="fraction in the validation split (model selection, thresholds)")
    test: OpenFraction = Field(0.15, description="fraction in the test split")

    @model_validator(mode="after")
    def _sum_to_one(self):
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"split fractions must sum to 1, got train {self.train:g}, val {self.val:g}, test "
                             f"{self.test:g} (sum {total:g})")
        return self


class SplitFile(Section):
    """Published split files, read by ``method: file`` (retinabench.data.split_file; docs/data-integrity.md)."""

    format: Literal["csv", "focus_split_data", "imagefolder"] = Field(
        "csv", description="csv: one row per image (image column, split column); focus_split_data: FOCUS's "
                           "Split_Data/labels_splits_<dataset>.csv (image_id or file, split); imagefolder: "
                           "<folder>/<train|val|test>/<class>/<image> (RETFound's benchmark splits)")
    files: dict[str, str] = Field({}, description="{dataset: split file (csv, focus_split_data) or folder "
                                                  "(imagefolder)}; every dataset of the run needs one")
    image_column: str | None = Field(None, description="csv column naming the image; null: image_id (csv), "
                                                       "image_id or file (focus_split_data)")
    split_column: str = Field("split", description="csv column holding train / val / test")
    match: Literal["auto", "image_id", "path", "name", "stem"] = Field(
        "auto", description="what the file's image value is compared with: the manifest's image_id, its path, the "
                            "path's file name or that name without its image extension; auto: image_id (csv), stem "
                            "(focus_split_data), name (imagefolder)")
    unlisted: Literal["error", "exclude"] = Field(
        "error", description="manifest images the file does not place: an error, or excluded from every task "
                             "(counted and printed)")
    unknown: Literal["error", "exclude"] = Field(
        "error", description="file rows naming no manifest image: an error, or skipped (counted and printed)")
    allowed_leaks: Annotated[int, Field(ge=0)] = Field(
        0, description="patient groups (patient ∪ duplicate cluster) the file puts in two splits that the run "
                       "accepts: must equal the count found (0: any leak is an error naming the patient and rows)")
    val_from_train: OpenFraction | None = Field(
        None, description="a file without val rows (FOCUS: train / test): this fraction of its train images "
                          "becomes val, patient groups placed as stratified_grouped does; null: val must be in the "
                          "file")


class SplitSettings(Section):
    """One split assignment per dataset, used by all its tasks (retinabench.data.splits)."""

    section: ClassVar[str] = "split"
    fractions: SplitFractions = SplitFractions()
    seed: int = Field(0, description="seed of the group placement")
    method: Literal["hash", "ranked", "stratified_grouped", "file"] = Field(
        "hash", description="hash: each patient group placed by its own seeded hash (no other group moves when data "
                            "change; fractions within 4 sd of binomial); ranked: exact fractions, a change can move "
                            "the groups next to a cut; stratified_grouped: label-stratified per patient group "
                            "(OcularBench), an edit moves a few groups of one stratum; file: published split files "
                            "(`file:`)")
    file: SplitFile = SplitFile()
    group_near_duplicates: bool = Field(
        True, description="near duplicates join split groups like exact ones (exact ones always do)")


class DuplicatesSettings(Section):
    """Exact (sha256) and near (perceptual hash) duplicates (retinabench.data.duplicates)."""

    section: ClassVar[str] = "duplicates"
    max_distance: Annotated[int, Field(ge=0, le=64)] = Field(
        8, description="Hamming distance of near duplicates, in bits of the 256-bit phash (measured on tvhl, see "
                       "docs/data-integrity.md)")


class ImagesSettings(Section):
    """The manifest job's decode pass (retinabench.data.image_checks)."""

    section: ClassVar[str] = "images"
    min_side: PositiveInt = Field(
        32, description="raw images under this many pixels on the short side are excluded, with the reason (a 1x1 "
                        "placeholder or a thumbnail is no sample)")


class ImageCacheSettings(Section):
    """The uint8 image cache every image-based job reads (retinabench.data.image_cache)."""

    section: ClassVar[str] = "image_cache"
    size: Annotated[int, Field(ge=32)] = Field(224, description="side of the cached square images, pixels")
    resize: Literal["squash", "center_crop"] = Field("squash", description="how a raw image becomes square")


class FeaturesSettings(Section):
    """Frozen feature extraction (retinabench.features)."""

    section: ClassVar[str] = "features"
    batch_size: PositiveInt | Auto = Field(
        "auto", description="images per forward pass; auto: by the encoder's size class (retinabench.registry.sizes)")
    device: Device = Field("auto", description="auto: CUDA if present")
    probe_embedding: Literal["pre_projection", "projected_l2"] = Field(
        "pre_projection", description="what the probes see of an encoder: pre_projection (the entry's pooling: for a "
                                      "dual encoder the embedding before its projection) or projected_l2 (FOCUS: a "
                                      "dual encoder's image embedding in the joint space, every encoder's L2-normalised)")


class PhantomSettings(Section):
    """The generated phantom dataset (retinabench.data.phantom); a dataset's registry `options` override it."""

    section: ClassVar[str] = "phantom"
    n_patients: PositiveInt = Field(80, description="patients generated")
    seed: int = Field(0, description="generator seed")
    image_size: Annotated[int, Field(ge=64)] = Field(256, description="side of the generated images, pixels")
    sites: list[dict[str, Any]] | None = Field(
        None, description="acquisition sites (name, color_cast, blur, vignetting, resolution, ...); null: one "
                          "site (the registry's phantom_siteb sets a second device)")


class RankingSettings(Section):
    """What the rank analyses rank by."""

    section: ClassVar[str] = "ranking"
    metric: RankMetric = Field("accuracy", description="primary ranking metric")
    regime: Regime = Field("u-u", description="regime the ranks are computed in")

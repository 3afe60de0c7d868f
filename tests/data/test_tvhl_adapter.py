"""The TVHL adapter on the real data in ../shared: counts, quirks, exclusions."""
import pandas as pd
import pytest

from retinabench.schemas import MANIFEST, conform


def test_counts_match_the_dataset_readme(tvhl_manifest):
    manifest, _ = tvhl_manifest
    assert (manifest["modality"] == "cfp").sum() == 1548
    assert (manifest["modality"] == "oct").sum() == 1113
    cfp = manifest[manifest["modality"] == "cfp"]
    oct_ = manifest[manifest["modality"] == "oct"]
    assert cfp["dme"].value_counts().to_dict() == {"yes": 1053, "no": 495}
    assert cfp["dr3"].value_counts().to_dict() == {"none": 398, "npdr": 95, "pdr": 52}
    assert oct_["dme"].value_counts().to_dict() == {"no": 946, "yes": 167}
    assert oct_["dr3"].value_counts().to_dict() == {"none": 341, "npdr": 119, "pdr": 53}
    assert cfp["patient_id"].nunique() == 1174
    assert oct_["patient_id"].nunique() == 831
    assert len(set(cfp["patient_id"]) & set(oct_["patient_id"])) == 217


def test_manifest_conforms_to_schema(tvhl_manifest):
    manifest, _ = tvhl_manifest
    conform(manifest, "manifest")
    assert manifest["image_id"].is_unique
    assert set(manifest["eye"]) == {"OD", "OS"}
    assert manifest["age"].isna().all() and manifest["sex"].isna().all()  # the dataset has neither
    assert manifest["sha256"].str.len().eq(64).all()
    assert list(manifest.columns[: len(MANIFEST.names)]) == MANIFEST.names


def test_every_quirk_is_recorded(tvhl_manifest):
    manifest, excl = tvhl_manifest
    norm = excl[excl["scope"] == "normalised"]
    lower = norm[norm["reason"].str.startswith("lower-case eye code")]
    assert len(lower) == 9  # 8 'od' + 1 'oi' in EYE FUNDUS.csv
    assert manifest.set_index("image_id").loc["cfp_0878_oi_f_1", "eye"] == "OS"
    letters = norm[norm["reason"].str.startswith("modality letter")]
    assert sorted(letters["image_id"]) == ["cfp_1264_OD_o_2", "oct_1258_OI_f_2", "oct_1304_OI_O_2",
                                          "oct_1317_OI_f_2", "oct_1958_OI_f_2"]
    assert manifest.set_index("image_id").loc["cfp_1264_OD_o_2", "modality"] == "cfp"
    dr_missing = excl[excl["scope"] == "label:dr3"]
    assert dr_missing["reason"].value_counts().to_dict() == {"DR grade '-' (unknown)": 1001 + 600,
                                                            "DR grade empty": 2}
    assert set(excl.loc[excl["reason"] == "DR grade empty", "image_id"]) == {"cfp_2029_OI_f_2", "cfp_2030_OD_f_1"}
    # Every image without a DR label is in the table, and nothing was dropped whole.
    assert manifest["dr3"].isna().sum() == len(dr_missing)
    assert (excl["scope"] == "image").sum() == 0


def test_missing_image_and_unlisted_image_are_recorded(tmp_path, tvhl_root):
    import shutil
    from retinabench.data.adapters.tvhl import adapt_tvhl
    root = tmp_path / "tvhl"
    for folder in ("EYE FUNDUS/EYE FUNDUS1", "OCT/OCT1"):
        (root / folder).mkdir(parents=True)
    fundus = pd.read_csv(tvhl_root / "EYE FUNDUS.csv", dtype=str, keep_default_na=False).head(3)
    fundus.to_csv(root / "EYE FUNDUS.csv", index=False)
    pd.read_csv(tvhl_root / "OCT.csv", dtype=str, keep_default_na=False).head(0).to_csv(root / "OCT.csv", index=False)
    src = {p.stem: p for p in (tvhl_root / "EYE FUNDUS").glob("*/*.jpg")}
    for name in fundus["Name"][:2]:
        shutil.copy(src[name], root / "EYE FUNDUS/EYE FUNDUS1" / f"{name}.jpg")
    shutil.copy(src["0001_OD_f_1"], root / "EYE FUNDUS/EYE FUNDUS1/9999_OD_f_1.jpg")
    manifest, excl = adapt_tvhl(root, {"name": "tvhl"})
    assert len(manifest) == 2
    dropped = excl[excl["scope"] == "image"].set_index("image_id")["reason"].to_dict()
    assert dropped == {f"cfp_{fundus['Name'][2]}": f"image file {fundus['Name'][2]}.jpg not found under EYE FUNDUS/",
                       "cfp_9999_OD_f_1": "image not listed in EYE FUNDUS.csv: no labels"}


def test_missing_csv_is_a_clear_error(tmp_path):
    from retinabench.data.adapters.tvhl import adapt_tvhl
    with pytest.raises(FileNotFoundError, match="EYE FUNDUS.csv"):
        adapt_tvhl(tmp_path, {"name": "tvhl"})

import pytest

from retinabench.data.adapters.phantom import adapt_phantom
from retinabench.data.phantom import generate_phantom
from retinabench.schemas import conform


@pytest.fixture(scope="module")
def phantom_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("phantom")
    generate_phantom(root, n_patients=12, seed=0)
    return root


def test_adapter_maps_codes_to_class_names(phantom_root):
    manifest, excl = adapt_phantom(phantom_root, {"name": "phantom"})
    conform(manifest, "manifest")
    cfp = manifest[manifest["modality"] == "cfp"]
    oct_ = manifest[manifest["modality"] == "oct"]
    assert set(cfp["dr3"]) <= {"none", "npdr", "pdr"} and cfp["dr3"].notna().all()
    assert set(cfp["glaucoma"]) <= {"no", "yes"} and cfp["dme"].isna().all()
    assert set(oct_["dme"]) <= {"no", "yes"} and oct_["dr3"].isna().all()
    assert set(manifest["sex"]) <= {"female", "male"} and manifest["age"].between(40, 85).all()
    assert len(excl) == 0


def test_missing_file_and_missing_grade_are_recorded(phantom_root, tmp_path):
    import shutil
    import pandas as pd
    root = tmp_path / "p"
    shutil.copytree(phantom_root, root)
    meta = pd.read_csv(root / "metadata.csv", dtype=str, keep_default_na=False)
    first_cfp = meta.index[meta["modality"] == "cfp"][0]
    meta.loc[first_cfp, "dr_grade"] = ""
    (root / meta.loc[meta.index[-1], "file"]).unlink()
    meta.to_csv(root / "metadata.csv", index=False)
    manifest, excl = adapt_phantom(root, {"name": "phantom"})
    assert len(manifest) == len(meta) - 1
    assert excl["scope"].value_counts().to_dict() == {"label:dr3": 1, "image": 1}
    assert manifest["dr3"].isna().sum() - (manifest["modality"] == "oct").sum() == 1

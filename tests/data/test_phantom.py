"""Tests for the seeded synthetic phantom dataset generator (retinabench.data.phantom)."""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score
from sklearn.model_selection import GroupKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from retinabench.data.phantom import SITES_DEFAULT, generate_phantom

COLUMNS = ["image_id", "file", "modality", "patient_id", "eye", "age", "sex", "quality", "site",
           "dr_grade", "glaucoma", "dme"]
SITE_B = {"name": "B", "color_cast": (0.8, 0.95, 1.25), "blur": 1.5, "vignetting": 0.5, "resolution": 0.5,
          "fraction": 1.0}


@pytest.fixture(scope="module")
def default_set(tmp_path_factory):
    """One dataset at default size, shared by the tests that need class balance or learnability."""
    out = tmp_path_factory.mktemp("phantom_default")
    df = generate_phantom(out, seed=0)
    return out, df


def _read_meta(out):
    return pd.read_csv(out / "metadata.csv", dtype=str, keep_default_na=False)


def _digest_tree(out):
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------------
# layout and metadata
# ------------------------------------------------------------------------------------------------------
def test_metadata_columns_and_domains(default_set):
    out, df = default_set
    meta = _read_meta(out)
    assert list(meta.columns) == COLUMNS
    assert list(df.columns) == COLUMNS
    assert len(meta) == len(df)
    assert 250 <= len(meta) <= 350
    assert meta["image_id"].is_unique
    assert set(meta["modality"]) == {"cfp", "oct"}
    assert set(meta["eye"]) <= {"OD", "OS"}
    assert set(meta["sex"]) <= {"F", "M"}
    assert set(meta["quality"]) == {"good", "poor"}
    assert set(meta["site"]) == {"A"}
    ages = meta["age"].astype(int)
    assert ages.between(40, 85).all()
    assert meta["patient_id"].str.fullmatch(r"P\d{4}").all()
    for _, r in meta.iterrows():
        k = r["image_id"].rsplit("_", 1)[1]
        assert r["image_id"] == f"{r['patient_id']}_{r['eye']}_{r['modality']}_{k}"
        assert r["file"] == f"{r['modality']}/{r['image_id']}.png"
    # one age/sex/site per patient
    assert (meta.groupby("patient_id")[["age", "sex", "site"]].nunique() == 1).all().all()
    poor = (meta["quality"] == "poor").mean()
    assert 0.07 <= poor <= 0.2


def test_labels_apply_to_the_right_modality(default_set):
    out, _ = default_set
    meta = _read_meta(out)
    cfp, oct_ = meta[meta.modality == "cfp"], meta[meta.modality == "oct"]
    assert set(cfp["dr_grade"]) == {"0", "1", "2"}
    assert set(cfp["glaucoma"]) == {"0", "1"}
    assert (cfp["dme"] == "").all()
    assert set(oct_["dme"]) == {"0", "1"}
    assert (oct_["dr_grade"] == "").all() and (oct_["glaucoma"] == "").all()


def test_every_class_well_represented(default_set):
    out, _ = default_set
    meta = _read_meta(out)
    cfp, oct_ = meta[meta.modality == "cfp"], meta[meta.modality == "oct"]
    dr = cfp["dr_grade"].value_counts(normalize=True)
    assert dr["0"] > 0.35 and dr["1"] > 0.18 and dr["2"] > 0.10, dr.to_dict()
    assert 0.2 <= (cfp["glaucoma"] == "1").mean() <= 0.5
    assert 0.25 <= (oct_["dme"] == "1").mean() <= 0.55
    assert len(cfp) >= 120 and len(oct_) >= 80


def test_repeat_images_of_an_eye_share_labels(default_set):
    out, _ = default_set
    meta = _read_meta(out)
    for modality, cols in (("cfp", ["dr_grade", "glaucoma"]), ("oct", ["dme"])):
        sub = meta[meta.modality == modality]
        assert (sub.groupby(["patient_id", "eye"])[cols].nunique() == 1).all().all()
        assert sub.groupby(["patient_id", "eye"]).size().max() == 2  # repeats exist
    # repeats are genuinely different acquisitions, not copies
    cfp = meta[meta.modality == "cfp"]
    pair = cfp.groupby(["patient_id", "eye"]).filter(lambda g: len(g) == 2).head(2)
    a, b = (np.asarray(Image.open(out / f), dtype=float) for f in pair["file"])
    assert np.abs(a - b).mean() > 2.0


def test_image_files_modes_and_sizes(tmp_path):
    df = generate_phantom(tmp_path, n_patients=6, seed=3, image_size=96)
    assert (tmp_path / "metadata.csv").is_file()
    files = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png")}
    assert files == set(df["file"])
    for _, r in df.iterrows():
        im = Image.open(tmp_path / r["file"])
        if r["modality"] == "cfp":
            assert im.mode == "RGB" and im.size == (96, 96)
            a = np.asarray(im, dtype=float)
            assert a[0, 0].max() < 10 and a[48, 48].mean() > 25   # black corner, lit fundus
            assert a[..., 0].mean() > a[..., 2].mean()            # orange-red, not blue
        else:
            assert im.mode == "L" and im.size == (96, 40)
    assert len(df) > 0 and df["modality"].isin(["cfp", "oct"]).all()


def test_default_oct_aspect(tmp_path):
    df = generate_phantom(tmp_path, n_patients=4, seed=1)
    oct_files = df.loc[df.modality == "oct", "file"]
    assert len(oct_files) > 0
    assert Image.open(tmp_path / oct_files.iloc[0]).size == (256, 107)


# ------------------------------------------------------------------------------------------------------
# determinism
# ------------------------------------------------------------------------------------------------------
def test_same_seed_is_byte_identical(tmp_path):
    a = _digest_tree_of(tmp_path / "a", seed=11)
    b = _digest_tree_of(tmp_path / "b", seed=11)
    assert a == b
    assert "metadata.csv" in a and len(a) > 5


def test_different_seed_differs(tmp_path):
    a = _digest_tree_of(tmp_path / "a", seed=11)
    c = _digest_tree_of(tmp_path / "c", seed=12)
    assert a["metadata.csv"] != c["metadata.csv"]
    common = set(a) & set(c) - {"metadata.csv"}
    assert common and all(a[f] != c[f] for f in common)


def _digest_tree_of(out, seed):
    generate_phantom(out, n_patients=5, seed=seed, image_size=64)
    return _digest_tree(out)


def test_patient_content_does_not_depend_on_n_patients(tmp_path):
    # per-patient streams: the first patients are the same whether 3 or 6 are generated
    small = generate_phantom(tmp_path / "s", n_patients=3, seed=4, image_size=64)
    big = generate_phantom(tmp_path / "b", n_patients=6, seed=4, image_size=64)
    head = big[big.patient_id.isin(small.patient_id)].reset_index(drop=True)
    pd.testing.assert_frame_equal(small, head)
    for f in small["file"]:
        assert (tmp_path / "s" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


# ------------------------------------------------------------------------------------------------------
# sites and argument validation
# ------------------------------------------------------------------------------------------------------
def test_sites_default_is_one_clean_site():
    assert len(SITES_DEFAULT) == 1
    s = SITES_DEFAULT[0]
    assert s["name"] == "A" and s["fraction"] == 1.0 and s["blur"] == 0 and s["resolution"] == 1.0


@pytest.mark.parametrize("sites, needle", [
    ([{"name": "A", "fraction": 1.0, "colour_cast": (1, 1, 1)}], "colour_cast"),
    ([{"name": "A", "fraction": 0.5}, {"name": "B", "fraction": 0.4}], "0.9"),
    ([{"name": "A", "fraction": 0.5}, {"name": "B"}], "fraction"),
    ([{"name": "A", "fraction": 1.0, "blur": -1}], "blur"),
    ([{"name": "A", "fraction": 1.0, "resolution": 0.0}], "resolution"),
    ([{"name": "A", "fraction": 1.0, "vignetting": 1.5}], "vignetting"),
    ([{"name": "A", "fraction": 1.0, "color_cast": (1, 1)}], "color_cast"),
    ([{"name": "A", "fraction": 0.5}, {"name": "A", "fraction": 0.5}], "duplicate"),
    ([{"fraction": 1.0}], "name"),
    ([], "at least one"),
])
def test_site_validation(tmp_path, sites, needle):
    with pytest.raises(ValueError, match=needle):
        generate_phantom(tmp_path, n_patients=2, image_size=64, sites=sites)


@pytest.mark.parametrize("kwargs, needle", [
    ({"n_patients": 0}, "n_patients"),
    ({"n_patients": -3}, "n_patients"),
    ({"image_size": 32}, "image_size"),
    ({"seed": -1}, "seed"),
])
def test_bad_arguments(tmp_path, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        generate_phantom(tmp_path, **{"n_patients": 2, "image_size": 64, **kwargs})


def test_site_split_follows_fractions_and_leaves_labels_alone(tmp_path):
    one = generate_phantom(tmp_path / "one", n_patients=10, seed=2, image_size=64)
    two = generate_phantom(tmp_path / "two", n_patients=10, seed=2, image_size=64,
                           sites=[{"name": "A", "fraction": 0.6}, {**SITE_B, "fraction": 0.4}])
    per_patient = two.groupby("patient_id")["site"].first()
    assert per_patient.value_counts().to_dict() == {"A": 6, "B": 4}
    # only the site column may differ: labels, covariates and quality never depend on site
    pd.testing.assert_frame_equal(one.drop(columns="site"), two.drop(columns="site"))
    # images of site-A patients are untouched; site-B images differ
    for _, r in two.iterrows():
        same = (tmp_path / "one" / r["file"]).read_bytes() == (tmp_path / "two" / r["file"]).read_bytes()
        assert same == (r["site"] == "A")


def test_site_effect_changes_image_statistics(tmp_path):
    a = generate_phantom(tmp_path / "a", n_patients=4, seed=6, image_size=128)
    b = generate_phantom(tmp_path / "b", n_patients=4, seed=6, image_size=128, sites=[SITE_B])
    assert (b["site"] == "B").all()
    cfp = a[a.modality == "cfp"]["file"]
    blue_shift, sharp_a, sharp_b = [], [], []
    for f in cfp:
        ia = np.asarray(Image.open(tmp_path / "a" / f), dtype=float)
        ib = np.asarray(Image.open(tmp_path / "b" / f), dtype=float)
        fov = ia.max(axis=-1) > 20
        # blue/red ratio goes up with the blue cast
        blue_shift.append(ib[fov][:, 2].mean() / ib[fov][:, 0].mean() - ia[fov][:, 2].mean() / ia[fov][:, 0].mean())
        # blur + low resolution remove high-frequency energy
        sharp_a.append(np.abs(np.diff(ia[..., 1], axis=1)).mean())
        sharp_b.append(np.abs(np.diff(ib[..., 1], axis=1)).mean())
    assert min(blue_shift) > 0.05
    assert np.mean(sharp_b) < 0.8 * np.mean(sharp_a)


# ------------------------------------------------------------------------------------------------------
# learnability: the labels are carried by visible structure (no neural nets needed to find it)
# ------------------------------------------------------------------------------------------------------
def _colour_hist(path, bins=6):
    a = np.asarray(Image.open(path).convert("RGB"), dtype=float) / 255.0
    a = a[a.max(axis=-1) > 0.08]   # field of view only
    h, _ = np.histogramdd(a, bins=bins, range=[(0, 1)] * 3)
    return np.log1p(h.ravel())


def _small_pixels(path, size=(32, 32)):
    return np.asarray(Image.open(path).convert("L").resize(size, Image.Resampling.BOX), dtype=float).ravel() / 255


def _grouped_balanced_accuracy(X, y, groups):
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=5000, class_weight="balanced"))
    pred = cross_val_predict(clf, X, y, groups=groups, cv=GroupKFold(n_splits=5))
    return balanced_accuracy_score(y, pred)


def test_labels_are_learnable_and_sex_is_not(default_set):
    out, _ = default_set
    meta = _read_meta(out)
    cfp, oct_ = meta[meta.modality == "cfp"], meta[meta.modality == "oct"]
    H = np.stack([_colour_hist(out / f) for f in cfp["file"]])
    g = cfp["patient_id"].values
    ba_dr = _grouped_balanced_accuracy(H, (cfp["dr_grade"].astype(int) > 0).values, g)
    ba_gl = _grouped_balanced_accuracy(H, cfp["glaucoma"].astype(int).values, g)
    P = np.stack([_small_pixels(out / f) for f in oct_["file"]])
    ba_dme = _grouped_balanced_accuracy(P, oct_["dme"].astype(int).values, oct_["patient_id"].values)
    assert ba_dr >= 0.65, ba_dr
    assert ba_gl >= 0.65, ba_gl
    assert ba_dme >= 0.65, ba_dme
    # negative control: sex has no visual correlate, so the same probe must stay near chance
    ba_sex = _grouped_balanced_accuracy(H, (cfp["sex"] == "F").values, g)
    assert ba_sex < 0.65, ba_sex

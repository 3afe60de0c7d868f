"""Every reference dataset's adapter on a generated tiny copy of its RAW layout (retinabench.testing.raw_fixtures):
manifest rows, labels, metadata codings and the exclusions each known trap must leave. One data root serves
all tests; each adapter runs once per session."""
import pandas as pd
import pytest

from retinabench.data.adapters import adapter_info, get_adapter
from retinabench.testing.raw_fixtures import WRITERS, write_fixture
from retinabench.schemas import MANIFEST, conform


@pytest.fixture(scope="session")
def data_root(tmp_path_factory, registries):
    root = tmp_path_factory.mktemp("raw")
    for name in WRITERS:
        write_fixture(name, root, registries.datasets)
    return root


@pytest.fixture(scope="session")
def adapted(data_root, registries):
    cache = {}

    def run(name):
        if name not in cache:
            entry = registries.datasets[name]
            cache[name] = get_adapter(entry["adapter"])(data_root / entry["root"], entry)
        return cache[name]
    return run


def rows(manifest, *cols):
    return manifest.set_index("image_id")[list(cols)].astype(object).where(lambda d: d.notna(), None) \
        .to_dict("index")


def reasons(excl, scope=None):
    e = excl if scope is None else excl[excl["scope"] == scope]
    return list(e["reason"])


def test_every_established_dataset_has_a_fixture_and_a_valid_manifest(registries, adapted):
    names = [n for n, d in registries.datasets.items()
             if not d.get("generated") and d.get("status", "established") == "established" and n != "tvhl"]
    assert sorted(names) == sorted(WRITERS)
    for name in names:
        manifest, excl = adapted(name)
        conform(manifest, "manifest", where=name)
        assert list(manifest.columns[:len(MANIFEST.names)]) == MANIFEST.names
        assert manifest["image_id"].is_unique and manifest["sha256"].str.len().eq(64).all(), name
        assert set(excl["scope"]) <= {"image", "normalised"} | {f"label:{c}" for c in manifest.columns}, name
        # every missing label is explained by a label exclusion (the split stage checks this too)
        for col in manifest.columns[len(MANIFEST.names):]:
            if col == "official_split":
                continue
            missing = set(manifest.loc[manifest[col].isna(), "image_id"])
            recorded = set(excl.loc[excl["scope"] == f"label:{col}", "image_id"])
            assert missing == recorded, (name, col)


def test_aptos_test_partition_unlabelled_missing_and_unlisted_images(adapted):
    m, e = adapted("aptos2019")
    assert rows(m, "dr5", "official_split") == {
        "000c1434d8d7": {"dr5": "moderate", "official_split": "train"},
        "001639a390f0": {"dr5": "pdr", "official_split": "train"},
        "0024cdab0c1e": {"dr5": "none", "official_split": "train"},
        "0005cfc8afb6": {"dr5": None, "official_split": "test"},
        "003f0afdcd15": {"dr5": None, "official_split": "test"}}
    assert reasons(e, "label:dr5") == ["APTOS 2019 test-set labels were never released"] * 2
    assert "image file not found: train_images/002c21358ce6.png" in reasons(e, "image")
    assert (m["patient_id"] == m["image_id"]).all()


def test_eyepacs_patient_and_eye_from_the_file_name(adapted):
    m, e = adapted("eyepacs")
    assert rows(m, "patient_id", "eye", "dr5") == {
        "10_left": {"patient_id": "10", "eye": "OS", "dr5": "none"},
        "10_right": {"patient_id": "10", "eye": "OD", "dr5": "mild"},
        "13_left": {"patient_id": "13", "eye": "OS", "dr5": "pdr"},
        "15_left": {"patient_id": "15", "eye": "OS", "dr5": "moderate"},
        "15_right": {"patient_id": "15", "eye": "OD", "dr5": "severe"}}
    assert e.loc[e["scope"] == "image", "source"].tolist() == ["train/13_right.jpeg"]


def test_idrid_shared_file_names_header_space_and_blank_rows(adapted):
    m, e = adapted("idrid")
    got = rows(m, "path", "dr5", "dme3")
    assert got["train_IDRiD_001"] == {"path": "1. Original Images/a. Training Set/IDRiD_001.jpg", "dr5": "severe",
                                      "dme3": "within_1dd"}
    assert got["test_IDRiD_001"] == {"path": "1. Original Images/b. Testing Set/IDRiD_001.jpg", "dr5": "pdr",
                                     "dme3": "outside_1dd"}
    assert m.set_index("image_id").loc["train_IDRiD_001", "sha256"] != m.set_index("image_id").loc["test_IDRiD_001", "sha256"]
    assert "1 blank row(s) skipped" in reasons(e, "normalised")


def test_messidor2_exam_pairs_give_patients_and_eyes(adapted):
    m, e = adapted("messidor2")
    got = rows(m, "patient_id", "eye", "quality", "dr5", "dme")
    assert got["20051020_43808_0100_PP"] == {"patient_id": "1", "eye": "OS", "quality": "good", "dr5": "none", "dme": "no"}
    assert got["20051020_43832_0100_PP"] == {"patient_id": "1", "eye": "OD", "quality": "good", "dr5": "moderate",
                                             "dme": "yes"}
    assert got["IM000001"] == {"patient_id": "2", "eye": "OS", "quality": "poor", "dr5": None, "dme": None}
    assert got["IM000002"]["patient_id"] == "IM000002" and got["IM000002"]["eye"] is None
    assert "no adjudicated grade (image judged ungradable)" in reasons(e, "label:dr5")
    assert any("no row in messidor-2.csv" in r for r in reasons(e, "normalised"))
    assert "IMAGES/IM000003.JPG" in e.loc[e["scope"] == "image", "source"].tolist()


def test_brset_codebook_and_missing_image(adapted):
    m, e = adapted("brset")
    got = rows(m, "patient_id", "eye", "sex", "age", "quality", "site", "dr5", "dme", "diabetes", "increased_cup_disc")
    assert got["img00001"] == {"patient_id": "1", "eye": "OD", "sex": "female", "age": 55.0, "quality": "good",
                               "site": "Canon CR", "dr5": "none", "dme": "no", "diabetes": "no",
                               "increased_cup_disc": "no"}
    assert got["img00002"]["eye"] == "OS" and got["img00002"]["dr5"] == "moderate" and got["img00002"]["diabetes"] == "yes"
    assert got["img00003"] == {"patient_id": "2", "eye": "OD", "sex": "male", "age": None, "quality": "poor",
                               "site": "Canon CR", "dr5": "none", "dme": "no", "diabetes": "no",
                               "increased_cup_disc": "yes"}
    assert reasons(e, "image") == ["image file not found: fundus_photos/img04414.jpg"]  # index.html is not an image


def test_brset_diabetic_is_brset_filtered_with_every_row_recorded(adapted):
    m, e = adapted("brset_diabetic")
    assert m["image_id"].tolist() == ["img00002"]
    assert sum(r.startswith("filtered out: diabetes='No'") for r in reasons(e, "image")) == 3
    assert not any(r.startswith("image not named") for r in reasons(e))


def test_mbrset_codings_and_macula_selection(adapted):
    m, e = adapted("mbrset")
    got = rows(m, "patient_id", "eye", "sex", "quality", "dr5", "dme", "hypertension", "nephropathy")
    assert got["1.1"] == {"patient_id": "1", "eye": "OD", "sex": "female", "quality": "good", "dr5": "none",
                          "dme": "no", "hypertension": "yes", "nephropathy": "no"}
    assert got["1.4"]["quality"] == "poor" and got["1.3"]["eye"] == "OS"
    assert got["2.1"] == {"patient_id": "2", "eye": "OD", "sex": "male", "quality": "good", "dr5": None, "dme": "yes",
                          "hypertension": "no", "nephropathy": "yes"}
    assert reasons(e, "label:dr5") == ["final ICDR grade not recorded"]
    macula, _ = adapted("mbrset_macula")
    assert macula["image_id"].tolist() == ["1.1", "1.3", "2.1"]


def test_papila_xlsx_header_offset_and_descriptor_codings(adapted):
    m, e = adapted("papila")
    assert rows(m, "patient_id", "eye", "age", "sex", "glaucoma3") == {
        "RET002OD": {"patient_id": "002", "eye": "OD", "age": 75.0, "sex": "female", "glaucoma3": "healthy"},
        "RET002OS": {"patient_id": "002", "eye": "OS", "age": 75.0, "sex": "female", "glaucoma3": "healthy"},
        "RET004OD": {"patient_id": "004", "eye": "OD", "age": 60.0, "sex": "male", "glaucoma3": "glaucoma"},
        "RET004OS": {"patient_id": "004", "eye": "OS", "age": 60.0, "sex": "male", "glaucoma3": "glaucoma"},
        "RET005OD": {"patient_id": "005", "eye": "OD", "age": 51.0, "sex": "male", "glaucoma3": "suspect"}}
    assert reasons(e, "image") == ["image file not found: FundusImages/RET005OS.jpg"]


@pytest.mark.parametrize("name", ["rfmid", "rfmid_riadd"])
def test_rfmid_ids_restart_per_set_so_ids_carry_the_set(adapted, name):
    m, _ = adapted(name)
    assert rows(m, "official_split", "disease_risk", "dr", "armd", "mya") == {
        "train_1": {"official_split": "train", "disease_risk": "yes", "dr": "yes", "armd": "no", "mya": "no"},
        "train_2": {"official_split": "train", "disease_risk": "no", "dr": "no", "armd": "no", "mya": "no"},
        "val_1": {"official_split": "val", "disease_risk": "yes", "dr": "no", "armd": "yes", "mya": "no"},
        "test_1": {"official_split": "test", "disease_risk": "yes", "dr": "no", "armd": "no", "mya": "yes"}}


def test_rfmid2_latin1_garbled_headers(adapted):
    m, _ = adapted("rfmid2")
    assert rows(m, "wnl", "dr") == {"train_1": {"wnl": "yes", "dr": "no"}, "train_2": {"wnl": "no", "dr": "yes"},
                                    "val_1": {"wnl": "no", "dr": "yes"}, "test_1": {"wnl": "no", "dr": "no"}}


def test_refuge_labels_only_for_some_partitions(adapted):
    m, e = adapted("refuge")
    assert rows(m, "glaucoma", "official_split") == {
        "train_g0001": {"glaucoma": "yes", "official_split": "train"},
        "train_n0001": {"glaucoma": "no", "official_split": "train"},
        "val_V0001": {"glaucoma": "no", "official_split": "val"},
        "val_V0002": {"glaucoma": "yes", "official_split": "val"},
        "test_T0001": {"glaucoma": None, "official_split": "test"},
        "test_T0002": {"glaucoma": None, "official_split": "test"}}
    assert set(reasons(e, "label:glaucoma")) == {"no Label in this partition's index.json (labels not published)"}


def test_g1020_and_hrf_and_octid(adapted):
    g, _ = adapted("g1020")
    assert rows(g, "glaucoma") == {"image_0": {"glaucoma": "no"}, "image_1": {"glaucoma": "yes"},
                                   "image_2": {"glaucoma": "no"}}
    h, _ = adapted("hrf")
    assert sorted(h["hrf3"]) == ["dr", "glaucoma", "healthy", "healthy"]
    assert set(h["path"]) >= {"images/01_dr.JPG"}  # mixed-case extension
    o, _ = adapted("octid")
    assert sorted(o["octid5"]) == ["amd", "csr", "dr", "mh", "normal"] and set(o["modality"]) == {"oct"}


def test_jsiec_folders_are_classes(adapted):
    m, _ = adapted("jsiec1000")
    assert sorted(m["jsiec39"]) == ["blur_suspected_pdr", "dr1", "dr2", "normal", "possible_glaucoma"]
    assert not m["path"].str.contains("DS_Store").any()


def test_oct2017_patient_from_the_file_name(adapted):
    m, _ = adapted("oct2017")
    got = rows(m, "patient_id", "oct4", "official_split")
    assert got["train/CNV/CNV-1016042-1"] == {"patient_id": "1016042", "oct4": "cnv", "official_split": "train"}
    assert got["train/NORMAL/NORMAL-1016042-2"]["patient_id"] == "1016042"


def test_drtid_two_fields_per_eye(adapted):
    m, e = adapted("drtid")
    assert rows(m, "patient_id", "eye", "dr5") == {
        "1_1": {"patient_id": "eye1", "eye": "OS", "dr5": "moderate"},
        "1_2": {"patient_id": "eye1", "eye": "OS", "dr5": "moderate"},
        "2_1": {"patient_id": "eye2", "eye": "OD", "dr5": "none"},
        "2_2": {"patient_id": "eye2", "eye": "OD", "dr5": "none"},
        "3_1": {"patient_id": "eye3", "eye": "OS", "dr5": "pdr"}}
    assert reasons(e, "image") == ["image file not found: Original Images/3_2.jpg"]


def test_fairvision_cohort_labels_and_both_codings(adapted):
    m, e = adapted("fairvision")
    assert rows(m, "sex", "official_split", "amd4", "vtdr", "glaucoma") == {
        "AMD_00001": {"sex": "female", "official_split": "train", "amd4": "intermediate", "vtdr": None, "glaucoma": None},
        "AMD_00002": {"sex": "male", "official_split": "test", "amd4": "late", "vtdr": None, "glaucoma": None},
        "DR_00001": {"sex": "male", "official_split": "val", "amd4": None, "vtdr": "yes", "glaucoma": None},
        "Glaucoma_00001": {"sex": "female", "official_split": "train", "amd4": None, "vtdr": None, "glaucoma": "yes"}}
    assert reasons(e, "label:amd4") == ["AMD is graded in the AMD cohort only"] * 2
    assert set(m["modality"]) == {"slo"}


def test_fairgenmed(adapted):
    m, _ = adapted("fairgenmed")
    assert rows(m, "glaucoma", "md_severity", "official_split") == {
        "fgm_00001": {"glaucoma": "yes", "md_severity": "moderate", "official_split": "train"},
        "fgm_00002": {"glaucoma": "no", "md_severity": "normal", "official_split": "val"},
        "fgm_00003": {"glaucoma": "yes", "md_severity": "severe", "official_split": "test"}}


def test_harvard_npz_archives(adapted):
    gf, e = adapted("harvard_gf")
    assert rows(gf, "age", "sex", "glaucoma", "official_split") == {
        "train/data_0001": {"age": 70.0, "sex": "male", "glaucoma": "yes", "official_split": "train"},
        "train/data_0002": {"age": 58.0, "sex": "female", "glaucoma": "no", "official_split": "train"},
        "val/data_0003": {"age": 61.0, "sex": "female", "glaucoma": "no", "official_split": "val"},
        "test/data_0004": {"age": 77.0, "sex": "male", "glaucoma": "yes", "official_split": "test"}}
    assert any(r.startswith("no image key") for r in reasons(e, "image"))
    ffm, _ = adapted("fairfedmed")
    assert rows(ffm, "age", "sex", "glaucoma")["all/data_00003"] == {"age": None, "sex": "male", "glaucoma": "no"}


def test_justraigs_fellow_eyes_share_a_patient_across_partition_folders(adapted):
    m, _ = adapted("justraigs")
    assert rows(m, "path", "patient_id", "age", "rg") == {
        "TRAIN000000": {"path": "0/TRAIN000000.JPG", "patient_id": "TRAIN000000", "age": 60.0, "rg": "yes"},
        "TRAIN000001": {"path": "1/TRAIN000001.JPG", "patient_id": "TRAIN000000", "age": 60.0, "rg": "no"},
        "TRAIN000002": {"path": "0/TRAIN000002.JPG", "patient_id": "TRAIN000002", "age": 71.0, "rg": "no"}}


def test_grape_per_eye_labels_joined_onto_visits(adapted):
    m, e = adapted("grape")
    assert rows(m, "patient_id", "eye", "age", "sex", "plr2", "plr3", "md_progression") == {
        "1_OD_1": {"patient_id": "1", "eye": "OD", "age": 45.0, "sex": "male", "plr2": "no", "plr3": "yes",
                   "md_progression": "no"},
        "1_OD_2": {"patient_id": "1", "eye": "OD", "age": 45.0, "sex": "male", "plr2": "no", "plr3": "yes",
                   "md_progression": "no"},
        "2_OD_1": {"patient_id": "2", "eye": "OD", "age": 60.0, "sex": "female", "plr2": "no", "plr3": "no",
                   "md_progression": "no"},
        "3_OS_1": {"patient_id": "3", "eye": "OS", "age": None, "sex": None, "plr2": None, "plr3": None,
                   "md_progression": None}}
    assert "no image for this row ('/')" in reasons(e, "image")
    assert reasons(e, "label:plr2") == ["no row in VF and clinical information.xlsx for this image"]


def test_aireadi_dicom_selection_and_participant_join(adapted):
    m, e = adapted("aireadi")
    assert sorted(m["patient_id"]) == ["1001", "1001", "1002", "1003"]
    by_pid = m.groupby("patient_id")["study_group"].first().to_dict()
    assert by_pid["1001"] == "healthy" and by_pid["1002"] == "t2dm_insulin" and pd.isna(by_pid["1003"])
    assert m["path"].str.endswith(".dcm").all() and set(m["eye"]) == {"OD", "OS"}
    assert sum(r.startswith("filtered out: filepath=") for r in reasons(e, "image")) == 1  # the IR image


def test_images_of_every_format_decode(data_root, adapted):
    from retinabench.data.readers import decode_image
    for name in ("aireadi", "harvard_gf", "fairfedmed", "aptos2019", "octid"):
        m, _ = adapted(name)
        entry_root = data_root / {"aireadi": "AI-READI", "harvard_gf": "Harvard-GF", "fairfedmed": "fairfedmed",
                                  "aptos2019": "aptos2019", "octid": "OCTID"}[name]
        for rel in m["path"]:
            decoded = decode_image(entry_root / rel)
            assert decoded.size[0] > 0 and decoded.mode in ("L", "RGB") and decoded.image.mode == "RGB"


def test_unestablished_datasets_fail_with_the_reason(registries, tmp_path):
    from retinabench.data.adapters import UnestablishedLayoutError
    for name in ("fimd", "ouwwfi"):
        entry = registries.datasets[name]
        assert entry["status"] == "unestablished" and entry["reason"]
        with pytest.raises(UnestablishedLayoutError, match="could not be established"):
            get_adapter(entry["adapter"])(tmp_path, entry)


def test_registry_tasks_match_what_the_adapters_write(registries):
    """Each task's classes (or its derive's source values) are values its dataset's adapter can write."""
    from retinabench.data.derived import derive_sources, derive_values
    for name, task in registries.tasks.items():
        entry = registries.datasets[task["dataset"]]
        written = adapter_info(entry["adapter"]).label_classes(entry)
        if entry.get("status") == "unestablished":
            continue
        for col in derive_sources(task):
            assert col in written, (name, col, sorted(written))
        if task.get("derive"):
            for col, values in derive_values(task).items():
                assert values <= set(written[col]), (name, col, values - set(written[col]))
            assert set(derive_values(task).get(task["label"], set())) | set() <= set(written[task["label"]])
        else:
            assert set(task["classes"]) == set(written[task["label"]]), (name, task["classes"], written[task["label"]])


def test_table_entries_list_exactly_the_files_they_read(registries):
    for name, entry in registries.datasets.items():
        if entry["adapter"] != "table":
            continue
        cfg = entry["table"]
        files = {s["file"] for s in cfg.get("sources", [])} | {j["file"] for j in cfg.get("join", [])}
        assert set(entry["index_files"]) == files, name

"""Tiny copies of each reference dataset's RAW layout, for the adapter tests and for dry runs of the papers'
grids without the data: the same folders and file names, index files with the real column names, header
quirks and codings, and a few small phantom images in the published format (JPEG/PNG/TIFF via Pillow, DICOM via
pydicom, NPZ via numpy). Each writer plants the dataset's known traps (shared file names across partitions,
trailing spaces in headers, title rows above an XLSX header, unlabelled partitions, per-patient labels joined
onto per-eye images, missing and unlisted images) so the tests can check how the adapter records them.

``write_fixture(name, data_root)`` writes dataset ``name``'s fixture under ``data_root / <registry root>``.
The files themselves come from retinabench.testing.raw_files; nothing is committed as binary.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from retinabench.testing.raw_files import SIZE, write_csv, write_image, write_npz, write_xlsx


# ------------------------------------------------------------------------------------------ datasets
ICDR_COLUMNS_BRSET = ["image_id", "patient_id", "camera", "patient_age", "comorbidities", "diabetes_time_y",
                      "insuline", "patient_sex", "exam_eye", "diabetes", "nationality", "optic_disc", "vessels",
                      "macula", "DR_SDRG", "DR_ICDR", "focus", "Illuminaton", "image_field", "artifacts",
                      "diabetic_retinopathy", "macular_edema", "scar", "nevus", "amd", "vascular_occlusion",
                      "hypertensive_retinopathy", "drusens", "hemorrhage", "retinal_detachment", "myopic_fundus",
                      "increased_cup_disc", "other", "quality"]


def aptos2019(root: Path) -> None:
    write_csv(root / "train.csv", ["id_code", "diagnosis"], [["000c1434d8d7", 2], ["001639a390f0", 4],
                                                          ["0024cdab0c1e", 0], ["002c21358ce6", 1]])
    write_csv(root / "test.csv", ["id_code"], [["0005cfc8afb6"], ["003f0afdcd15"]])
    for i, name in enumerate(["000c1434d8d7", "001639a390f0", "0024cdab0c1e"]):  # 002c21358ce6 has no image
        write_image(root / "train_images" / f"{name}.png", i)
    write_image(root / "train_images" / "ffff00000000.png", 9)  # on disk, in no CSV
    for i, name in enumerate(["0005cfc8afb6", "003f0afdcd15"]):
        write_image(root / "test_images" / f"{name}.png", 10 + i)


def eyepacs(root: Path) -> None:
    write_csv(root / "trainLabels.csv", ["image", "level"], [["10_left", 0], ["10_right", 1], ["13_left", 4]])
    write_csv(root / "retinopathy_solution.csv", ["image", "level", "Usage"],
         [["15_left", 2, "Public"], ["15_right", 3, "Private"]])
    for i, name in enumerate(["10_left", "10_right", "13_left"]):
        write_image(root / "train" / f"{name}.jpeg", i)
    for i, name in enumerate(["15_left", "15_right"]):
        write_image(root / "test" / f"{name}.jpeg", 10 + i)
    write_image(root / "train" / "13_right.jpeg", 20)  # not in trainLabels.csv


def idrid(root: Path) -> None:
    gt = root / "2. Groundtruths"
    # The official CSVs: a trailing space in the DME header, trailing empty columns and blank rows.
    write_csv(gt / "a. IDRiD_Disease Grading_Training Labels.csv", [],
         [["IDRiD_001", 3, 2, "", "", ""], ["IDRiD_002", 0, 0, "", "", ""], ["", "", "", "", "", ""]],
         raw_header="Image name,Retinopathy grade,Risk of macular edema ,,,")
    write_csv(gt / "b. IDRiD_Disease Grading_Testing Labels.csv", [], [["IDRiD_001", 4, 1]],
         raw_header="Image name,Retinopathy grade,Risk of macular edema ")
    img = root / "1. Original Images"
    write_image(img / "a. Training Set" / "IDRiD_001.jpg", 1)
    write_image(img / "a. Training Set" / "IDRiD_002.jpg", 2)
    write_image(img / "b. Testing Set" / "IDRiD_001.jpg", 3)  # same file name, a different image


def messidor2(root: Path) -> None:
    write_csv(root / "messidor_data.csv", ["image_id", "adjudicated_dr_grade", "adjudicated_dme", "adjudicated_gradable"],
         [["20051020_43808_0100_PP.png", 0, 0, 1], ["20051020_43832_0100_PP.png", 2, 1, 1],
          ["IM000001.JPG", "", "", 0], ["IM000002.JPG", 1, 0, 1]])
    write_csv(root / "messidor-2.csv", ["left", "right"],
         [["20051020_43808_0100_PP.png", "20051020_43832_0100_PP.png"], ["IM000001.JPG", "IM000003.JPG"]], sep=";")
    for i, name in enumerate(["20051020_43808_0100_PP.png", "20051020_43832_0100_PP.png", "IM000001.JPG",
                              "IM000002.JPG", "IM000003.JPG"]):
        write_image(root / "IMAGES" / name, i)


def _brset_row(image_id, patient, age, sex, eye, diabetes, dr, dme=0, cup=0, quality="Adequate", **flags):
    row = dict.fromkeys(ICDR_COLUMNS_BRSET, "")
    row.update(image_id=image_id, patient_id=patient, camera="Canon CR", patient_age=age, patient_sex=sex,
               exam_eye=eye, diabetes=diabetes, nationality="Brazil", optic_disc=1, vessels=1, macula=1,
               DR_SDRG=dr, DR_ICDR=dr, focus=1, Illuminaton=1, image_field=1, artifacts=1, quality=quality)
    for col in ICDR_COLUMNS_BRSET[20:33]:
        row[col] = 0
    row.update(diabetic_retinopathy=int(dr > 0), macular_edema=dme, increased_cup_disc=cup, **flags)
    return [row[c] for c in ICDR_COLUMNS_BRSET]


def brset(root: Path) -> None:
    rows = [_brset_row("img00001", 1, 55, 2, 1, "No", 0),
            _brset_row("img00002", 1, 55, 2, 2, "yes", 2, dme=1),
            _brset_row("img00003", 2, "", 1, 1, "No", 0, cup=1, quality="Inadequate", optic_disc="bv"),
            _brset_row("img04414", 3, 70, 1, 2, "No", 0)]  # listed without an image (as in v1.0.1)
    write_csv(root / "labels_brset.csv", ICDR_COLUMNS_BRSET, rows)
    for i, name in enumerate(["img00001", "img00002", "img00003"]):
        write_image(root / "fundus_photos" / f"{name}.jpg", i)
    (root / "fundus_photos" / "index.html").write_text("<html></html>")  # PhysioNet mirror artefact


MBRSET_COLUMNS = ["patient", "age", "sex", "dm_time", "insulin", "insulin_time", "oraltreatment_dm",
                  "systemic_hypertension", "insurance", "educational_level", "alcohol_consumption", "smoking",
                  "obesity", "vascular_disease", "acute_myocardial_infarction", "nephropathy", "neuropathy",
                  "diabetic_foot", "file", "laterality", "final_artifacts", "final_quality", "final_icdr",
                  "final_edema"]


def mbrset(root: Path) -> None:
    def row(patient, file, lat, icdr, edema, quality="yes", age=61, sex=0, htn="yes", neph="no"):
        r = dict.fromkeys(MBRSET_COLUMNS, "")
        r.update(patient=patient, age=age, sex=sex, dm_time=10, insulin="no", systemic_hypertension=htn,
                 nephropathy=neph, file=file, laterality=lat, final_quality=quality, final_icdr=icdr,
                 final_edema=edema)
        return [r[c] for c in MBRSET_COLUMNS]
    rows = [row(1, "1.1.jpg", "right", 0, "no"), row(1, "1.2.jpg", "right", 0, "no"),
            row(1, "1.3.jpg", "left", 2, "yes"), row(1, "1.4.jpg", "left", 2, "yes", quality="no"),
            row(2, "2.1.jpg", "right", "", "Yes", age=48, sex=1, htn="no", neph="yes")]
    write_csv(root / "labels_mbrset.csv", MBRSET_COLUMNS, rows)
    for i, name in enumerate(["1.1.jpg", "1.2.jpg", "1.3.jpg", "1.4.jpg", "2.1.jpg"]):
        write_image(root / "images" / name, i)


def papila(root: Path) -> None:
    title = [None, "Age", "Gender", "Diagnosis", "Refractive_Defect", None, None, "Phakic/Pseudophakic", "IOP",
             None, "Pachymetry", "Axial_Length", "VF_MD"]
    ids = ["ID"] + [None] * 12
    header = [None, "Age", "Gender", "Diagnosis", "dioptre_1", "dioptre_2", "astigmatism", "Phakic/Pseudophakic",
              "Pneumatic", "Perkins", "Pachymetry", "Axial_Length", "VF_MD"]
    od = [["#002", 75, 1, 0, -0.5, -0.75, 90, 0, 15, 16, 540, 23.4, -1.2],
          ["#004", 60, 0, 1, 1.0, 0, 0, 1, 22, 21, 520, 24.0, -6.5],
          ["#005", 51.0, 0, 2, 0, 0, 0, 0, 19, None, 560, 23.1, None]]
    os_ = [["#002", 75, 1, 0, -0.25, 0, 0, 0, 14, 15, 538, 23.5, -0.8],
           ["#004", 60, 0, 1, 0.75, 0, 0, 1, 23, 22, 522, 24.1, -9.0],
           ["#005", 51.0, 0, 0, 0, 0, 0, 0, 18, None, 555, 23.0, None]]
    blank = [None] * 13
    write_xlsx(root / "ClinicalData" / "patient_data_od.xlsx", {"Sheet1": [title, ids, header, *od, blank]})
    write_xlsx(root / "ClinicalData" / "patient_data_os.xlsx", {"Sheet1": [title, ids, header, *os_]})
    for i, name in enumerate(["RET002OD", "RET002OS", "RET004OD", "RET004OS", "RET005OD"]):  # RET005OS missing
        write_image(root / "FundusImages" / f"{name}.jpg", i)


RFMID_COLUMNS = ["ID", "Disease_Risk", "DR", "ARMD", "MH", "DN", "MYA", "BRVO", "TSLN", "ERM", "ODC", "CME"]


def _rfmid(root: Path, layout: dict[str, tuple[str, str]]) -> None:
    rows = {"train": [[1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]],
            "val": [[1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]],
            "test": [[1, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0]]}
    seed = 0
    for part, (csv_rel, folder) in layout.items():
        write_csv(root / csv_rel, RFMID_COLUMNS, rows[part])
        for r in rows[part]:
            write_image(root / folder / f"{r[0]}.png", seed)
            seed += 1


def rfmid(root: Path) -> None:
    _rfmid(root, {"train": ("2. Groundtruths/a. RFMiD_Training_Labels.csv", "1. Original Images/a. Training Set"),
                  "val": ("2. Groundtruths/b. RFMiD_Validation_Labels.csv", "1. Original Images/b. Validation Set"),
                  "test": ("2. Groundtruths/c. RFMiD_Testing_Labels.csv", "1. Original Images/c. Testing Set")})


def rfmid_riadd(root: Path) -> None:
    _rfmid(root, {"train": ("Training_Set/RFMiD_Training_Labels.csv", "Training_Set/Training"),
                  "val": ("Evaluation_Set/RFMiD_Validation_Labels.csv", "Evaluation_Set/Validation"),
                  "test": ("Test_Set/RFMiD_Testing_Labels.csv", "Test_Set/Test")})


def rfmid2(root: Path) -> None:
    # Latin-1 text with a garbled byte after "ON", a non-breaking space after "DR", and the OPDM typo.
    header = "ID,WNL,DR\xa0,ARMD,ON\x96,OPDM"
    sets = {"Training_set": ("RFMiD_2_Training_labels.csv", [[1, 1, 0, 0, 0, 0], [2, 0, 1, 0, 0, 0]]),
            "Validation_set": ("RFMiD_2_Validation_labels.csv", [[1, 0, 1, 0, 0, 0]]),
            "Test_set": ("RFMiD_2_Testing_labels.csv", [[1, 0, 0, 1, 1, 0]])}
    seed = 0
    for folder, (name, rows) in sets.items():
        write_csv(root / folder / name, [], rows, raw_header=header, encoding="latin-1")
        for r in rows:
            write_image(root / folder / f"{r[0]}.jpg", seed)
            seed += 1


def refuge(root: Path) -> None:
    def rec(name, label=None):
        r = {"ImgName": name, "Fovea_X": 1000.5, "Fovea_Y": 1020.25, "Size_X": 2124, "Size_Y": 2056}
        if label is not None:
            r["Label"] = label
        return r
    split = {"train": {"0": rec("g0001.jpg", 1), "1": rec("n0001.jpg", 0)},
             "val": [rec("V0001.jpg", 0), rec("V0002.jpg", 1)],
             "test": [rec("T0001.jpg"), rec("T0002.jpg")]}  # the test labels are not in this release
    seed = 0
    for part, records in split.items():
        (root / part).mkdir(parents=True, exist_ok=True)
        (root / part / "index.json").write_text(json.dumps(records))
        for r in (records.values() if isinstance(records, dict) else records):
            write_image(root / part / "Images" / r["ImgName"], seed)
            seed += 1


def g1020(root: Path) -> None:
    write_csv(root / "G1020.csv", ["imageID", "binaryLabels"], [["image_0.jpg", 0], ["image_1.jpg", 1], ["image_2.jpg", 0]])
    for i in range(3):
        write_image(root / "Images" / f"image_{i}.jpg", i)
        (root / "Images" / f"image_{i}.json").write_text("{}")  # disc/cup annotations


def jsiec1000(root: Path) -> None:
    base = root / "1000images"
    write_image(base / "0.0.Normal" / "1ffa9627-8d87-11e8-9daf-6045cb817f5b..JPG", 0)
    write_image(base / "0.3.DR1" / "a1.jpg", 1)
    write_image(base / "1.0.DR2" / "b2.jpg", 2)
    write_image(base / "10.0.Possible glaucoma" / "c3.png", 3)
    write_image(base / "29.1.Blur fundus with suspected PDR" / "d4.jpg", 4)
    (base / "0.0.Normal" / ".DS_Store").write_bytes(b"\0")


def octid(root: Path) -> None:
    for i, cls in enumerate(["NORMAL", "AMRD", "CSR", "DR", "MH"]):
        write_image(root / cls / f"{cls}{i + 1}.jpeg", i, grey=True)


def oct2017(root: Path) -> None:
    write_image(root / "train" / "CNV" / "CNV-1016042-1.jpeg", 0, grey=True)
    write_image(root / "train" / "NORMAL" / "NORMAL-1016042-2.jpeg", 1, grey=True)  # same patient, other class
    write_image(root / "test" / "DME" / "DME-9925-1.jpeg", 2, grey=True)
    write_image(root / "test" / "DRUSEN" / "DRUSEN-2233-1.jpeg", 3, grey=True)


def hrf(root: Path) -> None:
    for i, name in enumerate(["01_h.jpg", "01_dr.JPG", "01_g.jpg", "02_h.jpg"]):
        write_image(root / "images" / name, i)
    write_image(root / "manual1" / "01_h.tif", 9, grey=True)


def drtid(root: Path) -> None:
    gt = root / "Ground Truths" / "DR_grade"
    header = ["ID", "Grade", "Macula", "Optic disc", "LR"]
    write_csv(gt / "a. DR_grade_Training.csv", header, [[1, 2, "1_1", "1_2", "L"], [2, 0, "2_1", "2_2", "R"]])
    write_csv(gt / "b. DR_grade_Testing.csv", header, [[3, 4, "3_1", "3_2", "L"]])
    for i, stem in enumerate(["1_1", "1_2", "2_1", "2_2", "3_1"]):  # 3_2 is missing
        write_image(root / "Original Images" / f"{stem}.jpg", i)


HARVARD_COLUMNS = ["filename", "age", "gender", "race", "ethnicity", "language", "maritalstatus"]


def fairvision(root: Path) -> None:
    cohorts: dict[str, tuple[str, list[list[Any]]]]  # cohort -> (label column, csv rows)
    cohorts = {"AMD": ("amd", [["data_00001.npz", 71.2, "female", "white", "non-hispanic", "english", "married",
                                "intermediate.dry", "training"],
                               ["data_00002.npz", 80.0, "male", "asian", "non-hispanic", "english", "single",
                                "3", "test"]]),
               "DR": ("dr", [["data_00001.npz", 55.5, "Male", "black", "hispanic", "spanish", "married", "pdr",
                              "validation"]]),
               "Glaucoma": ("glaucoma", [["data_00001.npz", 64.0, "female", "black", "non-hispanic", "english",
                                          "widowed", "yes", "training"]])}
    seed = 0
    folders = {"training": "Training", "validation": "Validation", "test": "Test"}
    for cohort, (key, rows) in cohorts.items():
        write_csv(root / f"data_summary_{key}.csv", HARVARD_COLUMNS + [key, "use"], rows)
        for r in rows:
            num = r[0][5:10]
            write_image(root / cohort / folders[r[-1]] / f"slo_{num}.jpg", seed)
            write_npz(root / cohort / folders[r[-1]] / r[0], seed, male=int(r[2].lower() == "male"))
            seed += 1


def fairgenmed(root: Path) -> None:
    rows: list[list[Any]]  # use, filename, glaucoma, cdr_status, md_severity, se_status, age, gender, race, ethnicity
    rows = [["training", "data_00001.npz", 1, "0.7", "moderate", "myopia", 66, "female", "white", "non-hispanic"],
            ["validation", "data_00002.npz", 0, "0.4", "normal", "emmetropia", 52, "male", "asian", "non-hispanic"],
            ["test", "data_00003.npz", "yes", "0.8", "severe", "myopia", 70, "male", "black", "hispanic"]]
    write_csv(root / "data_summary.csv", ["use", "filename", "glaucoma", "cdr_status", "md_severity", "se_status", "age",
                                     "gender", "race", "ethnicity"], rows)
    folders = {"training": "Training", "validation": "Validation", "test": "Test"}
    for i, r in enumerate(rows):
        write_image(root / folders[r[0]] / f"slo_{r[1][5:10]}.jpg", i)


def fairfedmed(root: Path) -> None:
    write_npz(root / "all" / "data_00001.npz", 0, glaucoma=1, male=0, age=67.0, race=2)
    write_npz(root / "all" / "data_00002.npz", 1, glaucoma=0, male=1, age=45.5, race=0)
    write_npz(root / "all" / "data_00003.npz", 2, glaucoma=0, male=1, race=1)  # no age key
    write_csv(root / "meta_all.csv", ["filename"], [["data_00001.npz"], ["data_00002.npz"], ["data_00003.npz"]])


def harvard_gf(root: Path) -> None:
    write_npz(root / "train" / "data_0001.npz", 0, image_key="rnflt", glaucoma=1, md=-4.2, age=70.0, male=1, race=1)
    write_npz(root / "train" / "data_0002.npz", 1, image_key="rnflt", glaucoma=0, md=-0.5, age=58.0, male=0, race=0)
    write_npz(root / "val" / "data_0003.npz", 2, image_key="rnflt", glaucoma=0, md=0.1, age=61.0, male=0, race=2)
    write_npz(root / "test" / "data_0004.npz", 3, image_key="rnflt", glaucoma=1, md=-9.8, age=77.0, male=1, race=2)
    write_npz(root / "test" / "data_0005.npz", 4, image_key=None, glaucoma=1, age=50.0, male=1)  # no image


def justraigs(root: Path) -> None:
    features = ["ANRS", "ANRI", "RNFLDS", "RNFLDI", "BCLVS", "BCLVI", "NVT", "DH", "LD", "LC"]
    header = ["Eye ID", "Final Label", "Fellow Eye ID", "Age", "Label G1", "Label G2", "Label G3"] + \
        [f"G{g} {f}" for g in (1, 2, 3) for f in features]
    pad = [""] * 30
    rows = [["TRAIN000000", "RG", "TRAIN000001", 60, "RG", "RG", "", *pad],
            ["TRAIN000001", "NRG", "TRAIN000000", 60, "NRG", "NRG", "", *pad],
            ["TRAIN000002", "NRG", "", 71, "NRG", "RG", "NRG", *pad]]
    write_csv(root / "JustRAIGS_Train_labels.csv", header, rows, sep=";")
    write_image(root / "0" / "TRAIN000000.JPG", 0)
    write_image(root / "1" / "TRAIN000001.JPG", 1)
    write_image(root / "0" / "TRAIN000002.JPG", 2)


def grape(root: Path) -> None:
    b1 = ["Subject Number", "Laterality", "Age", "Gender", "IOP", "CCT", "Category of Glaucoma", "RNFL", None, None,
          None, None, "Progression Status", None, None, "Corresponding CFP"]
    b2 = [None] * 7 + ["Mean", "S", "N", "I", "T", "PLR2", "PLR3", "MD", None]
    base = [[1, "OD", 45, "M", 15, 540, "OAG", 90, 110, 70, 120, 60, 0, 1, 0, "1_OD_1.jpg"],
            [1, "OS", 45, "M", 14, 538, "OAG", 85, 100, 65, 115, 58, 1, 1, 1, None],
            [2, "OD", 60, "F", 18, 520, "ACG", 80, 95, 60, 110, 55, 0, 0, 0, "2_OD_1.jpg"]]
    f1 = ["Subject Number", "Laterality", "Visit Number", "Interval Years", "IOP", "Corresponding CFP", "VF", None]
    f2 = [None] * 6 + ["1", "2"]
    follow = [[1, "OD", 1, 0.0, 15, "1_OD_1.jpg", 27, 26],
              [1, "OD", 2, 0.5, 16, "1_OD_2.jpg", 25, 26],
              [1, "OS", 1, 0.0, 14, "/", 28, 27],           # a visit without a photograph
              [2, "OD", 1, 0.0, 18, "2_OD_1.jpg", 24, 22],
              [3, "OS", 1, 0.0, 20, "3_OS_1.jpg", 29, 30]]  # an eye without a Baseline row
    write_xlsx(root / "VF and clinical information.xlsx", {"Baseline": [b1, b2, *base], "Follow-up": [f1, f2, *follow]})
    for i, name in enumerate(["1_OD_1.jpg", "1_OD_2.jpg", "2_OD_1.jpg", "3_OS_1.jpg"]):
        write_image(root / "CFPs" / name, i)


def aireadi(root: Path) -> None:
    write_csv(root / "participants.tsv", ["participant_id", "clinical_site", "study_group", "age", "study_visit_date",
                                     "recommended_split"],
         [[1001, "UW", "healthy", 58, "2023-05-01", "train"],
          [1002, "UAB", "insulin_dependent", 66, "2023-06-11", "test"]], sep="\t")
    header = ["participant_id", "manufacturer", "manufacturers_model_name", "laterality", "anatomic_region",
              "imaging", "height", "width", "color_channel_dimension", "sop_instance_uid", "filepath"]
    rel = "retinal_photography/{kind}/icare_eidon/{pid}/{pid}_eidon_{region}_{kind}_{side}_1.2.826.0.{n}.dcm"
    files = [(1001, "cfp", "mosaic", "l", 1), (1001, "cfp", "macula", "r", 2), (1001, "ir", "macula", "r", 3),
             (1002, "cfp", "macula", "r", 4), (1003, "cfp", "macula", "l", 5)]
    rows = []
    for pid, kind, region, side, n in files:
        path = rel.format(kind=kind, pid=pid, region=region, side=side, n=n)
        rows.append([pid, "iCare", "Eidon", side.upper(), region, "Color Photography" if kind == "cfp" else "IR",
                     SIZE, SIZE, 3, f"1.2.826.0.{n}", "/" + path])
        write_image(root / path, n)
    write_csv(root / "retinal_photography" / "manifest.tsv", header, rows, sep="\t")


WRITERS: dict[str, Callable[[Path], None]] = {
    "aptos2019": aptos2019, "eyepacs": eyepacs, "idrid": idrid, "messidor2": messidor2, "brset": brset,
    "brset_diabetic": brset, "mbrset": mbrset, "mbrset_macula": mbrset, "papila": papila, "rfmid": rfmid,
    "rfmid_riadd": rfmid_riadd, "rfmid2": rfmid2, "refuge": refuge, "g1020": g1020, "jsiec1000": jsiec1000,
    "octid": octid, "oct2017": oct2017, "hrf": hrf, "drtid": drtid, "fairvision": fairvision,
    "fairgenmed": fairgenmed, "fairfedmed": fairfedmed, "harvard_gf": harvard_gf, "justraigs": justraigs,
    "grape": grape, "aireadi": aireadi,
}


def write_fixture(name: str, data_root: Path, registry: dict | None = None) -> Path:
    """Write dataset ``name``'s fixture under ``data_root / <its registry root>``; returns that folder."""
    if registry is None:
        from retinabench.registry import load_registry
        registry = load_registry(Path(__file__).resolve().parents[3] / "config" / "datasets.yaml", "datasets")
    if name not in WRITERS:
        raise KeyError(f"no raw-layout fixture for {name!r}; fixtures: {sorted(WRITERS)}")
    root = Path(data_root) / registry[name]["root"]
    writer = WRITERS[name]
    marker = root / f".fixture-{writer.__name__}"  # variants sharing a root and a writer write it once
    if not marker.exists():
        writer(root)
        marker.write_text("")
    return root


def main(argv: list[str] | None = None) -> int:
    """``python -m retinabench.testing.raw_fixtures DATA_ROOT [NAME ...]``: write fixtures (default: all), e.g. to
    dry-run the papers' grids without the data (`snakemake -n --configfile config/ocularbench.yaml
    --config data_root=DATA_ROOT`)."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("data_root", type=Path)
    parser.add_argument("names", nargs="*", help=f"datasets (default all: {', '.join(WRITERS)})")
    args = parser.parse_args(argv)
    for name in args.names or WRITERS:
        print(write_fixture(name, args.data_root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

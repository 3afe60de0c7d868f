"""`retinabench datasets --check`: present / complete / readable per dataset, without running the pipeline."""
from pathlib import Path

from retinabench import cli
from retinabench.data.check import check_dataset
from retinabench.testing.raw_fixtures import write_fixture

REPO = Path(__file__).resolve().parents[2]


def test_check_reports_present_incomplete_unreadable_absent(tmp_path, registries, monkeypatch, capsys):
    for name in ("aptos2019", "papila", "grape", "eyepacs"):
        write_fixture(name, tmp_path, registries.datasets)
    (tmp_path / "PAPILA" / "FundusImages" / "RET002OD.jpg").write_bytes(b"not a jpeg")
    (tmp_path / "eyepacs" / "retinopathy_solution.csv").unlink()
    got = {n: check_dataset(n, registries.datasets[n], tmp_path, decode=10)
           for n in ("aptos2019", "papila", "grape", "eyepacs", "idrid", "fimd", "phantom")}
    assert {n: r.status for n, r in got.items()} == {
        "aptos2019": "incomplete", "papila": "unreadable", "grape": "ok", "eyepacs": "incomplete",
        "idrid": "absent", "fimd": "unestablished", "phantom": "generated"}
    assert (got["aptos2019"].n_images, got["aptos2019"].n_missing, got["aptos2019"].n_unlisted) == (5, 1, 1)
    assert any("RET002OD.jpg" in d for d in got["papila"].details)
    assert any("retinopathy_solution.csv" in d for d in got["eyepacs"].details)
    assert (got["grape"].n_images, got["grape"].n_patients, got["grape"].n_decoded) == (4, 3, 4)

    monkeypatch.chdir(REPO)
    code = cli.main(["datasets", "--check", "--data-root", str(tmp_path), "--dataset", "grape"])
    out = capsys.readouterr().out
    # present and readable, but the fixture's 4 images are too few for the default run (tests/test_own_data.py)
    assert code == 1 and "grape" in out and "too_small" in out and "dataset 'grape'" in out
    code = cli.main(["datasets", "--check", "--data-root", str(tmp_path), "--dataset", "grape", "--dataset", "idrid"])
    assert code == 1 and "not ready: grape, idrid" in capsys.readouterr().err


def test_check_surfaces_the_adapters_error(tmp_path, registries):
    write_fixture("brset", tmp_path, registries.datasets)
    csv = tmp_path / "brset" / "labels_brset.csv"
    csv.write_text(csv.read_text().replace("image_id,", "img_id,", 1))
    r = check_dataset("brset", registries.datasets["brset"], tmp_path)
    assert r.status == "unreadable" and "template field {image_id} is not a column" in r.details[0]

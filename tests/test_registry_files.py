"""Registries take one file or a list of files: a user's file beside the shipped ones; a name defined twice is
refused naming both files; each encoder file's lock file sits beside it."""
from pathlib import Path

import pytest
import yaml

from retinabench.registry import Registries, RegistryError, load_registries
from retinabench.settings import ConfigError, load

REPO = Path(__file__).resolve().parents[1]
SHIPPED = {k: REPO / f"config/{k}.yaml" for k in ("datasets", "tasks", "encoders")}

MY_DATASET = {"my_fundus": {"adapter": "table", "root": "my_fundus", "index_files": ["labels.csv"],
                            "modalities": ["cfp"], "web_exposure_risk": "low",
                            "table": {"sources": [{"file": "labels.csv"}], "image": {"column": "file"},
                                      "image_id": "{file}", "modality": "cfp", "patient": {"column": "patient"},
                                      "labels": {"grade": {"column": "grade", "codes": {"0": "no", "1": "yes"}}}}}}


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_list_of_files_adds_entries_beside_the_shipped_ones(tmp_path):
    mine = _write(tmp_path / "my_datasets.yaml", MY_DATASET)
    entries, origin = load_registries([SHIPPED["datasets"], mine], "datasets")
    assert "my_fundus" in entries and "tvhl" in entries
    assert origin["my_fundus"] == mine and origin["tvhl"] == SHIPPED["datasets"]
    one, _ = load_registries(SHIPPED["datasets"], "datasets")  # one file, as before
    assert {k: v for k, v in entries.items() if k != "my_fundus"} == one


def test_a_name_defined_in_two_files_is_refused_naming_both(tmp_path):
    shipped = yaml.safe_load(SHIPPED["datasets"].read_text())
    dup = _write(tmp_path / "my_datasets.yaml", {"tvhl": shipped["tvhl"]})
    with pytest.raises(RegistryError, match="'tvhl' is defined in both") as err:
        load_registries([SHIPPED["datasets"], dup], "datasets")
    assert str(SHIPPED["datasets"]) in str(err.value) and str(dup) in str(err.value)


def test_each_encoder_file_reads_the_lock_file_beside_it(tmp_path):
    from retinabench.registry.lockfile import lock_state, pins_of, write_lock
    shipped = yaml.safe_load(SHIPPED["encoders"].read_text())
    hub = next(n for n, e in shipped.items() if e.get("hub_id") and not e.get("variants"))
    mine = _write(tmp_path / "my_encoders.yaml", {"my_copy": shipped[hub]})
    entry = load_registries(mine, "encoders")[0]["my_copy"]
    record = {"pins": pins_of(entry), "revision": "0" * 40, "files": {"config.json": "a" * 64}}
    write_lock(tmp_path / "my_encoders.lock.yaml", {"my_copy": record})
    reg = Registries(SHIPPED["datasets"], SHIPPED["tasks"], [SHIPPED["encoders"], mine])
    assert reg.lock_path("my_copy") == tmp_path / "my_encoders.lock.yaml"
    assert reg.lock_path(hub) == REPO / "config/encoders.lock.yaml"
    assert reg.encoder("my_copy")["lock"] == record and lock_state(reg.encoder("my_copy"), record) == "locked"
    assert reg.encoder(hub)["lock"] is None  # the shipped lock file has no record of its own for it


def test_the_config_takes_a_file_or_a_non_empty_list():
    assert load({"registries": {"tasks": ["a.yaml", "b.yaml"]}}).registries.tasks == ["a.yaml", "b.yaml"]
    assert load({}).registries.datasets == "config/datasets.yaml"
    for bad in ([], ["a.yaml", "a.yaml"]):
        with pytest.raises(ConfigError, match="registries.datasets"):
            load({"registries": {"datasets": bad}})


def test_an_unknown_name_is_one_message_with_a_did_you_mean():
    reg = Registries(SHIPPED["datasets"], SHIPPED["tasks"], SHIPPED["encoders"])
    with pytest.raises(RegistryError, match=r"unknown dataset 'phantm'; did you mean 'phantom'\?"):
        reg.dataset("phantm")
    with pytest.raises(RegistryError, match=r"unknown encoder 'zzz' \(known: "):
        reg.encoder("zzz")

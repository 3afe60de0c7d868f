"""CLI options take several values where Snakemake's do: `--configfile a b`, `--config k=v k2=v2` (parsed and
merged as Snakemake does), `datasets --check --dataset a b`."""
import os
from pathlib import Path

import pytest
import yaml

from retinabench import cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def in_repo():
    old = os.getcwd()
    os.chdir(REPO)
    yield
    os.chdir(old)


def test_configfile_and_config_take_several_values_merged_as_snakemake_does(in_repo, tmp_path):
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump({"datasets": ["tvhl"], "knn": {"k": 7}}))
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump({"knn": {"temperature": 0.05}, "results": "results/b"}))
    args = cli.argparse.Namespace(configfile=[str(a), str(b)], config=["results=results/c", "knn={k: 9}"])
    config = cli._config(args)
    assert config["datasets"] == ["tvhl"] and config["results"] == "results/c"
    assert config["knn"]["k"] == 9 and config["knn"]["temperature"] == 0.05  # nested keys merge, not replace
    assert cli._load_config([str(a)])["knn"]["k"] == 7


def test_the_parser_takes_several_values_after_one_flag_or_the_flag_repeated(in_repo, capsys):
    assert cli.main(["tasks", "--configfile", "config/config.yaml", "config/tvhl.yaml",
                     "--config", "results=results/x", "data_root=/nowhere"]) == 0
    assert "tvhl_oct_dme" in capsys.readouterr().out
    assert cli.main(["tasks", "--configfile", "config/tvhl.yaml", "--configfile", "config/config.yaml"]) == 0
    with pytest.raises(SystemExit, match="did you mean 'data_root'"):
        cli.main(["encoders", "--config", "dataroot=x"])
    with pytest.raises(SystemExit, match="name=value"):
        cli.main(["encoders", "--config", "novalue"])


def test_datasets_check_takes_several_datasets_after_one_flag(in_repo, capsys):
    assert cli.main(["datasets", "--check", "--dataset", "phantom", "phantom_siteb", "--decode", "0"]) == 0
    out = capsys.readouterr().out
    assert "phantom_siteb" in out and out.count("phantom") >= 2

"""A config error stops `snakemake` before anything else with one short message (retinabench.settings, loaded by
the Snakefile before Snakemake's schema validation): each offending key once, an unknown key with a "did you
mean". Dry runs on a fresh copy of the workflow (no run needed: the config is checked at parse time)."""
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow
TINY = yaml.safe_load((Path(__file__).resolve().parents[2] / ".test/config/config.yaml").read_text())


def test_a_one_key_typo_in_config_is_one_short_message(make_workflow_copy, run_snakemake, tmp_path):
    work = make_workflow_copy(tmp_path / "repo", TINY)
    out = run_snakemake(work, "-n", "--config", "knn={kk: 5000}", check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "knn.kk: unknown key; did you mean 'knn.k'?" in text, text[-3000:]
    assert len(text.splitlines()) <= 10, text  # was 1,152 lines (jsonschema's dump of the whole config)
    # several problems, from --config strings and config files alike, in the same one message
    out = run_snakemake(work, "-n", "--config", "split={fractions: {train: 0.8, val: 0.15, test: 0.15}}",
                        "seeds=[0, x]", check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "the configuration is invalid (2 problems)" in text, text[-3000:]
    assert "split.fractions: split fractions must sum to 1" in text
    assert "seeds[1]: Input should be a valid integer" in text
    assert len(text.splitlines()) <= 12, text

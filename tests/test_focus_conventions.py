"""config/focus.yaml runs FOCUS's named conventions; config/config.yaml keeps ours (docs/reproduction.md)."""
import yaml
from snakemake.utils import update_config

from retinabench.settings import load

from tests.conftest import REPO

# key path -> (ours: config/config.yaml, FOCUS's: config/focus.yaml)
CONVENTIONS = {
    ("logreg", "variant"): ("ours", "focus"),
    ("features", "probe_embedding"): ("pre_projection", "projected_l2"),
    ("zeroshot", "siglip_text_padding"): ("max_length", "focus"),
    ("mllm", "max_new_tokens"): (8, 128),
    ("mllm", "invalid_answers"): ("keep_as_wrong", "drop"),
    ("reliability", "bootstrap", "summary"): ("two_stage", "one_stage"),
    ("reliability", "bootstrap", "unit"): ("patient", "image"),
    ("reliability", "ece_bin_edges"): ("right_closed", "focus"),
    ("reliability", "ece_one_class_strata"): ("compute", "focus"),
}


def _settings(name=None):
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    if name:
        update_config(config, yaml.safe_load((REPO / f"config/{name}.yaml").read_text()))
    return load(config).plain()


def _at(plain, path):
    for key in path:
        plain = plain[key]
    return plain


def test_focus_config_sets_every_focus_convention_and_the_default_config_keeps_ours():
    ours, focus = _settings(), _settings("focus")
    for path, (want_ours, want_focus) in CONVENTIONS.items():
        assert _at(ours, path) == want_ours, path
        assert _at(focus, path) == want_focus, path


def test_the_focus_logistic_probe_runs_1000_iterations():
    from retinabench.protocols.registry import PROTOCOLS
    assert PROTOCOLS.get("logreg").settings(_settings("focus")).iterations == 1000
    assert PROTOCOLS.get("logreg").settings(_settings()).iterations == 2000

"""The settings models (retinabench.settings): every default declared once on a model, config/config.yaml documents
the same values, the JSON schema and docs/configuration.md are generated from the models (drift fails here), a
config error is one message naming each key with a "did you mean", and --config strings are coerced by the same
models."""
import typing
from pathlib import Path

import pytest
import yaml
from snakemake.cli import parse_config
from snakemake.utils import update_config

from retinabench.settings import Config, ConfigError, KnnSettings, Section, load, section_model
from retinabench.settings.generate import DOCS_PATH, SCHEMA_PATH, docs_text, schema_text

REPO = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())
# Keys config.yaml sets on purpose to something other than the default (the default is empty: no harmonised tasks).
CONFIG_ONLY = {("reliability", "harmonised")}
# The run configs shipped beside the defaults (each read as a --configfile over config/config.yaml).
RUN_CONFIGS = sorted({*REPO.glob("config/*.yaml"), *REPO.glob(".test/config/*.yaml")} - {
    REPO / f"config/{n}.yaml" for n in ("datasets", "tasks", "encoders", "encoders.lock", "prompts", "site")})


def keys(value, prefix=""):
    """Dotted key paths of nested mappings (lists and empty mappings are values)."""
    if not isinstance(value, dict) or not value:
        return {prefix}
    return {k for name, v in value.items() for k in keys(v, f"{prefix}.{name}" if prefix else name)}


def test_config_yaml_documents_every_key_and_its_default():
    loaded = load(DEFAULT).plain()
    defaults = Config().plain()
    for section, key in CONFIG_ONLY:
        loaded[section][key] = defaults[section][key]
    differ = {k: (v, defaults[k]) for k, v in loaded.items() if v != defaults[k]}
    assert not differ, f"config/config.yaml differs from the defaults of retinabench.settings: {differ}"
    # documentation: every key of every section is written out (list entries are values)
    shown = keys(DEFAULT)
    missing = {k for k in keys(defaults) if not any(s == k or s.startswith(k + ".") for s in shown)}
    assert not missing, f"config/config.yaml does not show {sorted(missing)}"


def test_each_section_is_declared_once_under_its_own_name():
    for name, field in Config.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, Section):
            assert field.annotation.section == name and section_model(name) is field.annotation
    with pytest.raises(KeyError, match="no config section 'knnn'"):
        section_model("knnn")


@pytest.mark.parametrize(("path", "make"), [(SCHEMA_PATH, schema_text), (DOCS_PATH, docs_text)])
def test_committed_schema_and_docs_are_what_the_models_generate(path, make):
    assert (REPO / path).read_text() == make(), (
        f"{path} differs from the models: regenerate it with `python -m retinabench.settings "
        f"{'schema' if path == SCHEMA_PATH else 'docs'}`")


def test_the_generated_schema_accepts_every_loaded_config_and_refuses_unknown_keys():
    import jsonschema
    schema = yaml.safe_load(schema_text())
    for path in RUN_CONFIGS:
        jsonschema.validate(load({**DEFAULT, **yaml.safe_load(path.read_text())}).plain(), schema)
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        jsonschema.validate({**Config().plain(), "knn": {"kk": 5}}, schema)


def declared(model, prefix=""):
    """Dotted keys the models declare (nested sections included)."""
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, Section):
            out += declared(field.annotation, f"{prefix}{name}.")
    return out


def test_docs_list_every_key_with_its_type_default_and_meaning():
    text = docs_text()
    for key in declared(Config):
        assert f"| `{key}` |" in text or f"\n## `{key}`\n" in text, key  # a row, or a section's heading
    assert "| `knn.k` | integer (>= 1) or `auto` | `20` | neighbours; auto: min(20, training images)" in text
    assert "| `reliability.attributes[].cut` |" in text and "| `sweep.encoders.<name>.lr_encoder` |" in text


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_loads(path):
    load({**DEFAULT, **yaml.safe_load(path.read_text())})


def test_a_typo_is_one_line_with_did_you_mean_and_every_problem_is_listed():
    with pytest.raises(ConfigError) as err:
        load({"knn": {"kk": 5000}})
    assert err.value.problems == ["knn.kk: unknown key; did you mean 'knn.k'?"]
    assert str(err.value).count("\n") == 2  # header, the problem, where the keys are documented
    with pytest.raises(ConfigError) as err:
        load({"knnn": {"k": 3}, "sweep": {"encoders": {"vit": {"lr_encodr": [1e-4]}}},
              "reliability": {"attributes": [{"name": "a", "colum": "age"}], "bootstrap": {"n_boot": 10}},
              "finetune": {"augment": {"scale": [1.2, 0.8]}}, "lora": {"deltas": {"variant": "x"}}})
    found = err.value.problems
    assert "knnn: unknown key; did you mean 'knn'?" in found
    assert "sweep.encoders.vit.lr_encodr: unknown key; did you mean 'sweep.encoders.vit.lr_encoder'?" in found
    assert "reliability.attributes[0].colum: unknown key; did you mean 'reliability.attributes[0].column'?" in found
    assert "reliability.attributes[0].column: Field required" in found
    assert "reliability.bootstrap.n_boot: Input should be greater than or equal to 1000 (got 10)" in found
    assert any(p.startswith("finetune.augment: finetune.augment.scale must be [min, max]") for p in found)
    assert any(p.startswith("lora.deltas.variant: Input should be 'invalid_wrong' or 'valid_both'") for p in found)
    assert len(found) == 7, found
    with pytest.raises(ConfigError, match="knn.k: Input should be a valid integer.*; or Input should be 'auto' "
                                          "\\(got 'many'\\)"):
        load({"knn": {"k": "many"}})
    with pytest.raises(ConfigError, match="zzz: unknown key; known keys: results, data_root, registries"):
        load({"zzz": 1})


def test_config_values_arrive_as_strings_and_are_coerced_by_the_models():
    """`snakemake --config` parses values with YAML's BaseLoader: every scalar is a string."""
    given = parse_config(["knn={k: 5000}", "seeds=[0, 1]", "finetune={enabled: true, epochs: 3, lr_encoder: 1e-4}",
                          "sweep={task: null, sensitivity_task: ~}", "features={batch_size: auto}",
                          "lora={processes: 2, sources: brset_dr}", "reliability={bootstrap: {level: 0.9}}"])
    assert given["knn"] == {"k": "5000"} and given["seeds"] == ["0", "1"]  # what the models receive
    config = dict(DEFAULT)
    update_config(config, given)
    c = load(config)
    assert c.knn.k == 5000 and type(c.knn.k) is int and c.seeds == [0, 1]
    assert c.finetune.enabled is True and c.finetune.epochs == 3 and c.finetune.lr_encoder == 1e-4
    assert c.sweep.task is None and c.sweep.sensitivity_task is None
    assert c.features.batch_size == "auto" and c.lora.processes == 2 and c.lora.sources == ["brset_dr"]
    assert c.reliability.bootstrap.level == 0.9 and c.reliability.bootstrap.n_boot == 1000  # partial: merged
    plain = c.plain()
    assert plain["knn"]["k"] == 5000 and plain["knn"]["temperature"] == 0.07  # what the workflow reads
    with pytest.raises(ConfigError, match="knn.k: Input should be a valid integer"):
        load({"knn": parse_config(["knn={k: 5k}"])["knn"]})


def test_a_default_is_declared_once():
    """knn.k: the model's field is the one declaration; the registry, the protocol and the start-up checks read it."""
    from retinabench.protocols.registry import PROTOCOLS
    assert KnnSettings.model_fields["k"].default == 20
    assert PROTOCOLS.get("knn").settings({}).k == 20
    assert PROTOCOLS.get("logreg").settings({}).iterations == 2000  # the value the pipeline uses (one, not two)
    import inspect

    from retinabench.protocols import knn, logreg
    for fn in (knn.knn_predict_proba, knn.fit, logreg.fit):
        assert all(p.default is inspect.Parameter.empty for name, p in inspect.signature(fn).parameters.items()
                   if name in ("k", "temperature", "C", "max_iter", "settings")), fn


def test_unions_and_nested_locations_point_at_the_key_a_user_writes():
    from retinabench.settings.errors import locate
    assert locate(Config, ("knn", "k", "constrained-int"))[0] == ["knn", "k"]
    assert locate(Config, ("sweep", "encoders", "vit", "lr_encoder", 0))[0] == ["sweep", "encoders", "vit",
                                                                               "lr_encoder[0]"]
    path, fields = locate(Config, ("reliability", "attributes", 1, "cutt"))
    assert path == ["reliability", "attributes[1]", "cutt"] and "cut" in fields
    assert typing.get_origin(Config.model_fields["protocols"].annotation) is list

"""reliability.protocol_sensitivity in the plan: off by default (no job); when enabled, the table and its figure are
targets, the other probe embedding / input size is extracted only where it cannot be derived, and the job's code
hash covers the analysis modules."""
from pathlib import Path
from types import SimpleNamespace

import yaml

from retinabench.plan import WorkflowPlan
from retinabench.plan.code import rule_code_files

REPO = Path(__file__).resolve().parents[2]


def config(sensitivity=None, **overrides):
    c = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    c["registries"] = {k: str(REPO / v) for k, v in c["registries"].items()}
    if sensitivity is not None:
        c["reliability"]["protocol_sensitivity"] = {**c["reliability"]["protocol_sensitivity"], **sensitivity}
    c.update(overrides)
    return c


def test_off_by_default_no_job_in_the_targets():
    p = WorkflowPlan(config())
    sens = p.reliability.sensitivity
    assert not sens.on and sens.targets() == []
    assert not [t for t in p.all_targets() if "protocol_sensitivity" in t]


def test_enabled_plans_the_table_and_figure_and_derives_projected_l2():
    p = WorkflowPlan(config({"enabled": True}))
    sens = p.reliability.sensitivity
    table, figure = sens.targets()
    assert table.endswith("reliability/protocol_sensitivity.parquet") and figure.endswith("figures/protocol_sensitivity")
    assert {table, figure} <= set(p.all_targets())
    src = sens.feature_sources()
    assert set(src) == {"logreg.variant", "features.probe_embedding", "input_size"}
    eff = "efficientnet_lite0_in1k"
    assert src["logreg.variant"][eff] == {"ours": "base", "focus": "base"}
    assert src["features.probe_embedding"][eff] == {"pre_projection": "base", "projected_l2": "derive"}
    assert src["input_size"][eff]["native"] == "base" and "native input size is 224" in src["input_size"][eff]["224"]
    assert sens.extracted() == {}   # everything derivable: no extra feature job
    assert set(sens.inputs()["predictions"]) == set(p.prediction_files().values())


def test_dual_encoders_and_other_input_sizes_are_extracted():
    clip, siglip = "clip_vitl14_openai", "siglip_so400m_patch14_384"
    p = WorkflowPlan(config({"enabled": True}, encoders=[clip, siglip], input_size=224,
                            features={**config()["features"], "probe_embedding": "projected_l2"}))
    sens = p.reliability.sensitivity
    src = sens.feature_sources()
    assert src["features.probe_embedding"][clip] == {"pre_projection": "extract", "projected_l2": "base"}
    assert src["input_size"][siglip] == {"native": "extract", "224": "base"}
    extracted = sens.extracted()
    assert f"probe_embedding-pre_projection/{siglip}/phantom" in extracted
    assert f"input_size-native/{siglip}/phantom" in extracted
    wc = SimpleNamespace(variant="input_size-native", encoder=siglip, dataset="phantom")
    assert sens.feature_entry(wc)["input_size"] == 384
    assert sens.feature_settings(wc)["probe_embedding"] == "projected_l2"
    wc = SimpleNamespace(variant="probe_embedding-pre_projection", encoder=clip, dataset="phantom")
    assert sens.feature_entry(wc)["input_size"] == 224
    assert sens.feature_settings(wc)["probe_embedding"] == "pre_projection"
    import re
    assert all(re.fullmatch(sens.variant_constraint(), v) for v in ("input_size-native",
                                                                    "probe_embedding-pre_projection"))
    assert not re.fullmatch(sens.variant_constraint(), "input_size-224")


def test_configured_values_follow_the_config():
    focus = yaml.safe_load((REPO / "config" / "focus.yaml").read_text())
    assert focus["reliability"]["protocol_sensitivity"]["enabled"] is True
    tvhl = yaml.safe_load((REPO / "config" / "tvhl.yaml").read_text())
    assert tvhl["reliability"]["protocol_sensitivity"]["enabled"] is True
    c = config({"enabled": True})
    c["reliability"]["bootstrap"] = {**c["reliability"]["bootstrap"], "summary": "one_stage"}
    got = WorkflowPlan(c).reliability.sensitivity.configured()
    assert got["reliability.bootstrap.summary"] == "one_stage" and got["input_size"] == "native"


def test_the_code_hash_covers_the_analysis_and_figure_modules():
    names = {f.name for f in rule_code_files("protocol_sensitivity")}
    assert {"sensitivity.py", "sensitivity_run.py", "paired.py"} <= names
    assert "protocol_sensitivity.py" in {f.name for f in rule_code_files("protocol_sensitivity_figure")}
    assert "extract.py" in {f.name for f in rule_code_files("protocol_sensitivity_features")}

"""Plan of FOCUS's tables and figures: config/focus.yaml plans every one; the default config plans what its inputs
allow and records the rest as skipped with the reason."""
from pathlib import Path


from retinabench.plan import WorkflowPlan
from retinabench.plan.focus import FIGURES, TABLES
from tests.conftest import shipped_config

REPO = Path(__file__).resolve().parents[2]


def test_focus_config_plans_every_focus_table_and_figure():
    p = WorkflowPlan(shipped_config("focus"))
    foc = p.reliability.focus
    assert foc.table_names() == list(TABLES) and foc.figure_names() == list(FIGURES)
    targets = set(p.reliability.targets())
    for t in TABLES:
        assert {f"{p.R}/reliability/focus/{t}.csv", f"{p.R}/reliability/focus/{t}.tex"} <= targets
    for f in FIGURES:
        assert {f"{p.R}/figures/focus/{f}.png", f"{p.R}/figures/focus/{f}.pdf"} <= targets
    assert foc.lora_comparisons() == [p.lora.delta_outputs()["comparisons"]]
    assert not [r for r in p.reliability.skipped() if r["output"].startswith("focus_")]
    # the encoders' groups come from the registry: FOCUS's six model types are all present
    from retinabench.reliability.focus_tables import model_groups
    types = set(model_groups(foc.encoders())["model_type"])
    assert {"general VM", "ophthalmic VM", "general VLM", "ophthalmic VLM", "general MLLM", "medical MLLM"} <= types


def test_default_config_skips_what_it_cannot_produce_with_the_reason():
    p = WorkflowPlan(shipped_config())
    foc = p.reliability.focus
    skipped = {r["output"]: r["reason"] for r in p.reliability.skipped() if r["output"].startswith("focus_")}
    planned = set(foc.table_names()) | set(foc.figure_names())
    assert "table3" in planned and "spiders" in planned
    assert "focus_table10" in skipped and "lora" in skipped["focus_table10"].lower()
    assert set(skipped) == {f"focus_{n}" for n in [*TABLES, *FIGURES] if n not in planned}
    for name in planned:
        assert name in TABLES or any(name in t for t in p.reliability.targets())

"""The stage registry: one stage per rule name, duplicates refused, every rule of the workflow has its stage."""
import re
from pathlib import Path

import pytest

from retinabench.analysis.context import FAMILIES
from retinabench.pipeline import STAGES
from retinabench.pipeline.stages import StageRegistry

REPO = Path(__file__).resolve().parents[2]


def test_a_second_stage_for_the_same_rule_is_refused_naming_both():
    reg = StageRegistry()
    reg._loaded = True

    @reg.register("frozen")
    def first(job):
        pass

    with pytest.raises(ValueError, match=r"'frozen' is registered twice: .*first and .*second"):
        @reg.register("frozen")
        def second(job):
            pass
    reg.register("frozen")(first)  # the same function again (a re-imported module) is not a duplicate
    with pytest.raises(KeyError, match="no stage for rule 'nope'; known: \\['frozen'\\]"):
        reg.get("nope")


def test_every_rule_of_the_workflow_has_a_stage_and_every_stage_a_rule():
    names = set()
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        names |= set(re.findall(r"^\s*rule (\w+):", text, re.M))
        names |= set(re.findall(r"^\s*use rule \w+ as (\w+)", text, re.M))
    names |= {f.rule for f in FAMILIES.values()}  # analysis.smk declares these in a loop
    assert names - set(STAGES.names()) == set(), "rules without a stage"
    assert set(STAGES.names()) - names == set(), "stages without a rule"

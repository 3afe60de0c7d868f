"""The planner's memoised module closure (retinabench.plan.code, each module parsed once per process) gives the same
files as retinabench.hashing.module_closure, so every rule's code hash is unchanged by the memo."""
from retinabench import hashing
from retinabench.plan import code


def test_memoised_closure_equals_the_reference_for_every_stage():
    sources = code.stage_sources()
    assert len(sources) > 30
    for rule, (_, modules) in sources.items():
        assert code.module_closure(*sorted(modules)) == hashing.module_closure(*sorted(modules)), rule
    # a registry module stays out; an adapter added explicitly comes in
    got = code.module_closure("retinabench.data.adapters", "retinabench.data.adapters.phantom")
    assert got == hashing.module_closure("retinabench.data.adapters", "retinabench.data.adapters.phantom")
    assert not any(p.name == "__init__.py" and p.parent.name == "adapters" for p in got)
    assert any(p.name == "phantom.py" and p.parent.name == "adapters" for p in got)

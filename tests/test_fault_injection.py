"""Issue 23, "Nothing changes a result silently": each fault the issue lists, reproduced on generated fixtures (no
downloads), with the behaviour that replaces it."""
import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


# --- fault 5: the HTML report can be scripted by data ---
# The end-to-end test (the workflow's own report, built from a task registry whose description is a script, opened
# in headless Chromium): tests/workflow/test_report.py::test_fault5_registry_text_cannot_script_the_report.
SCRIPT = "</script><script>document.title='pwned'</script>"
TASK = {"dataset": "phantom", "label": "dr3", "classes": ["none", "npdr", "pdr"], "modality": "cfp",
        "ordinal": True}


def _snakemake_report(params: dict) -> str:
    """Snakemake's report template (the one ``snakemake --report`` renders, rendered the way its html reporter does)
    with one result whose job parameters are ``params``, formatted as Snakemake formats them."""
    from jinja2 import Environment, PackageLoader
    from snakemake import logging as smk_logging
    from snakemake.report.html_reporter import data
    from snakemake.report.html_reporter.common import get_resource_as_string
    env = Environment(loader=PackageLoader("snakemake", "report/html_reporter/template"), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters["get_resource_as_string"] = get_resource_as_string
    shown = smk_logging.format_dict(params).replace("\n", r"\n").replace('"', r"\"")  # FileRecord.params
    results = {"results/analysis/baselines.csv": {"name": "baselines.csv", "caption": "<p>Baselines</p>",
                                                   "labels": {"figure": "baselines"}, "mime_type": "text/csv",
                                                   "job_properties": {"rule": "baselines", "params": shown}}}
    return env.get_template("index.html.jinja2").render(
        results=json.dumps(results), categories=json.dumps({"1. Ranking": {"Tables": list(results)}}),
        rulegraph="{}", rules="{}", workflow_desc=json.dumps("<p>retinabench</p>"), runtimes="[]", timeline="[]",
        packages=data.get_packages(), metadata="{}", pygments_css="", custom_stylesheet=None, logo="", now="")


def _inline(html: str, element: str):
    from retinabench.report_build import inline_data_blocks
    start, end = next((s, e) for el, s, e in inline_data_blocks(html) if el == element)
    return html[start:end]


def test_fault5_a_registry_description_cannot_end_the_reports_inline_data(tmp_path):
    from retinabench.registry import load_registry
    from retinabench.report_build import escape_inline_data, unescaped_inline_data
    registry = tmp_path / "tasks.yaml"
    registry.write_text(yaml.safe_dump({"phantom_cfp_dr3": {**TASK, "description": SCRIPT, "note": SCRIPT}}))
    tasks = load_registry(registry, "tasks")  # free text is data: the registry accepts it as it is
    raw = _snakemake_report({"tasks": tasks, "regimes": ["u-u"]})  # what the baselines rule carries
    # the fault: Snakemake's JSON keeps "</script>" as it is, so the results script ends inside a string
    assert "results" in unescaped_inline_data(raw)
    assert raw.index(SCRIPT) < raw.index("var categories")
    safe = escape_inline_data(raw)
    assert unescaped_inline_data(safe) == [] and SCRIPT not in safe and "</script><script>" not in _inline(safe,
                                                                                                             "results")
    # the same JavaScript value: the reader sees the description as it was written
    assert json.loads(_inline(safe, "results")) == json.loads(_inline(raw, "results"))
    assert SCRIPT in json.loads(_inline(safe, "results"))["results/analysis/baselines.csv"]["job_properties"]["params"]
    # nothing else changed: with the escapes undone both are the same text (the template's own HTML included)
    assert _unescaped(safe) == _unescaped(raw)


def _unescaped(html: str) -> str:
    from retinabench.report_build import SCRIPT_ESCAPES
    for ch, escape in SCRIPT_ESCAPES.items():
        html = html.replace(escape, ch)
    return html


@pytest.mark.parametrize("kind, bad", [("tasks", SCRIPT), ("tasks", "dr 3"), ("datasets", "site_"),
                                       ("encoders", "-vit"), ("tasks", "a/b")])
def test_fault5_registry_ids_outside_the_safe_set_are_refused(tmp_path, kind, bad):
    from retinabench.registry import RegistryError, load_registry
    entry = {"tasks": TASK, "datasets": {}, "encoders": {}}[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump({bad: entry}))
    with pytest.raises(RegistryError) as err:
        load_registry(path, kind)
    msg = str(err.value)  # the file, the id and the rule, before the entry itself is looked at
    assert str(path) in msg and repr(bad) in msg and "^[A-Za-z0-9]([A-Za-z0-9_.+-]*[A-Za-z0-9])?$" in msg, msg
    assert "is not a valid id" in msg and "rename it" in msg


def test_fault5_prompt_set_and_variant_ids_are_refused_and_every_shipped_registry_passes(tmp_path):
    from retinabench.prompts import PromptError, load_prompts
    from retinabench.registry import RegistryError, load_registry
    prompts = yaml.safe_load((REPO / "config/prompts.yaml").read_text())
    prompts["zeroshot"]["<b>set"] = prompts["zeroshot"][prompts["defaults"]["zeroshot"]]
    (tmp_path / "prompts.yaml").write_text(yaml.safe_dump(prompts))
    with pytest.raises(PromptError, match=r"key zeroshot: '<b>set' is not a valid id"):
        load_prompts(tmp_path / "prompts.yaml")
    encoders = yaml.safe_load((REPO / "config/demo/encoders.yaml").read_text())
    name = next(iter(encoders))
    encoders[name]["variants"] = {"cls pooled": {"pooling": "cls"}}
    (tmp_path / "encoders.yaml").write_text(yaml.safe_dump(encoders))
    with pytest.raises(RegistryError, match=rf"entry '{name}', key variants: 'cls pooled' is not a valid id"):
        load_registry(tmp_path / "encoders.yaml", "encoders")
    shipped = {"datasets": ["config/datasets.yaml", "config/scale/datasets.yaml"],
               "tasks": ["config/tasks.yaml", "config/scale/tasks.yaml"],
               "encoders": ["config/encoders.yaml", "config/demo/encoders.yaml", "config/scale/encoders.yaml"]}
    assert sorted(str(p.relative_to(REPO)) for p in (REPO / "config").rglob("*.yaml")
                  if p.stem in shipped) == sorted(f for files in shipped.values() for f in files)
    for kind, files in shipped.items():
        for f in files:
            assert load_registry(REPO / f, kind), f
    assert load_prompts(REPO / "config/prompts.yaml")

"""retinabench.report_build: the report's inline data escaped by parsing (no string passes for the end of a block),
and captions built with docutils settings that refuse raw HTML (a small Snakemake workflow of its own)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retinabench.report_build import (DATA_SCRIPTS, ReportBuildError, build_report, escape_inline_data,
                                      unescaped_inline_data)

# What a string would need to contain to pass for the end of the results block and the start of the next one.
FAKE_END = ';\n    </script>\n\n    <script id="categories">\n    var categories = {"forged": 1};\n    </script>'


def template(values: dict) -> str:
    """A page laid out like Snakemake's report template: each data script with its JSON value (json.dumps)."""
    blocks = "".join(f'\n    <script id="{el}">\n    var {var} = {json.dumps(values.get(var, {}))};\n    </script>\n'
                     for el, var in DATA_SCRIPTS)
    return f"<html><head><script>var lib = '<b>';</script></head><body>{blocks}<script>app()</script></body></html>"


def blocks(html: str) -> dict:
    from retinabench.report_build import inline_data_blocks
    return {el: json.loads(html[s:e]) for el, s, e in inline_data_blocks(html)}


def test_a_string_that_looks_like_the_end_of_a_block_stays_inside_it():
    values = {"results": {"a.png": {"caption": "<p>x</p>", "params": FAKE_END + "\u2028&"}},
              "categories": {"real": {"s": ["a.png"]}}}
    html = template(values)
    assert blocks(html)["categories"] == {"real": {"s": ["a.png"]}}  # found by decoding, not by searching
    safe = escape_inline_data(html)
    assert blocks(safe) == blocks(html)  # the same values
    assert unescaped_inline_data(html) == ["results"] and unescaped_inline_data(safe) == []
    assert "</script>\n\n    <script id=\"categories\">\n    var categories = {\"forged\"" not in safe
    assert "\\u2028\\u0026" in safe and "\u2028" not in safe
    assert safe.startswith("<html><head><script>var lib = '<b>';</script>")  # outside the data: as it was


def test_a_report_without_a_data_block_where_the_template_has_it_is_an_error():
    html = template({}).replace('<script id="rules">', '<script id="rule_list">')
    with pytest.raises(ReportBuildError, match=r'no <script id="rules"> with `var rules = \.\.\.`'):
        escape_inline_data(html)
    with pytest.raises(ReportBuildError, match="not JSON"):
        escape_inline_data(template({}).replace("var results = {}", "var results = {oops}"))


def test_only_an_html_report_is_built(tmp_path):
    with pytest.raises(ReportBuildError, match="one .html file"):
        build_report(tmp_path / "report.zip")


SNAKEFILE = '''
rule all:
    input: "out.txt"

rule make:
    output: report("out.txt", caption="caption.rst", category="Results")
    params: note=config["note"]
    shell: "echo done > {output}"
'''


@pytest.mark.slow
def test_a_caption_value_cannot_add_raw_html(tmp_path, capfd):
    """A caption interpolating a value with a raw-HTML directive: a bare `snakemake --report` puts the HTML in the
    report; `retinabench report` stops on it."""
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "caption.rst").write_text("Made with {{ snakemake.params.note }}.\n")
    img = "<img src=x onerror=\"document.title='pwned'\">"
    configs = {"harmless": "care & <attention>", "evil": f"x\n\n.. raw:: html\n\n   {img}\n"}
    for name, note in configs.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({"note": note}))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    run = [sys.executable, "-m", "snakemake", "--cores", "1", "--configfile"]
    subprocess.run([*run, "harmless.yaml"], cwd=tmp_path, env=env, capture_output=True, check=True)
    report = build_report(tmp_path / "report.html", ["--cores", "1", "--configfile", "harmless.yaml"],
                          workdir=tmp_path)
    caption = blocks(report.read_text())["results"]["out.txt"]["caption"]
    assert "care &amp; &lt;attention&gt;" in caption  # escaped for HTML by docutils: shown as written
    assert unescaped_inline_data(report.read_text()) == []
    # the fault, with docutils' defaults: the value's raw HTML goes into the caption as HTML
    subprocess.run([*run, "evil.yaml", "--report", "bare.html"], cwd=tmp_path, env=env, capture_output=True,
                   check=True)
    assert img in blocks((tmp_path / "bare.html").read_text())["results"]["out.txt"]["caption"]
    capfd.readouterr()
    with pytest.raises(ReportBuildError, match="failed"):
        build_report(tmp_path / "safe.html", ["--cores", "1", "--configfile", "evil.yaml"], workdir=tmp_path)
    assert '"raw" directive disabled' in capfd.readouterr().err and not (tmp_path / "safe.html").exists()

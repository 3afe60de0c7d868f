"""Build the Snakemake HTML report so that no string in it can run as script: ``retinabench report FILE``.

Registry text reaches the report in two ways, and each is escaped for its context here:

* **Inline data.** Snakemake's report template (``snakemake/report/html_reporter/template/index.html.jinja2``)
  embeds its data as ``var NAME = <JSON>;`` inside ``<script>`` elements, the JSON from ``json.dumps``, which leaves
  ``<`` and ``>`` as they are. Every job parameter of a report output is in it (the baselines rule carries the task
  registry entries), so a task description ``</script><script>…</script>`` ends the data script early and the rest
  runs as script. :func:`escape_inline_data` rewrites each data block with ``<``, ``>``, ``&``, U+2028 and U+2029
  as ``\\uXXXX`` escapes (the same JavaScript value; nothing in it can close the element). The blocks are found by
  parsing, not by searching for their end: each block's JSON value is decoded from its start, so no text inside a
  string can pass for the end of the block. A template that no longer has a block where it is expected is an error.
* **Captions** (``workflow/report/*.rst``): Jinja text rendered by docutils, which escapes text for HTML. Registry
  ids are restricted to a safe set (``schemas_json/id.schema.json``), and the report is built with docutils
  settings (:data:`DOCUTILS_SETTINGS`) that refuse raw HTML and file inclusion and stop at the first warning, so no
  interpolated value can add markup to a caption without the build failing on it.

Neither can be asked of ``snakemake --report`` (it always renders its built-in template, and docutils with its
defaults), so this wraps it: Snakemake writes the report into a temporary folder, the escaped report is written
atomically to FILE. ``retinabench.report_check`` refuses a report whose inline data is not escaped.

    retinabench report results/report.html --profile profiles/local [other snakemake arguments]
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

# The data scripts of Snakemake's report template, in the template's order: (element id, variable name).
DATA_SCRIPTS = (("workflow-desc", "workflow_desc"), ("results", "results"), ("categories", "categories"),
                ("rulegraph", "rulegraph_spec"), ("runtimes", "runtimes_spec"), ("timeline", "timeline_spec"),
                ("rules", "rules"), ("packages", "packages"), ("metadata", "metadata"))
# Characters that let text inside a <script> element end it or open a comment ("</script>", "<!--"), and the
# two line separators older JavaScript does not allow in strings. Outside JSON strings none of them can occur.
SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
# docutils settings for the captions and the workflow description (read through DOCUTILSCONFIG): no raw HTML, no
# file inclusion, and a caption whose markup draws a warning stops the report instead of showing a system message.
DOCUTILS_SETTINGS = {"raw_enabled": "no", "file_insertion_enabled": "no", "halt_level": "2"}


class ReportBuildError(RuntimeError):
    """The report could not be built, or its inline data could not be found where Snakemake's template puts it."""


_CLOSING = re.compile(r"\s*;\s*</script>")


def inline_data_blocks(html: str):
    """(element id, start, end) of the JSON value of every data script, in order (see the module docstring)."""
    decoder = json.JSONDecoder()
    pos = 0
    for element, var in DATA_SCRIPTS:
        opening = re.compile(rf'<script id="{re.escape(element)}">\s*var {re.escape(var)} = ')
        m = opening.search(html, pos)
        if not m:
            raise ReportBuildError(f"no <script id=\"{element}\"> with `var {var} = ...` after offset {pos}: "
                                   "Snakemake's report template has changed (retinabench.report_build.DATA_SCRIPTS)")
        try:
            _, end = decoder.raw_decode(html, m.end())
        except json.JSONDecodeError as err:
            raise ReportBuildError(f"the data of <script id=\"{element}\"> is not JSON: {err}") from None
        if not _CLOSING.match(html, end):
            raise ReportBuildError(f"<script id=\"{element}\"> does not end after its JSON value (offset {end})")
        yield element, m.end(), end
        pos = end


def escape_inline_data(html: str) -> str:
    """``html`` with every character of :data:`SCRIPT_ESCAPES` in the report's inline data escaped."""
    pattern = re.compile("|".join(map(re.escape, SCRIPT_ESCAPES)))
    out, last = [], 0
    for _, start, end in inline_data_blocks(html):
        out += [html[last:start], pattern.sub(lambda m: SCRIPT_ESCAPES[m.group()], html[start:end])]
        last = end
    return "".join(out + [html[last:]])


def unescaped_inline_data(html: str) -> list[str]:
    """Ids of the data scripts that hold a character of :data:`SCRIPT_ESCAPES` as it is (empty: the report is safe
    to open)."""
    return [element for element, start, end in inline_data_blocks(html)
            if any(ch in html[start:end] for ch in SCRIPT_ESCAPES)]


def build_report(report: str | os.PathLike, snakemake_args: Sequence[str] = (), *,
                 workdir: str | os.PathLike | None = None) -> Path:
    """Run ``snakemake --report`` (with ``snakemake_args``, in ``workdir``, default the current folder) into a
    temporary folder, escape the report's inline data and write it to ``report``, atomically. Returns its path."""
    from retinabench.pipeline.job import write_artifact
    report = Path(report)
    if report.suffix != ".html":
        raise ReportBuildError(f"{report}: the report must be one .html file (Snakemake's zip reports are not "
                               "escaped here)")
    with tempfile.TemporaryDirectory(prefix="retinabench-report-") as tmp:
        conf = Path(tmp) / "docutils.conf"
        conf.write_text("[general]\n" + "".join(f"{k}: {v}\n" for k, v in DOCUTILS_SETTINGS.items()))
        raw = Path(tmp) / "report.html"
        cmd = [sys.executable, "-m", "snakemake", *snakemake_args, "--report", str(raw)]
        proc = subprocess.run(cmd, cwd=workdir, env=dict(os.environ, DOCUTILSCONFIG=str(conf)))  # log: console
        if proc.returncode != 0 or not raw.is_file():
            raise ReportBuildError(f"{' '.join(cmd)} failed ({proc.returncode}); its log is above")
        write_artifact(escape_inline_data(raw.read_text()), report)
    return report

"""docs/reproduction.md is checked against the code: every output its figure and table lists name is planned by
the study's config (no row without an output), every config key it names exists in the merged config, and
every test it cites as pinning a convention exists."""
import re
from pathlib import Path

import pytest

from retinabench.plan import WorkflowPlan
from tests.conftest import shipped_config

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "reproduction.md").read_text()


def _section(study: str, title: str) -> str:
    start = DOC.index(f"\n### {title}\n", DOC.index(f"\n## {study}\n"))
    end = DOC.find("\n### ", start + 5)
    return DOC[start:end if end > 0 else None]


def _rows(text: str) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    return rows[1:]  # without the header


@pytest.mark.parametrize("study,config_name,n_rows", [("OcularBench", "ocularbench", 16), ("FOCUS", "focus", 13)])
def test_every_figure_and_table_row_names_planned_outputs(study, config_name, n_rows):
    config = shipped_config(config_name)
    results = config["results"]
    planned = {str(Path(t).relative_to(results)) for t in WorkflowPlan(config).all_targets()
               if str(t).startswith(results)}
    section = "Figures and tables" if study == "OcularBench" else "Tables and figures"
    rows = _rows(_section(study, section))
    assert len(rows) == n_rows
    for paper, _, _, rule, output in rows:
        files = re.findall(r"`([^`]+\.(?:png|csv|parquet))`", output)
        assert files, f"{paper}: the row names no output"
        assert rule.strip("`"), f"{paper}: no rule"
        for f in files:
            assert f in planned, f"{paper}: {f} is not planned by config/{config_name}.yaml"


def _exists(config: dict, key: str) -> bool:
    node = config
    for part in key.split("."):
        if part == "*":
            return isinstance(node, dict)
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize("study", ["ocularbench", "focus"])
def test_named_config_keys_exist_and_cited_tests_exist(study):
    config = shipped_config(study)
    text = DOC[DOC.index("\n## OcularBench\n"):DOC.index("\n## FOCUS\n")] if study == "ocularbench" else \
        DOC[DOC.index("\n## FOCUS\n"):]
    keys = set()
    for row in _rows(text):
        for cell in row[1:3]:
            keys.update(k for k in re.findall(r"`([a-z_]+(?:\.[a-z_*]+)+)`", cell)
                        if k.split(".")[0] in config and not k.endswith((".py", ".csv", ".png")))
    assert len(keys) >= 10
    missing = sorted(k for k in keys if not _exists(config, k))
    assert not missing, f"docs/reproduction.md names config keys that do not exist: {missing}"
    for path in set(re.findall(r"`(tests/[\w/]+\.py)`", text)):
        assert (REPO / path).is_file(), path

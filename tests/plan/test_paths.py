"""One table of paths (retinabench.plan.paths): the rule files hold no path of their own, every log is named by
its rule, and a path reads back into its wildcards."""
import re
from pathlib import Path

import pytest

from retinabench.plan.paths import LOGS, PATHS, Paths, wildcards

REPO = Path(__file__).resolve().parents[2]
WORKFLOW_FILES = sorted((REPO / "workflow" / "rules").glob("*.smk")) + [REPO / "Snakefile"]
F_STRING = re.compile(r"""\bf["']""")


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_workflow_files_build_no_path(path):
    """No f-string at all (a path is the plan's: P.path / P.log / a sub-plan method), no results-folder prefix."""
    code = [(i, line) for i, line in enumerate(path.read_text().splitlines(), 1) if not line.lstrip().startswith("#")]
    bad = [f"{path.name}:{i}: {line.strip()}" for i, line in code if F_STRING.search(line) or "{R}" in line]
    assert not bad, "\n".join(bad)


def test_every_log_belongs_to_a_rule_and_every_rule_logs_through_the_table():
    text = "\n".join(p.read_text() for p in WORKFLOW_FILES)
    rules = set(re.findall(r"^\s*rule (\w+):", text, re.M)) | {"analysis"}  # analysis: the families' loop
    assert set(LOGS) <= rules, sorted(set(LOGS) - rules)
    logs = re.findall(r"^\s*log:\n\s*(.+)$", text, re.M)
    assert logs and all(line.startswith("P.log(") for line in logs), logs


def test_a_path_fills_what_is_given_and_reads_back():
    paths = Paths("res", cache_tag="64_squash")
    assert paths.path("features") == "res/features/{encoder}/{dataset}.parquet"
    assert paths.path("image_cache", dataset="d") == "res/data/d/images_64_squash.npy"
    concrete = paths.path("predictions", source="frozen", encoder="e1", name="t1")
    assert paths.values("predictions", concrete) == {"source": "frozen", "encoder": "e1", "name": "t1"}
    assert paths.values("features", concrete) is None
    with pytest.raises(KeyError, match="no wildcard"):
        paths.path("features", task="t")
    with pytest.raises(KeyError, match="known"):
        paths.path("feature")


def test_patterns_are_unique_and_relative():
    assert len(set(PATHS.values())) == len(PATHS)
    assert not [p for p in PATHS.values() if p.startswith("/") or "//" in p]
    assert all(isinstance(w, str) for p in PATHS.values() for w in wildcards(p))

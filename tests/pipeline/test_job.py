"""Stage helpers: the exclusions summary printed by manifest jobs, and no leftovers after a failed stage."""
import json

import pandas as pd
import pytest

from retinabench.data.reports import exclusion_summary
from retinabench.pipeline import STAGES, Job, run_stage


def test_exclusion_summary_counts_by_scope_and_reason_folding_per_file_details():
    rows = [("label:dr3", "DR grade '-' (unknown)")] * 5 + [("label:dr3", "DR grade empty")] * 2
    rows += [("image", f"image file {k:04d}_OD_f_1.jpg not found under EYE FUNDUS/") for k in range(30)]
    excl = pd.DataFrame(rows, columns=["scope", "reason"]).assign(dataset="d", source="s", image_id="i")
    out = exclusion_summary(excl, limit=0)
    assert out.values.tolist() == [["image", "image file … not found under EYE FUNDUS/", 30],
                                   ["label:dr3", "DR grade '-' (unknown)", 5], ["label:dr3", "DR grade empty", 2]]
    assert exclusion_summary(excl.iloc[:0]).empty


def test_a_failing_stage_removes_its_outputs_sidecars_and_temp_files(tmp_path, monkeypatch):
    import subprocess
    import sys

    from retinabench.atomic import host_name, temp_path
    out = tmp_path / "t.parquet"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = f"{host_name()}.{int(gone.stdout)}.0123abcd.tmp"  # an earlier attempt's writer, killed on this host
    stale = [tmp_path / "t.parquet.prov.json", tmp_path / f"t.parquet.{killed}",
             tmp_path / f"t.parquet.prov.json.{killed}"]
    for p in stale:
        p.write_text(json.dumps({}))

    def failing(job):
        pd.DataFrame({"a": [1]}).to_parquet(temp_path(out))  # this job's own temporary file
        (tmp_path / "t.parquet.prov.json").write_text("{}")
        raise RuntimeError("boom")

    monkeypatch.setitem(STAGES.load()._stages, "failing", failing)
    with pytest.raises(RuntimeError, match="boom"):
        run_stage("failing", Job(rule="x", input={}, output={"table": str(out)}))
    assert sorted(p.name for p in tmp_path.iterdir()) == []

"""Every artifact is written atomically (a temporary name beside it, renamed: retinabench.atomic, through
retinabench.pipeline.job.write_artifact / retinabench.schemas.write_table or directly): no module writes a file
under its final name, apart from the few writes below that are not artifacts."""
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "retinabench"
WRITE = re.compile(r"\.to_csv\(|\.to_parquet\(|\.savefig\(|\.write_text\(|\.write_bytes\(|open\([^)]*[\"'][wa]b?[\"']"
                   r"|np\.savez?(_compressed)?\(|torch\.save\(|\.save\(|\.save_as\(")
# Writes that are not artifacts, by module, with why.
NOT_ARTIFACTS = {
    "compute/benchmark.py": "the worker's spec, in a temporary folder",
    "protocols/lora_launch.py": "the torchrun group's spec, in a temporary folder",
    "report_build.py": "docutils settings, in a temporary folder",
    "compute/memory.py": "/proc/self/clear_refs (resets the peak-memory counter)",
    "plan/run_lock.py": "the run lock, created exclusively (O_EXCL) and written once",
}
SCAFFOLDING = "testing/"  # fixtures and demo inputs written for tests, not results


def test_no_module_writes_a_file_under_its_final_name():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel in NOT_ARTIFACTS or rel.startswith(SCAFFOLDING) or rel in ("atomic.py",):
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            inside_atomic = "tmp" in line or (i and "atomic_path(" in lines[i - 1])
            if WRITE.search(line) and not inside_atomic:
                offenders.append(f"{rel}:{i + 1}: {line.strip()}")
    assert not offenders, "writes outside retinabench.atomic:\n" + "\n".join(offenders)
    missing = [m for m in NOT_ARTIFACTS if not (PACKAGE / m).is_file()]
    assert not missing, f"NOT_ARTIFACTS names modules that no longer exist: {missing}"


def test_a_figure_is_renamed_into_place(tmp_path, monkeypatch):
    """figures.style.save writes each file under a temporary name and renames it: a failing write leaves neither
    the final file nor a temporary one."""
    from retinabench.figures import style  # noqa: I001 (sets the Agg backend before pyplot)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    paths = style.save(fig, tmp_path / "f.png", check=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pdf", "f.png"] and len(paths) == 2

    def broken(self, fname, **kw):
        Path(fname).write_bytes(b"half")
        raise OSError("disk full")
    monkeypatch.setattr(type(fig), "savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        style.save(fig, tmp_path / "g.png", check=False)
    plt.close(fig)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pdf", "f.png"]


def test_an_analysis_table_is_renamed_into_place(tmp_path, monkeypatch):
    import pandas as pd

    from retinabench.analysis import families
    table = pd.DataFrame({"x": [0.123456789]})
    families._write_csv(table, str(tmp_path / "t.csv"))
    assert (tmp_path / "t.csv").read_text() == "x\n0.123457\n"  # the family tables' float format kept

    def broken(self, path, **kw):
        Path(path).write_text("x\n")
        raise OSError("disk full")
    monkeypatch.setattr(pd.DataFrame, "to_csv", broken)
    with pytest.raises(OSError, match="disk full"):
        families._write_csv(table, str(tmp_path / "u.csv"))
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]

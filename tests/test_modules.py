"""Package hygiene: every module imports on its own (no import cycles), modules stay small, metrics never import
stats (kernels flow metrics -> stats), the planner and settings are torch-free."""
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "retinabench"
# Modules over the limit: none (every module stays under MAX_LINES; split a module rather than list it here).
LONG_MODULES: set[str] = set()
MAX_LINES = 400


def modules() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if rel.name != "__main__":
            out.append(".".join(parts))
    return out


@pytest.mark.slow
def test_every_module_imports_on_its_own():
    """Each module is imported first, in a state where no retinabench module is loaded (a cycle fails then)."""
    script = (
        "import importlib, sys, traceback\n"
        f"names = {modules()!r}\n"
        "failed = []\n"
        "for name in names:\n"
        "    for m in [m for m in sys.modules if m == 'retinabench' or m.startswith('retinabench.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as err:\n"
        "        failed.append(f'{name}: {type(err).__name__}: {err}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(SRC), "PATH": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {k: n for k, n in long.items() if n > MAX_LINES and k not in LONG_MODULES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"


def test_metrics_do_not_import_stats():
    import re
    offenders = [str(p.relative_to(PACKAGE)) for p in (PACKAGE / "metrics").rglob("*.py")
                 if re.search(r"^\s*(from|import) retinabench\.stats", p.read_text(), re.M)]
    assert not offenders, f"metrics modules importing retinabench.stats: {offenders}"


def test_planner_and_settings_import_without_torch(tmp_path):
    poison = tmp_path / "torch"
    poison.mkdir()
    (poison / "__init__.py").write_text("raise ImportError('torch imported')\n")
    code = "import retinabench.settings, retinabench.pipeline, retinabench.analysis, retinabench.plan.selection"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": f"{tmp_path}:{SRC}", "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]

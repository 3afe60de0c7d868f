"""retinabench.plan is the one package that decides jobs and paths: torch-free, importing no stage script
(retinabench.pipeline) and no model code; protocols do not import it; the old planners are gone."""
import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import retinabench
from retinabench.hashing import module_imports

PACKAGE = Path(retinabench.__file__).resolve().parent
PLAN_MODULES = sorted(f"retinabench.plan.{p.stem}" for p in (PACKAGE / "plan").glob("*.py") if p.stem != "__init__")


def test_every_plan_module_imports_without_torch_pipeline_or_models():
    code = ("import sys\nimport retinabench.plan\n" + "".join(f"import {m}\n" for m in PLAN_MODULES)
            + "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', "
              "'retinabench.pipeline', 'retinabench.models'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout


def test_plan_names_no_stage_module_even_lazily():
    """Statically, lazy imports included: the stage scripts import the plan, never the reverse."""
    for path in sorted((PACKAGE / "plan").glob("*.py")):
        module = "retinabench.plan" if path.stem == "__init__" else f"retinabench.plan.{path.stem}"
        bad = sorted(m for m in module_imports(path, module) if m.startswith(("retinabench.pipeline",
                                                                               "retinabench.models")))
        assert not bad, f"{path.name} imports {bad}"


def test_protocols_do_not_import_the_plan():
    for path in sorted((PACKAGE / "protocols").rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        module = ".".join(("retinabench",) + rel.parts).removesuffix(".__init__")
        bad = sorted(m for m in module_imports(path, module) if m.startswith("retinabench.plan"))
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_the_old_planners_are_gone():
    for name in ("retinabench.workflow_plan", "retinabench.pipeline.plan", "retinabench.analysis.plan",
                 "retinabench.pipeline.registry", "retinabench.pipeline.run_lock"):
        assert importlib.util.find_spec(name) is None, f"{name} still exists"
    tree = ast.parse((PACKAGE / "protocols" / "interfaces.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert not defined & {"plan_jobs", "selected_entries", "job_resources", "InterfaceJob"}, defined

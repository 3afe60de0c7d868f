"""models/ owns all loading: loaders are registered by name (a second one under a name is refused), models/ never
imports protocols/, and the registries and the plan never import models/ (they read the lock file beside the
registries)."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
MODELS = SRC / "retinabench" / "models"


def _fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter on this checkout's sources; its stdout."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(SRC), "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def _loaded(prefix: str) -> str:
    return f"sorted(m for m in sys.modules if m == {prefix!r} or m.startswith({prefix + '.'!r}))"


def test_registries_and_plan_import_nothing_from_models():
    out = _fresh("import sys\nimport retinabench.registry, retinabench.plan.selection, retinabench.plan\n"
                 f"print({_loaded('retinabench.models')})")
    assert out == "[]", f"imported: {out}"


def _static_closure(modules: list[str], stop: str) -> set[str]:
    """Module names ``modules`` import, transitively, lazy imports included (as the rule code hashes see them);
    modules under ``stop`` are listed but not followed."""
    from retinabench.hashing import module_file, module_imports
    seen, todo = set(), list(modules)
    while todo:
        name = todo.pop()
        path = None if name in seen else module_file(name)
        if path is None:
            continue
        seen.add(name)
        if not name.startswith(stop):
            todo += module_imports(path, name)
    return seen


def test_registries_and_plan_name_no_models_module_even_lazily():
    """Statically, lazy imports included. The plan's path into protocols (plan.lora reads LoraSettings
    from protocols.lora, which may use models: protocols -> models is the allowed direction) is not followed."""
    reached = _static_closure(["retinabench.registry", "retinabench.plan.selection", "retinabench.plan"],
                              stop="retinabench.protocols")
    assert "retinabench.registry.lockfile" in reached
    assert not sorted(m for m in reached if m.startswith("retinabench.models")), reached


def test_every_loading_entry_point_registers_the_built_in_loaders():
    """A fresh process that loads an MLLM through models.mllm alone (not models.sources) reaches the origin's loader
    ('weight file ... not found'), not an empty registry ('unknown weights origin 'path'': the demo's failure); a
    registry used before models.sources registered the built-ins refuses, naming the fix."""
    out = _fresh("from retinabench.models import _registry\n"
                 "try:\n    _registry.ORIGINS.names()\nexcept RuntimeError as e:\n    print('refused:', e)\n"
                 "from retinabench.models.mllm import load_mllm\n"
                 "try:\n    load_mllm({'name': 'm', 'source': 'transformers', 'interfaces': ['mllm'],\n"
                 "               'weights_path': '/nonexistent/m'})\nexcept Exception as e:\n    print(e)\n")
    refused, loaded = out.splitlines()
    assert refused.startswith("refused:") and "retinabench.models.sources" in refused
    assert "/nonexistent/m" in loaded and "unknown" not in loaded, loaded


def test_models_do_not_import_protocols():
    modules = sorted(f"retinabench.models.{p.stem}" for p in MODELS.glob("*.py") if p.stem != "__init__")
    out = _fresh("import importlib, sys\n"
                 f"for m in {modules!r}:\n    importlib.import_module(m)\n"
                 "from retinabench.models.sources import SOURCES\nSOURCES.names()\n"  # the loader modules too
                 f"print({_loaded('retinabench.protocols')})")
    assert out == "[]", f"imported: {out}"
    lazy = {}
    for path in MODELS.glob("*.py"):  # imports inside functions, which importing a module does not run
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("retinabench.protocols"):
                lazy.setdefault(path.name, []).append(node.module)
    assert not lazy, lazy


def test_every_source_and_origin_has_one_loader():
    from retinabench.models.sources import ORIGINS, SOURCES
    assert SOURCES.names() == ["open_clip", "timm", "transformers"]
    assert ORIGINS.names() == ["hub", "manual", "none", "package", "path", "url"]
    dual = [n for n in SOURCES.names() if SOURCES.get(n, "test").dual_encoder is not None]
    assert dual == ["open_clip", "transformers"]


def test_a_second_loader_under_a_registered_name_is_refused():
    from retinabench.models.sources import ORIGINS, SOURCES, SourceLoader, register_origin, register_source
    timm = SOURCES.get("timm", "test")
    with pytest.raises(ValueError, match="source 'timm' is already registered"):
        register_source(SourceLoader("timm", timm.architecture, timm.pretrained))
    assert SOURCES.get("timm", "test") is timm
    hub = ORIGINS.get("hub", "test")
    with pytest.raises(ValueError, match="weights origin 'hub' is already registered"):
        register_origin("hub", lambda entry: ({}, {}))
    assert ORIGINS.get("hub", "test") is hub


def test_an_unknown_source_is_an_error_naming_the_entry():
    from retinabench.models import WeightsError, build_architecture
    with pytest.raises(WeightsError, match="encoder 'x': unknown source 'keras'"):
        build_architecture({"name": "x", "source": "keras"})

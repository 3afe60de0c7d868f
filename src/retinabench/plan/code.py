"""A rule's code hash, derived from what its stage imports (a Snakemake param: editing that code reruns exactly
those jobs).

The stage of a rule is found statically (``@stage("rule")`` in a retinabench.pipeline module, no import needed);
its code is that pipeline module's file, the modules it imports at module level, the modules its stage
function imports (lazy imports included; other stages' lazy imports in the same module do not count) and, transitively, every retinabench module those import. Package registries that list
every member (``retinabench.data.adapters``) are left out, so a manifest job adds only its own dataset's adapter:
adding or editing another adapter reruns nothing.
"""
from __future__ import annotations

import ast
import hashlib
from functools import cache
from pathlib import Path

from retinabench import hashing
from retinabench.hashing import import_names, module_file, module_imports

PACKAGE = Path(__file__).resolve().parents[1]
PIPELINE = PACKAGE / "pipeline"


@cache
def stage_sources() -> dict[str, tuple[str, frozenset[str]]]:
    """{rule: (pipeline module, retinabench modules its stage imports)} for every ``@stage(...)``-registered rule.
    Rules registered in a loop (the analysis families) get their module's full import set."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for path in sorted(PIPELINE.glob("*.py")):
        module = f"retinabench.pipeline.{path.stem}"
        tree = ast.parse(path.read_text(), filename=str(path))
        top = set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                top |= import_names(node, module, False)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "stage":
                    for arg in deco.args:
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                            out[arg.value] = (module, frozenset(top | import_names(node, module, False)))
    return out


def _hash(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in sorted(set(files)):
        h.update(str(f.relative_to(PACKAGE)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


@cache
def _imports(module: str) -> tuple[Path | None, frozenset[str]]:
    """A module's source file and the module names it imports, parsed once per process (the Snakefile asks for
    ~50 rules' code, whose closures share most modules)."""
    path = module_file(module)
    return path, frozenset(module_imports(path, module)) if path is not None else frozenset()


def module_closure(*modules: str) -> list[Path]:
    """:func:`retinabench.hashing.module_closure` over the memoised :func:`_imports`: the same files."""
    seen: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen or name in hashing._REGISTRY_MODULES:
            continue
        path, imports = _imports(name)
        if path is None:
            continue
        seen[name] = path
        todo.extend(imports)
    return sorted(set(seen.values()))


@cache
def rule_code_files(rule: str, extra_modules: tuple[str, ...] = ()) -> tuple[Path, ...]:
    """The source files a rule's job depends on (see the module docstring)."""
    sources = stage_sources()
    if rule in sources:
        module, modules = sources[rule]
        own = [PIPELINE / f"{module.rsplit('.', 1)[1]}.py"]  # the stage's module itself, not all its stages' imports
    else:
        from retinabench.analysis.context import FAMILIES
        if rule not in {f.rule for f in FAMILIES.values()}:
            raise KeyError(f"no stage for rule {rule!r} in retinabench.pipeline (known: {sorted(sources)})")
        modules = frozenset(module_imports(PIPELINE / "analysis.py", "retinabench.pipeline.analysis"))
        own = [PIPELINE / "analysis.py"]
    return tuple(sorted(set(module_closure(*sorted(modules), *extra_modules)) | set(own)))


@cache
def rule_code_hash(rule: str, *extra_modules: str) -> str:
    """Short sha256 over :func:`rule_code_files` (``extra_modules``: a dataset's adapter module, ...)."""
    return _hash(list(rule_code_files(rule, tuple(extra_modules))))

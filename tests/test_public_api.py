"""No module of the project, its benchmarks, tests or workflow imports a private torchvision name
(``from torchvision.x import _y``, ``from torchvision.x._y import z``, ``import torchvision.x._y`` or ``F._y`` on
a name bound to a torchvision module): private functions change without notice between releases."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARIES = ("torchvision",)
FILES = sorted(p for d in ("src", "bench", "tests", "workflow") for p in (REPO / d).rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str) -> list[str]:
    """``line: name`` of every private name of LIBRARIES that ``source`` imports or reads off a module alias."""
    tree = ast.parse(source)
    found, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            found += [f"{node.lineno}: {node.module}" for part in node.module.split(".") if _private(part)]
            found += [f"{node.lineno}: {node.module}.{a.name}" for a in node.names if _private(a.name)]
            aliases.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LIBRARIES:
                    found += [f"{node.lineno}: {a.name}" for part in a.name.split(".") if _private(part)]
                    aliases.add(a.asname or a.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases:
                found.append(f"{node.lineno}: {root.id}...{node.attr}")
    return found


@pytest.mark.parametrize("source, n", [
    ("from torchvision.transforms.functional import _get_inverse_affine_matrix", 1),
    ("from torchvision.transforms.v2.functional._color import _hsv_to_rgb", 2),
    ("import torchvision.transforms.v2.functional._geometry as G", 1),
    ("from torchvision.transforms.v2 import functional as TF\nTF._rgb_to_hsv(x)", 1),
    ("import torchvision\ntorchvision.transforms.functional._get_inverse_affine_matrix", 1),
    ("from torchvision.transforms.v2 import functional as TF\nTF.adjust_hue(x, 0.1)\nprint(x._y, TF.__doc__)", 0),
])
def test_the_check_finds_private_names(source, n):
    assert len(private_uses(source)) == n


def test_no_module_uses_a_private_torchvision_name():
    assert len(FILES) > 100
    bad = {str(p.relative_to(REPO)): u for p in FILES if (u := private_uses(p.read_text()))}
    assert not bad, f"private torchvision names (use the public API): {bad}"

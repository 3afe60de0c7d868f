"""docs/datasets.md's Python-adapter example, run as written: the contract it documents (columns, value conventions,
exclusion scopes, entry["options"]) holds for it."""
import re
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from retinabench.schemas import MANIFEST

README = Path(__file__).resolve().parents[2] / "docs" / "datasets.md"


def readme_block(first_line: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"docs/datasets.md has {len(found)} python blocks starting with {first_line!r}"
    return found[0]


@pytest.fixture
def adapter():
    module = types.ModuleType("mystudy_adapter")
    exec(compile(readme_block("# src/retinabench/data/adapters/mystudy.py"), "docs/datasets.md:mystudy.py", "exec"),
         module.__dict__)
    return module


def write_folder(root: Path) -> None:
    (root / "images").mkdir(parents=True)
    rows = [("a.png", "P1", "R", "64", "F", "0"), ("b.png", "P1", "L", "64", "F", ""),
            ("c.png", "P2", "R", "15", "M", "2"), ("d.png", "P3", "L", "", "X", "4"), ("e.png", "P4", "R", "70", "M", "1")]
    for name, *_ in rows[:-1]:  # e.png is listed but missing
        Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(root / "images" / name)
    pd.DataFrame(rows, columns=["file", "subject", "eye", "age", "sex", "dr"]).to_csv(root / "grades.csv", index=False)


def test_the_readme_adapter_follows_the_documented_contract(adapter, tmp_path):
    root = tmp_path / "mystudy"
    write_folder(root)
    manifest, excl = adapter.adapt_mystudy(root, {"name": "mystudy", "options": {"min_age": 18}})
    assert list(manifest.columns) == [*MANIFEST.names, "dr5"]
    assert list(manifest["image_id"]) == ["a.png", "b.png", "d.png"]  # c.png: under min_age; e.png: no file
    assert set(manifest["eye"]) == {"OD", "OS"} and manifest["age"].dtype == np.float64
    values = manifest.set_index("image_id").astype(object).where(manifest.set_index("image_id").notna(), None)
    assert values["sex"].to_dict() == {"a.png": "female", "b.png": "female", "d.png": None}
    assert values["dr5"].to_dict() == {"a.png": "none", "b.png": None, "d.png": "pdr"}
    assert manifest["sha256"].str.len().eq(64).all() and (manifest["dataset"] == "mystudy").all()
    scopes = excl.set_index("image_id")["scope"].to_dict()
    assert scopes == {"b.png": "label:dr5", "c.png": "image", "d.png": "normalised", "e.png": "image"}
    assert excl["source"].str.match(r"grades\.csv:row \d+").all()
    # entry["options"] is optional
    manifest2, _ = adapter.adapt_mystudy(root, {"name": "mystudy"})
    assert "c.png" in set(manifest2["image_id"])


def test_the_readme_adapter_rejects_invalid_grades_in_one_error(adapter, tmp_path):
    from retinabench.data.adapters.labels import InvalidLabelError
    root = tmp_path / "mystudy"
    write_folder(root)
    table = pd.read_csv(root / "grades.csv", dtype=str, keep_default_na=False)
    table.loc[0, "dr"], table.loc[2, "dr"] = "7", "x"
    table.to_csv(root / "grades.csv", index=False)
    with pytest.raises(InvalidLabelError, match="2 label value"):
        adapter.adapt_mystudy(root, {"name": "mystudy"})


def test_the_registration_lines_use_the_registry_api():
    block = readme_block("from retinabench.data.adapters.mystudy import")
    from retinabench.data import adapters
    assert "ADAPTER_INFO" in block and hasattr(adapters, "ADAPTER_INFO") and hasattr(adapters, "AdapterInfo")
    assert hasattr(adapters, "_codes")

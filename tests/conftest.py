import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RETINABENCH_SHARED", REPO.parent / "shared"))
TVHL = SHARED / "data" / "tvhl"


def require_shared() -> Path:
    """Real-data tests skip with a reason locally, but must not skip silently in CI."""
    if not TVHL.is_dir():
        msg = f"../shared/data/tvhl not found at {TVHL}"
        if os.environ.get("CI"):
            pytest.fail(f"{msg}; CI must run the real-data tests")
        pytest.skip(msg)
    return TVHL


@pytest.fixture(scope="session")
def tvhl_root() -> Path:
    return require_shared()


@pytest.fixture(scope="session")
def tvhl_manifest(tvhl_root):
    from retinabench.data.adapters.tvhl import adapt_tvhl
    return adapt_tvhl(tvhl_root, {"name": "tvhl"})


@pytest.fixture(scope="session")
def registries():
    from retinabench.registry import Registries
    return Registries(REPO / "config/datasets.yaml", REPO / "config/tasks.yaml", REPO / "config/encoders.yaml")

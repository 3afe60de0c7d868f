"""Helpers for the encoder tests: a local stand-in for the hub (the real loading code runs unchanged; only
``huggingface_hub.hf_hub_download`` answers from a folder) and lock records built from local files."""
from pathlib import Path

import pytest

from retinabench.hashing import sha256_file
from retinabench.registry.lockfile import pins_of

REV = "a" * 40


class FakeHub:
    def __init__(self):
        self.files: dict[tuple[str, str], Path] = {}
        self.calls: list[tuple[str, str, str]] = []

    def add(self, repo: str, filename: str, path: Path) -> None:
        self.files[(repo, filename)] = Path(path)

    def download(self, repo_id, filename, revision=None, **kwargs):
        self.calls.append((repo_id, filename, revision))
        try:
            return str(self.files[(repo_id, filename)])
        except KeyError:
            raise FileNotFoundError(f"fake hub: no {filename} in {repo_id}") from None


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub
    hub = FakeHub()
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub.download)
    return hub


def lock_record(entry: dict, files: dict[str, Path], revision: str = REV) -> dict:
    """The record `retinabench lock-encoders` would write for ``entry`` if the hub held ``files``."""
    return {"pins": pins_of(entry), "revision": revision, "files": {k: sha256_file(v) for k, v in files.items()},
            "locked_at": "2026-01-01T00:00:00Z"}


def hub_entry(hub: FakeHub, name: str, repo: str, files: dict[str, Path], **fields) -> dict:
    """A hub entry whose files the fake hub serves, with a matching lock record attached."""
    entry = {"name": name, "hub_id": repo, "domain": "natural", "method": "test", "normalization": "imagenet",
             "size_class": "tiny", **fields}
    for fname, path in files.items():
        hub.add(repo, fname, path)
    entry["lock"] = lock_record(entry, files)
    return entry

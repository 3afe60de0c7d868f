"""``retinabench lock-encoders [NAMES]``: resolve and hash what each encoder entry loads (the network part).

Each entry's weights — a Hugging Face repo at its current commit, a direct URL, or a file the user downloaded by
hand — are resolved once, every file the loader will read is hashed, and the record is written to the lock file
beside the encoder registry (``config/encoders.lock.yaml``). The lock file's format, its reader and the check of
a record against its entry live beside the registries (:mod:`retinabench.registry.lockfile`); loads verify against
it: the hub files are fetched at the locked revision (from the cache with ``HF_HUB_OFFLINE=1``) and each file's
sha256 must equal the lock's.
"""
from __future__ import annotations

import fnmatch
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

from retinabench.atomic import atomic_path
from retinabench.hashing import sha256_file
from retinabench.models.hub import hub_errors
from retinabench.registry.lockfile import (LockError, is_glob, local_weights_file, pins_of, requested_files,
                                           text_tower_dir, weights_origin)


def _download(entry: dict, filename: str, revision: str) -> str:
    """One file of the entry's repo at ``revision``, a hub error as a :class:`LockError` naming the model."""
    from huggingface_hub import hf_hub_download
    with hub_errors(entry, revision, LockError):
        return hf_hub_download(entry["hub_id"], filename, revision=revision)


def _hub_files(entry: dict, revision: str, repo_files: set[str]) -> list[str]:
    import fnmatch
    import json
    files = []
    for f in requested_files(entry):
        if is_glob(f):
            files += sorted(r for r in repo_files if fnmatch.fnmatchcase(r, f) and "/" not in r)
        elif f in repo_files:
            files.append(f)
        elif f.endswith(".safetensors") and f + ".index.json" in repo_files:  # sharded weights: index + shards
            index = json.loads(Path(_download(entry, f + ".index.json", revision)).read_text())
            files += [f + ".index.json", *sorted(set(index["weight_map"].values()))]
        elif f == "preprocessor_config.json" and f not in (entry.get("hf_files") or []):
            continue  # a model without a processor file: nothing to pin (the entry's normalisation stands)
        elif (entry["source"] == "transformers" and not entry.get("weights_file") and f == "model.safetensors"
              and "pytorch_model.bin" in repo_files):
            files.append("pytorch_model.bin")  # an older repo without safetensors (loaded with weights_only)
        elif (entry["source"] == "transformers" and not entry.get("weights_file") and f == "model.safetensors"
              and "pytorch_model.bin.index.json" in repo_files):
            index = json.loads(Path(_download(entry, "pytorch_model.bin.index.json", revision)).read_text())
            files += ["pytorch_model.bin.index.json", *sorted(set(index["weight_map"].values()))]
        else:
            raise LockError(f"encoder {entry['name']!r}: {entry['hub_id']}@{revision} has no file {f!r}; "
                            f"its files: {sorted(repo_files)[:40]}")
    return list(dict.fromkeys(files))


def lock_entry(entry: dict) -> dict:
    """Resolve and hash everything an entry loads; returns its lock record."""
    origin = weights_origin(entry)
    name = entry["name"]
    record: dict[str, Any] = {"pins": pins_of(entry), "locked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if origin == "hub":
        from huggingface_hub import HfApi
        with hub_errors(entry, error=LockError):  # gated, missing: one message naming the model and what to do
            info = HfApi().model_info(entry["hub_id"])
        revision = info.sha
        if revision is None:
            raise LockError(f"encoder {name!r}: the hub gave no commit for {entry['hub_id']!r}")
        files = _hub_files(entry, revision, {s.rfilename for s in info.siblings or []})
        record["revision"] = revision
        record["files"] = {f: sha256_file(_download(entry, f, revision)) for f in files}
    elif origin == "url":
        dest = local_weights_file(entry)
        if not dest.is_file():
            download(entry["weights_url"], dest)
        record["files"] = {entry["weights_file"]: sha256_file(dest)}
    elif origin == "manual":
        dest = local_weights_file(entry)
        if not dest.is_file():
            raise LockError(f"encoder {name!r}: its weights are downloaded by hand: get {entry['weights_url']} and "
                            f"save it as {dest} (RETINABENCH_WEIGHTS sets the folder), then lock again")
        record["files"] = {entry["weights_file"]: sha256_file(dest)}
    else:
        raise LockError(f"encoder {name!r}: {origin} weights are pinned in the registry entry, not the lock")
    if entry.get("text_tower"):
        record["text_tower"] = _lock_text_tower(entry)
    return record


def _lock_text_tower(entry: dict) -> dict:
    """The text tower's files (``text_tower``: a second hub repo's ``files`` at its current revision, or one file
    downloaded from ``url``), hashed like the weights: the record's ``text_tower`` part."""
    tt = entry["text_tower"]
    if tt.get("hub_id"):
        from huggingface_hub import HfApi
        sub = {"name": entry["name"], "hub_id": tt["hub_id"], "source": "text_tower"}
        with hub_errors(sub, error=LockError):
            info = HfApi().model_info(tt["hub_id"])
        if info.sha is None:
            raise LockError(f"encoder {entry['name']!r}: the hub gave no commit for {tt['hub_id']!r}")
        repo_files = {s.rfilename for s in info.siblings or []}
        files: list[str] = []
        for f in tt["files"]:
            if is_glob(f):
                files += sorted(r for r in repo_files if fnmatch.fnmatchcase(r, f) and "/" not in r)
            elif f in repo_files:
                files.append(f)
            else:
                raise LockError(f"encoder {entry['name']!r}: text tower {tt['hub_id']}@{info.sha} has no file {f!r}")
        return {"revision": info.sha, "files": {f: sha256_file(_download(sub, f, info.sha))
                                                for f in dict.fromkeys(files)}}
    if len(tt.get("files") or []) != 1 or not tt.get("url"):
        raise LockError(f"encoder {entry['name']!r}: a text tower from a url names exactly one file (files) and its url")
    dest = text_tower_dir(entry) / tt["files"][0]
    if not dest.is_file():
        download(tt["url"], dest)
    return {"files": {tt["files"][0]: sha256_file(dest)}}


def download(url: str, dest: Path) -> None:
    """Stream ``url`` to ``dest`` (atomically); refuses an HTML page (a login or confirmation page, not weights)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url) as resp:  # noqa: S310 - the URL comes from the registry
        ctype = resp.headers.get("Content-Type", "")
        if ctype.startswith("text/html"):
            raise LockError(f"{url} returned an HTML page, not a weight file: download it by hand to {dest}")
        with atomic_path(dest) as tmp, open(tmp, "wb") as fh:
            shutil.copyfileobj(resp, fh)

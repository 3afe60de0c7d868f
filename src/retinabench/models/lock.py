"""The encoder lock file: the pinned revision and the sha256 of every file each encoder loads.

``retinabench lock-encoders [NAMES]`` (network once) resolves each entry's weights — a Hugging Face repo at its
current commit, a direct URL, or a file the user downloaded by hand — hashes every file the loader will read and
writes ``<registry>.lock.yaml`` next to the encoder registry (``config/encoders.lock.yaml``). Loads verify
against it: the hub files are fetched at the locked revision (from the cache with ``HF_HUB_OFFLINE=1``) and each
file's sha256 must equal the lock's. A record also stores what it pinned (repo, file names, URL); an entry edited
since (another repo or file) no longer matches its record and is refused as *stale* until relocked.

Torch-free on purpose: the Snakefile and the registry read the lock when a workflow starts.
"""
from __future__ import annotations

import os
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterable

import yaml

from retinabench.atomic import atomic_path, write_text_atomic
from retinabench.hashing import sha256_file

LOCK_VERSION = 1
LOCK_HEADER = ("# Written by `retinabench lock-encoders` (do not edit by hand): for each encoder, the pinned revision\n"
               "# and the sha256 of every file its loader reads. Loads verify against these records.\n")
TRANSFORMERS_DEFAULT_FILES = ("config.json", "preprocessor_config.json")


class LockError(RuntimeError):
    pass


def lock_path_for(encoders_registry: str | os.PathLike) -> Path:
    """``config/encoders.yaml`` -> ``config/encoders.lock.yaml`` (the lock lives beside its registry)."""
    p = Path(encoders_registry)
    return p.with_name(p.stem + ".lock.yaml")


def weights_origin(entry: dict) -> str:
    """Where an entry's weights come from: none (random init), hub, url (direct download), manual (downloaded by
    hand from ``weights_url``), package (shipped in a Python package) or path (a local file)."""
    if entry.get("init") == "random":
        return "none"
    if entry.get("hub_id"):
        return "hub"
    if entry.get("package"):
        return "package"
    if entry.get("weights_path"):
        return "path"
    if entry.get("weights_url"):
        return "manual" if entry.get("download", "direct") == "manual" else "url"
    raise LockError(f"encoder {entry['name']!r}: pretrained entry without hub_id, weights_url, package or "
                    f"weights_path: nothing says where its weights come from")


def needs_lock(entry: dict) -> bool:
    return weights_origin(entry) in ("hub", "url", "manual")


def requested_files(entry: dict) -> list[str]:
    """The files of an entry's source that its loader reads (before sharded indexes are expanded)."""
    origin = weights_origin(entry)
    if origin in ("none", "package", "path"):
        return []
    files = list(entry.get("hf_files") or [])
    if entry["source"] == "transformers" and origin == "hub":
        files = files or list(TRANSFORMERS_DEFAULT_FILES)
        files.append(entry.get("weights_file", "model.safetensors"))
    else:
        if not entry.get("weights_file"):
            raise LockError(f"encoder {entry['name']!r}: weights_file is required for {origin} weights")
        files.append(entry["weights_file"])
    if entry.get("pipeline_config"):
        files.append(entry["pipeline_config"])
    return sorted(dict.fromkeys(files))


def pins_of(entry: dict) -> dict:
    """What a lock record pins for an entry; a record whose pins differ from the entry's is stale."""
    origin = weights_origin(entry)
    out: dict[str, Any] = {"origin": origin, "files": requested_files(entry)}
    if origin == "hub":
        out["hub_id"] = entry["hub_id"]
    elif origin in ("url", "manual"):
        out["url"] = entry["weights_url"]
    return out


def weights_dir() -> Path:
    """Where downloaded (url) and hand-placed (manual) weight files live: ``$RETINABENCH_WEIGHTS`` or
    ``~/.cache/retinabench/weights``; one folder per encoder."""
    return Path(os.environ.get("RETINABENCH_WEIGHTS") or Path.home() / ".cache" / "retinabench" / "weights")


def lock_name(entry: dict) -> str:
    """The name an entry's lock record is kept under (a pooling variant shares its base entry's record)."""
    return entry.get("variant_of") or entry["name"]


def local_weights_file(entry: dict) -> Path:
    return weights_dir() / lock_name(entry) / entry["weights_file"]


# --- reading / writing ------------------------------------------------------------------------------------------
def read_lock(path: str | os.PathLike) -> dict[str, dict]:
    """The records of a lock file (empty if the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or data.get("version") != LOCK_VERSION or not isinstance(data.get("encoders"), dict):
        raise LockError(f"{path}: not an encoder lock file of version {LOCK_VERSION} (keys: {sorted(data)})")
    for name, rec in data["encoders"].items():
        for key in ("pins", "files"):
            if not isinstance(rec, dict) or key not in rec:
                raise LockError(f"{path}: record {name!r} has no {key!r}")
        for fname, sha in rec["files"].items():
            if not (isinstance(sha, str) and len(sha) == 64):
                raise LockError(f"{path}: record {name!r}, file {fname!r}: not a sha256: {sha!r}")
        if rec["pins"].get("origin") == "hub" and len(str(rec.get("revision", ""))) != 40:
            raise LockError(f"{path}: record {name!r}: hub records need a 40-character revision")
    return data["encoders"]


def write_lock(path: str | os.PathLike, records: dict[str, dict]) -> None:
    path = Path(path)
    body = yaml.safe_dump({"version": LOCK_VERSION, "encoders": {k: records[k] for k in sorted(records)}},
                          sort_keys=True, default_flow_style=False)
    write_text_atomic(path, LOCK_HEADER + body)


def lock_state(entry: dict, record: dict | None) -> str:
    """``not needed`` / ``locked`` / ``NOT LOCKED`` / ``STALE`` for an entry and its lock record."""
    if not needs_lock(entry):
        return "not needed"
    if record is None:
        return "NOT LOCKED"
    # The pins say what the entry asked for; the record's files are what was found and hashed (a sharded or
    # .bin checkpoint where the entry did not name one): an edited entry no longer matches its pins.
    if record.get("pins") != pins_of(entry) or not record.get("files"):
        return "STALE"
    return "locked"


def attach_locks(encoders: dict[str, dict], lock: dict[str, dict]) -> None:
    """Give every entry that needs a lock its record under ``entry["lock"]`` (None if absent). The record then
    travels with the entry (Snakemake params), so relocking an encoder reruns exactly its jobs."""
    for _name, entry in encoders.items():
        if needs_lock(entry):
            entry["lock"] = lock.get(lock_name(entry))


def unlocked(names: Iterable[str], encoders: dict[str, dict]) -> list[str]:
    """One line per selected encoder that cannot load because its lock record is missing or stale."""
    out = []
    for name in names:
        entry = encoders[name]
        state = lock_state(entry, entry.get("lock"))
        if state in ("NOT LOCKED", "STALE"):
            out.append(f"encoder {name!r} is {state.lower()} ({weights_origin(entry)} weights): run "
                       f"`retinabench lock-encoders {lock_name(entry)}`" + (
                           f" after placing its file at {local_weights_file(entry)} (from {entry['weights_url']})"
                           if weights_origin(entry) == "manual" else ""))
    return out


def verified_record(entry: dict) -> dict:
    """The entry's lock record, or a :class:`LockError` saying how to create it."""
    record = entry.get("lock")
    state = lock_state(entry, record)
    if state in ("NOT LOCKED", "STALE"):
        raise LockError(unlocked([entry["name"]], {entry["name"]: entry})[0])
    return record


# --- locking (needs the network for hub and url entries) -------------------------------------------------------
def is_glob(name: str) -> bool:
    """An ``hf_files`` item with a glob character is an optional pattern over the repo's files (tokenizer,
    processor and chat-template files differ between repos); a plain name must exist."""
    return any(c in name for c in "*?[")


def _hub_files(entry: dict, revision: str, repo_files: set[str]) -> list[str]:
    from huggingface_hub import hf_hub_download
    import fnmatch
    import json
    files = []
    for f in requested_files(entry):
        if is_glob(f):
            files += sorted(r for r in repo_files if fnmatch.fnmatchcase(r, f) and "/" not in r)
        elif f in repo_files:
            files.append(f)
        elif f.endswith(".safetensors") and f + ".index.json" in repo_files:  # sharded weights: index + shards
            index = json.loads(Path(hf_hub_download(entry["hub_id"], f + ".index.json", revision=revision)).read_text())
            files += [f + ".index.json", *sorted(set(index["weight_map"].values()))]
        elif f == "preprocessor_config.json" and f not in (entry.get("hf_files") or []):
            continue  # a model without a processor file: nothing to pin (the entry's normalisation stands)
        elif (entry["source"] == "transformers" and not entry.get("weights_file") and f == "model.safetensors"
              and "pytorch_model.bin" in repo_files):
            files.append("pytorch_model.bin")  # an older repo without safetensors (loaded with weights_only)
        elif (entry["source"] == "transformers" and not entry.get("weights_file") and f == "model.safetensors"
              and "pytorch_model.bin.index.json" in repo_files):
            index = json.loads(Path(hf_hub_download(entry["hub_id"], "pytorch_model.bin.index.json",
                                                    revision=revision)).read_text())
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
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
        try:
            info = HfApi().model_info(entry["hub_id"])
        except GatedRepoError as err:
            raise LockError(f"encoder {name!r}: {entry['hub_id']} is gated: accept its licence at "
                            f"https://huggingface.co/{entry['hub_id']} and pass a token (HF_TOKEN or `hf auth login`)"
                            ) from err
        except RepositoryNotFoundError as err:
            raise LockError(f"encoder {name!r}: no hub repo {entry['hub_id']!r} (or it is private)") from err
        revision = info.sha
        files = _hub_files(entry, revision, {s.rfilename for s in info.siblings or []})
        record["revision"] = revision
        record["files"] = {f: sha256_file(hf_hub_download(entry["hub_id"], f, revision=revision)) for f in files}
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
    return record


def download(url: str, dest: Path) -> None:
    """Stream ``url`` to ``dest`` (atomically); refuses an HTML page (a login or confirmation page, not weights)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url) as resp:  # noqa: S310 - the URL comes from the registry
        ctype = resp.headers.get("Content-Type", "")
        if ctype.startswith("text/html"):
            raise LockError(f"{url} returned an HTML page, not a weight file: download it by hand to {dest}")
        with atomic_path(dest) as tmp, open(tmp, "wb") as fh:
            shutil.copyfileobj(resp, fh)

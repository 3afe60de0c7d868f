"""The encoder lock file (``config/encoders.lock.yaml`` beside ``config/encoders.yaml``): what each record pins, how
it is read, validated and written, and whether an entry's record still matches it.

A record holds the pinned revision and the sha256 of every file an encoder loads, and what it pinned (repo, file
names, URL); an entry edited since (another repo or file) no longer matches its record and is refused as *stale*
until relocked. Resolving and hashing the files (the network part, ``retinabench lock-encoders``) is
:mod:`retinabench.models.lock`; loads verify against the records read here.

Torch-free and import-light on purpose: the registry attaches the records when it loads, and the plan checks them
when a workflow starts (the Snakefile parse imports this, never :mod:`retinabench.models`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import yaml

from retinabench.atomic import write_text_atomic

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
    if entry.get("text_tower"):  # a text tower's tokenizer / config files from a second source (FLAIR, RET-CLIP)
        out["text_tower"] = {k: entry["text_tower"][k] for k in ("hub_id", "url", "files") if k in entry["text_tower"]}
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


def text_tower_dir(entry: dict) -> Path:
    """Where a text tower's downloaded (``url``) file lives: beside the entry's weights, in ``text_tower/``."""
    return weights_dir() / lock_name(entry) / "text_tower"


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


def verified_record(entry: dict) -> dict | None:
    """The entry's lock record (None for an entry that needs none), or a :class:`LockError` saying how to create
    it."""
    record = entry.get("lock")
    state = lock_state(entry, record)
    if state in ("NOT LOCKED", "STALE"):
        raise LockError(unlocked([entry["name"]], {entry["name"]: entry})[0])
    return record


def is_glob(name: str) -> bool:
    """An ``hf_files`` item with a glob character is an optional pattern over the repo's files (tokenizer,
    processor and chat-template files differ between repos); a plain name must exist."""
    return any(c in name for c in "*?[")

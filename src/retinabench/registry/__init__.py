"""Registries are data: datasets, tasks and encoders are YAML entries validated on load.

Code exists per *kind* (one adapter per raw layout, one loader per source library), never per entry. Beside the
loader: the encoder lock file's reader (:mod:`retinabench.registry.lockfile`) and the size classes an entry's
``size_class`` names (:mod:`retinabench.registry.sizes`). Torch-free; nothing here imports
:mod:`retinabench.models`.
"""
from __future__ import annotations

import json
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from retinabench.registry.input_size import NATIVE, apply_input_size
from retinabench.registry.lockfile import attach_locks, lock_path_for, read_lock

REGISTRY_KINDS = ("datasets", "tasks", "encoders")


class RegistryError(ValueError):
    pass


@cache
def _schema(kind: str) -> dict:
    text = resources.files("retinabench").joinpath("schemas_json", f"{kind}.schema.json").read_text()
    return json.loads(text)


ID_SCHEMA = "id"  # schemas_json/id.schema.json: the one home of the id pattern (registry names, prompt sets, variants)


@cache
def schema_validator(name: str) -> jsonschema.Draft202012Validator:
    """Validator of ``schemas_json/<name>.schema.json``; its ``$ref`` to ``id.schema.json`` resolves to the id schema."""
    from referencing import Registry, Resource
    ids = Resource.from_contents(_schema(ID_SCHEMA))
    uri = ids.id()
    if uri is None:
        raise ValueError(f"schemas_json/{ID_SCHEMA}.schema.json has no $id: other schemas cannot $ref it")
    return jsonschema.Draft202012Validator(_schema(name), registry=Registry().with_resource(uri, ids))


def schema_message(err: jsonschema.ValidationError) -> str:
    """The validator's message, with the rule spelled out where an id breaks the id schema."""
    ids = _schema(ID_SCHEMA)
    if isinstance(err.schema, dict) and err.schema.get("$id") == ids["$id"]:
        return f"{err.instance!r} is not a valid id: {ids['description']} (pattern {ids['pattern']})"
    return err.message


def check_id(name, where: str) -> str:
    """``name`` as a str when it is a valid id, else a RegistryError naming ``where`` and the rule."""
    errors = list(schema_validator(ID_SCHEMA).iter_errors(name))
    if errors:
        raise RegistryError(f"{where}: {schema_message(errors[0])}; rename it")  # names the file and the key
    return name


def _canonical(value):
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def load_registry(path: str | os.PathLike, kind: str) -> dict[str, dict[str, Any]]:
    """Load and validate one registry file: a mapping ``name -> entry``; each entry gets its ``name``."""
    if kind not in REGISTRY_KINDS:
        raise RegistryError(f"unknown registry kind {kind!r}; expected one of {REGISTRY_KINDS}")
    path = Path(path)
    if not path.is_file():
        raise RegistryError(f"{kind} registry {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise RegistryError(f"{path}: a {kind} registry must be a mapping of name -> entry")
    validator = schema_validator(kind)
    out = {}
    for name, entry in data.items():
        check_id(str(name), f"{path}: {kind} registry")  # str: YAML reads a bare 2019 as an int
        # Errors at a key first (they name it), then whole-entry rules (e.g. no weights source).
        errors = sorted(validator.iter_errors(entry or {}), key=lambda e: (not e.path, [str(p) for p in e.path]))
        if errors:
            err = errors[0]
            loc = "/".join(str(p) for p in err.path) or "(entry)"
            raise RegistryError(f"{path}: {kind} entry {name!r}, key {loc}: {schema_message(err)}")
        # Canonical key order: entries travel as Snakemake params, so reformatting a YAML file (key order) must not
        # look like a changed entry and rerun everything.
        out[str(name)] = _canonical({"name": str(name), **entry})
    if kind == "encoders":
        out = expand_encoder_variants(out, path)
    if kind == "tasks":
        for name, task in out.items():
            if len(set(task["classes"])) != len(task["classes"]):
                raise RegistryError(f"{path}: task {name!r} lists a class twice: {task['classes']}")
    return out


def registry_files(paths: str | os.PathLike | list) -> list[Path]:
    """The files of a registry setting: one path or a list of paths (the config's ``registries.<kind>``)."""
    return [Path(p) for p in (paths if isinstance(paths, (list, tuple)) else [paths])]


def load_registries(paths: str | os.PathLike | list, kind: str) -> tuple[dict[str, dict[str, Any]], dict[str, Path]]:
    """Load one registry from one file or a list of files, in order: the entries, and the file each came from. A
    name defined in two files (after encoder variants are expanded) is refused naming both files; a user adds a
    file beside the shipped ones rather than editing them."""
    entries: dict[str, dict[str, Any]] = {}
    origin: dict[str, Path] = {}
    for path in registry_files(paths):
        for name, entry in load_registry(path, kind).items():
            if name in entries:
                raise RegistryError(f"{kind} registry: {name!r} is defined in both {origin[name]} and {path}; "
                                    "a name may be defined in one registry file only (rename one)")
            entries[name], origin[name] = entry, path
    return entries, origin


def expand_encoder_variants(encoders: dict[str, dict], path) -> dict[str, dict]:
    """Each declared variant of an encoder (same weights, another pooling) becomes its own entry
    ``<name>.<variant>`` with ``variant_of: <name>``; it shares the base entry's lock record."""
    out = {}
    for name, entry in encoders.items():
        variants = entry.pop("variants", None) or {}
        out[name] = entry
        for vname, overrides in variants.items():
            full = f"{name}.{vname}"
            if full in encoders or full in out:
                raise RegistryError(f"{path}: encoder variant {full!r} collides with another entry")
            out[full] = _canonical({**entry, **overrides, "name": full, "variant_of": name})
    return out


def check_cross_references(datasets: dict, tasks: dict, encoders: dict | None = None) -> None:
    for name, task in tasks.items():
        if task["dataset"] not in datasets:
            raise RegistryError(f"task {name!r} refers to unknown dataset {task['dataset']!r}")
    for name, enc in (encoders or {}).items():
        for ds in enc.get("exposure", []):
            if ds not in datasets:
                # Exposure may name datasets this registry has no adapter for (e.g. EyePACS); that is allowed,
                # but a typo of a registered one is not.
                close = [d for d in datasets if d.lower() == str(ds).lower() and d != ds]
                if close:
                    raise RegistryError(f"encoder {name!r} exposure {ds!r}: did you mean {close[0]!r}?")


def unknown_name(kind: str, name: str, known) -> str:
    """The message for a name no registry file defines: a "did you mean" when one is close, then every name."""
    import difflib
    close = difflib.get_close_matches(str(name), list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}{hint} (known: {sorted(known)})"


RESULTS_PLACEHOLDER = "{results}"


def resolve_results(encoders: dict[str, dict], results: str | None) -> dict[str, dict]:
    """An encoder's ``weights_path`` may start with ``{results}``: the configured results folder (the demo's tiny
    models are built there by rule tiny_model, whatever ``results:`` says). Without a results folder (a registry
    read outside a run) the placeholder stays."""
    if results is None:
        return encoders
    return {name: {**e, "weights_path": e["weights_path"].replace(RESULTS_PLACEHOLDER, str(results))}
            if RESULTS_PLACEHOLDER in e.get("weights_path", "") else e for name, e in encoders.items()}


class Registries:
    """The three registries of one configuration, with the names a run selects; ``results``: the results folder a
    ``{results}`` in an encoder's ``weights_path`` stands for; ``input_size``: the config's ``input_size``, every
    encoder entry as a run at that side builds it (:mod:`retinabench.registry.input_size`)."""

    def __init__(self, datasets_path, tasks_path, encoders_path, results: str | None = None,
                 input_size: int | str = NATIVE):
        self.datasets, self.dataset_files = load_registries(datasets_path, "datasets")
        self.tasks, self.task_files = load_registries(tasks_path, "tasks")
        encoders, self.encoder_files = load_registries(encoders_path, "encoders")
        self.encoders = apply_input_size(resolve_results(encoders, results), input_size)
        check_cross_references(self.datasets, self.tasks, self.encoders)
        # Lock records travel with their entries: each registry file's lock file sits beside it
        # (config/encoders.lock.yaml beside config/encoders.yaml).
        for path in registry_files(encoders_path):
            attach_locks({n: e for n, e in self.encoders.items() if self.encoder_files[n] == path},
                         read_lock(lock_path_for(path)))
        self.encoders_lock_path = lock_path_for(registry_files(encoders_path)[0])

    def lock_path(self, encoder: str) -> Path:
        """The lock file of an encoder entry: the one beside the registry file that defines it."""
        return lock_path_for(self.encoder_files[self.encoder(encoder)["name"]])

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Registries:
        reg = config["registries"]
        return cls(reg["datasets"], reg["tasks"], reg["encoders"], results=str(config["results"]),
                   input_size=config["input_size"])

    def task(self, name: str) -> dict:
        try:
            return self.tasks[name]
        except KeyError:
            raise RegistryError(unknown_name("task", name, self.tasks)) from None

    def encoder(self, name: str) -> dict:
        try:
            return self.encoders[name]
        except KeyError:
            raise RegistryError(unknown_name("encoder", name, self.encoders)) from None

    def dataset(self, name: str) -> dict:
        try:
            return self.datasets[name]
        except KeyError:
            raise RegistryError(unknown_name("dataset", name, self.datasets)) from None

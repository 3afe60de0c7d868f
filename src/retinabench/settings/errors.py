"""One message for every problem of a configuration: each with its dotted key, an unknown key with a "did you
mean" drawn (difflib) from the keys the model declares there.

pydantic reports a value that fits no member of a union once per member (``knn.k``: not an integer, not
``auto``); those are joined into one line. The walk over the model's annotations turns pydantic's locations
(field names, list positions, mapping keys, union member tags) into the keys a user writes.
"""
from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

MAX_SHOWN = 80  # characters of an offending value shown in a message


class ConfigError(ValueError):
    """Problems of a configuration, all of them, one per line (``problems``)."""

    header = "the configuration is invalid"
    footer = "(every key, its type and default: docs/configuration.md)"

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(f"{self.header} ({n} problem{'s' if n != 1 else ''}):\n"
                         + "\n".join(f"  - {p}" for p in self.problems) + (f"\n{self.footer}" if self.footer else ""))


def _strip(annotation: Any) -> Any:
    """The annotation without Annotated metadata and without ``None`` in an optional."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _strip(members[0])
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _union_member(members: tuple, tag: str) -> Any:
    """The member of a union that pydantic's location ``tag`` names (None: a scalar member)."""
    for m in members:
        s = _strip(m)
        if _is_model(s) and s.__name__ == tag:
            return s
        origin = typing.get_origin(s)
        if origin in (list, tuple) and tag.startswith(("list[", "tuple[")):
            return s
        if origin is dict and tag.startswith("dict["):
            return s
    return None


def locate(model: type[BaseModel], loc: tuple) -> tuple[list[str], dict | None]:
    """(the key path a user writes, the fields of the model where the path ends or None) of a pydantic error
    location ``loc`` in ``model``."""
    path: list[str] = []
    annotation: Any = model
    fields = None
    for part in loc:
        a = _strip(annotation)
        fields = None
        if _is_model(a):
            fields = a.model_fields
            path.append(str(part))
            if part not in fields:
                return path, fields  # an unknown key: the fields it should have been one of
            annotation = fields[part].annotation
        elif typing.get_origin(a) in (Union, types.UnionType):
            annotation = _union_member(typing.get_args(a), str(part))
            if annotation is None:
                return path, None
        elif typing.get_origin(a) is dict:
            if part == "[key]":
                continue
            path.append(str(part))
            annotation = typing.get_args(a)[1]
        elif typing.get_origin(a) in (list, tuple) and isinstance(part, int):
            path[-1:] = [f"{path[-1]}[{part}]"] if path else [f"[{part}]"]
            args = typing.get_args(a)
            annotation = args[0] if typing.get_origin(a) is list or len(args) == 2 and args[1] is Ellipsis \
                else (args[part] if part < len(args) else Any)
        else:
            return path, None  # inside a scalar (pydantic's validator names): the field is the place
    a = _strip(annotation)
    return path, a.model_fields if _is_model(a) else None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 3] + "..."


def problems_of(err: ValidationError, model: type[BaseModel], prefix: str | None = None) -> list[str]:
    """One line per offending key of ``err`` (raised validating ``model``), keys prefixed by ``prefix``."""
    lines: dict[str, list[str]] = {}
    given: dict[str, str] = {}
    for e in err.errors(include_url=False):
        path, fields = locate(model, tuple(e["loc"]))
        key = ".".join(([prefix] if prefix else []) + path) or (prefix or "config")
        if e["type"] == "extra_forbidden":
            unknown = path[-1] if path else ""
            known = list(fields or [])
            parent = key.rpartition(".")[0]
            match = difflib.get_close_matches(unknown, known, n=1, cutoff=0.6)
            hint = (f"did you mean '{parent + '.' if parent else ''}{match[0]}'?" if match
                    else f"known keys{' of ' + parent if parent else ''}: {', '.join(known)}")
            lines.setdefault(key, []).append(f"unknown key; {hint}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if msg not in lines.setdefault(key, []):
            lines[key].append(msg)
        if e["type"] != "missing" and not isinstance(e.get("input"), dict):  # a section's own check says it
            given[key] = f" (got {_shown(e.get('input'))})"
    return [f"{key}: {'; or '.join(msgs)}{given.get(key, '')}" for key, msgs in lines.items()]


def validate(model: type[BaseModel], data: Any, prefix: str | None = None):
    """``model`` built from ``data``; every problem in one :class:`ConfigError`."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(problems_of(err, model, prefix)) from None

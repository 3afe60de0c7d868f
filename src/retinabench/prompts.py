"""Prompts as data: the prompt registry (config/prompts.yaml), its rendering, and the prompt-leakage guard.

Two interfaces read it (see the registry file's header for the format):

* ``zeroshot`` (CLIP-like): :meth:`PromptRegistry.zeroshot` gives, per class of a task and in the task's class
  order, the texts whose L2-normalised embeddings are averaged into the class embedding (one text, several
  paraphrases, or templates × class names);
* ``mllm`` (yes/no prompting): :meth:`PromptRegistry.mllm` gives a :class:`YesNoPrompt`, rendered per image from
  the manifest row (:func:`render_questions`).

Leakage guard. A question may insert metadata only from fields its task declares safe (``prompt_metadata`` in the
task registry). Never allowed, even if declared safe: the task's label column, the columns its label is derived
from (``derive.sources``) and the task's ``prompt_forbidden`` columns (fields derived from the label in the raw
data, e.g. BRSET's binary ``diabetic_retinopathy`` next to the ICDR grade). Both are checked when the prompt is
built (:class:`PromptLeakError` before any model runs). At render time every inserted piece of text is checked
too: it must not come from a forbidden field, and must not contain the row's label value (a non-generic value such
as ``glaucoma`` or ``pdr``) or a forbidden field's name (``increased cup disc``): FOCUS's BRSET description
"increased cup disc: present" for the glaucoma task is the example the tests hold it to.

Protocol names: the registry's default set of an interface reports under the plain protocol name (``zeroshot``,
``zeroshot_focus``, ``mllm``, ``mllm_renorm``); any other set under ``<protocol>@<set>``
(:func:`protocol_name`, :func:`split_protocol`), so paraphrases are separate models to every metric and the
prompt-variant sensitivity table (retinabench.analysis.prompts.prompt_sensitivity) compares them.
"""
from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

INTERFACES = ("zeroshot", "mllm")
# Values too generic to identify a label when they appear in metadata text (binary codings, absent findings).
GENERIC_VALUES = frozenset({"yes", "no", "true", "false", "0", "1", "present", "absent", "none", "normal",
                            "abnormal", "unknown", "nan", ""})


class PromptError(ValueError):
    """A malformed prompt registry or a prompt that cannot be rendered for a row."""


class PromptLeakError(PromptError):
    """A prompt that would tell the model the label."""


# --- the registry ---------------------------------------------------------------------------------------------
def load_prompts(path: str | os.PathLike) -> PromptRegistry:
    """Load and validate a prompt registry file (schemas_json/prompts.schema.json; set names are ids)."""
    from retinabench.registry import schema_message, schema_validator
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"prompt registry {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    errors = sorted(schema_validator("prompts").iter_errors(data), key=lambda e: list(map(str, e.path)))
    if errors:
        err = errors[0]
        loc = "/".join(str(p) for p in err.path) or "(top level)"
        raise PromptError(f"{path}: key {loc}: {schema_message(err)}")
    reg = PromptRegistry(data, path)
    for interface in INTERFACES:
        default = data["defaults"].get(interface)
        if data.get(interface) and default not in data[interface]:
            raise PromptError(f"{path}: defaults.{interface} = {default!r} is not a {interface} prompt set "
                              f"(sets: {sorted(data[interface])})")
    for name, s in (data.get("mllm") or {}).items():
        for task_key, spec in s["tasks"].items():
            used = _placeholders(spec["question"], f"{path}: mllm.{name}.tasks.{task_key}.question")
            undefined = sorted(set(used) - set(s.get("metadata") or {}))
            if undefined:
                raise PromptError(f"{path}: mllm.{name}.tasks.{task_key}: placeholders {undefined} have no "
                                  f"metadata spec (defined: {sorted(s.get('metadata') or {})})")
    return reg


def _placeholders(template: str, where: str) -> list[str]:
    out = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise PromptError(f"{where}: {err} (write a literal brace as '{{{{' or '}}}}')") from None
    for _, name, spec, conv in parsed:
        if name is None:
            continue
        if not re.fullmatch(r"[A-Za-z0-9_]+", name) or spec or conv:
            raise PromptError(f"{where}: placeholder {{{name}{'!' + conv if conv else ''}"
                              f"{':' + spec if spec else ''}}} must be a plain name (formats go in its metadata spec)")
        out.append(name)
    return out


@dataclass(frozen=True)
class ZeroShotPrompts:
    """The class texts of one (prompt set, task), in the task's class order."""

    set_name: str
    task: str
    classes: tuple[str, ...]
    texts: tuple[tuple[str, ...], ...]

    def as_dict(self) -> dict[str, list[str]]:
        return {c: list(t) for c, t in zip(self.classes, self.texts)}


@dataclass(frozen=True)
class YesNoPrompt:
    """One yes/no question of a prompt set for a task; :meth:`render` fills it from a manifest row."""

    set_name: str
    task: dict = field(repr=False)
    question: str
    yes_class: str
    system: str | None
    metadata: dict[str, dict]
    placeholders: tuple[str, ...]

    @property
    def task_name(self) -> str:
        return self.task["name"]

    @property
    def yes_index(self) -> int:
        return list(self.task["classes"]).index(self.yes_class)

    @property
    def no_index(self) -> int:
        return 1 - self.yes_index

    def source_fields(self) -> dict[str, list[str]]:
        """placeholder -> the manifest fields it reads."""
        out = {}
        for name in self.placeholders:
            spec = self.metadata[name]
            out[name] = list(spec.get("fields") or [spec.get("field", name)])
        return out

    def render(self, row: Mapping[str, Any]) -> str:
        """The question for one manifest row; a leaking piece of metadata raises :class:`PromptLeakError`."""
        text, _ = _render(self, row)
        return text

    def messages(self, text: str) -> list[dict]:
        """Chat messages of one rendered question: the system message (if any), then one image and the text."""
        msgs = [{"role": "system", "content": [{"type": "text", "text": self.system}]}] if self.system else []
        return msgs + [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


class PromptRegistry:
    def __init__(self, data: dict, path: str | os.PathLike | None = None):
        self.data, self.path = data, Path(path) if path else None

    def sets(self, interface: str) -> list[str]:
        _check_interface(interface)
        return list(self.data.get(interface) or {})

    def default(self, interface: str) -> str:
        _check_interface(interface)
        if not self.sets(interface):
            raise PromptError(f"prompt registry {self.path}: no {interface} prompt sets")
        return self.data["defaults"][interface]

    def _task_spec(self, interface: str, set_name: str, task: dict) -> dict | None:
        sets = self.data.get(interface) or {}
        if set_name not in sets:
            raise PromptError(f"prompt registry {self.path}: no {interface} prompt set {set_name!r} "
                              f"(sets: {sorted(sets)})")
        tasks = sets[set_name]["tasks"]
        return tasks.get(task["name"]) or (tasks.get(task["harmonised"]) if task.get("harmonised") else None)

    def sets_for(self, interface: str, task: dict) -> list[str]:
        """The sets of ``interface`` that prompt ``task`` (by its name or its harmonised id), default first; an
        mllm set whose metadata the task does not declare safe is not among them (:meth:`skipped_sets` says
        which and why, for the coverage record)."""
        names = [s for s in self.sets(interface) if self._task_spec(interface, s, task) is not None
                 and s not in self.skipped_sets(interface, task)]
        default = self.data["defaults"].get(interface)
        return sorted(names, key=lambda s: (s != default, self.sets(interface).index(s)))

    def skipped_sets(self, interface: str, task: dict) -> dict[str, str]:
        """Sets that cover ``task`` but cannot prompt it: metadata sets whose fields the task does not declare
        safe (``prompt_metadata``). A set that would show the label is not skipped: :meth:`mllm` refuses it."""
        out: dict[str, str] = {}
        if interface != "mllm":
            return out
        safe = set(task.get("prompt_metadata") or [])
        forbidden = forbidden_fields(task)
        for s in self.sets("mllm"):
            spec = self._task_spec("mllm", s, task)
            if spec is None:
                continue
            meta = self.data["mllm"][s].get("metadata") or {}
            fields = {f for name in _placeholders(spec["question"], s) for f in
                      (meta[name].get("fields") or [meta[name].get("field", name)])}
            undeclared = sorted(fields - safe - forbidden)
            if undeclared and not (fields & forbidden):
                out[s] = f"task {task['name']!r} does not declare {undeclared} safe for prompts (prompt_metadata)"
        return out

    def _spec(self, interface: str, set_name: str, task: dict) -> dict:
        spec = self._task_spec(interface, set_name, task)
        if spec is None:
            raise PromptError(f"{interface} prompt set {set_name!r} has no prompts for task {task['name']!r} "
                              f"(harmonised {task.get('harmonised')!r})")
        return spec

    def zeroshot(self, set_name: str, task: dict) -> ZeroShotPrompts:
        spec = self._spec("zeroshot", set_name, task)
        s = self.data["zeroshot"][set_name]
        classes = list(task["classes"])
        where = f"zeroshot prompt set {set_name!r}, task {task['name']!r}"
        given = spec.get("texts") or spec.get("class_names") or []
        if sorted(given) != sorted(classes):
            raise PromptError(f"{where}: prompts for classes {sorted(given)}, the task has {classes}")
        if "class_names" in spec:
            templates = s.get("templates")
            if not templates:
                raise PromptError(f"{where}: class_names need the set's templates")
            texts = [tuple(t.replace("{c}", n) for t in templates for n in spec["class_names"][c]) for c in classes]
        else:
            if s.get("templates"):
                raise PromptError(f"{where}: the set has templates but the task gives texts (use class_names)")
            texts = [tuple(spec["texts"][c]) for c in classes]
        return ZeroShotPrompts(set_name, task["name"], tuple(classes), tuple(texts))

    def mllm(self, set_name: str, task: dict) -> YesNoPrompt:
        """The set's question for ``task``, checked against the leakage rules (fields only, before rendering)."""
        spec = self._spec("mllm", set_name, task)
        s = self.data["mllm"][set_name]
        classes = list(task["classes"])
        where = f"mllm prompt set {set_name!r}, task {task['name']!r}"
        if len(classes) != 2:
            raise PromptError(f"{where}: yes/no prompting needs a binary task; {task['name']!r} has {classes}")
        if spec["yes_class"] not in classes:
            raise PromptError(f"{where}: yes_class {spec['yes_class']!r} is not a class of the task ({classes})")
        prompt = YesNoPrompt(set_name, task, spec["question"], spec["yes_class"], s.get("system"),
                             dict(s.get("metadata") or {}), tuple(dict.fromkeys(_placeholders(spec["question"], where))))
        check_prompt_fields(prompt)
        return prompt


def _check_interface(interface: str) -> None:
    if interface not in INTERFACES:
        raise PromptError(f"unknown prompt interface {interface!r}; expected one of {INTERFACES}")


# --- the leakage guard ----------------------------------------------------------------------------------------
def forbidden_fields(task: dict) -> set[str]:
    """Fields no prompt of ``task`` may show: its label column, the columns its label is derived from, and its
    declared ``prompt_forbidden`` fields (derived from the label in the raw data)."""
    out = {task["label"]}
    derive = task.get("derive") or {}
    if isinstance(derive, dict) and "sources" in derive:
        out |= set(derive["sources"]) | set(derive.get("unlabelled") or {})
    out |= set(task.get("prompt_forbidden") or [])
    return out


def check_prompt_fields(prompt: YesNoPrompt) -> None:
    """Refuse a prompt whose placeholders read the label (or a field derived from it) or an undeclared field."""
    task = prompt.task
    forbidden = forbidden_fields(task)
    safe = set(task.get("prompt_metadata") or [])
    where = f"mllm prompt set {prompt.set_name!r}, task {task['name']!r}"
    for placeholder, fields in prompt.source_fields().items():
        leak = [f for f in fields if f in forbidden]
        if leak:
            why = {f: ("the task's label" if f == task["label"] else "a field the label is derived from or a "
                       "prompt_forbidden field") for f in leak}
            raise PromptLeakError(f"{where}: placeholder {{{placeholder}}} shows {leak}: {why}; a prompt must not "
                                  "state the label")
        undeclared = [f for f in fields if f not in safe]
        if undeclared:
            raise PromptLeakError(f"{where}: placeholder {{{placeholder}}} reads {undeclared}, which the task does "
                                  f"not declare safe (prompt_metadata: {sorted(safe)})")


def _value_key(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _missing(v: Any) -> bool:
    import pandas as pd
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):  # a list-like value is not "missing"
        return False


def _render_value(spec: dict, name: str, value: Any, where: str) -> str:
    if _missing(value):
        if "missing" not in spec:
            raise PromptError(f"{where}: field {name!r} is missing and the metadata spec gives no 'missing' text")
        return spec["missing"]
    if "values" in spec:
        key = _value_key(value)
        if key not in spec["values"]:
            raise PromptError(f"{where}: field {name!r} has value {key!r}, not in the spec's values "
                              f"{sorted(spec['values'])}")
        text = spec["values"][key]
    else:
        text = _value_key(value)
    if "format" in spec and "fields" not in spec:
        try:
            text = spec["format"].format(value=value if "values" not in spec else text)
        except (ValueError, TypeError) as err:
            raise PromptError(f"{where}: field {name!r} value {value!r} does not fit format {spec['format']!r}: "
                              f"{err}") from None
    return text


def _phrase_re(text: str) -> re.Pattern:
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(text.lower()) + r"(?![A-Za-z0-9])")


def _render(prompt: YesNoPrompt, row: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    task = prompt.task
    rid = row.get("image_id", "?")
    where = f"mllm prompt set {prompt.set_name!r}, task {task['name']!r}, image {rid!r}"
    pieces: dict[str, str] = {}
    for placeholder, fields in prompt.source_fields().items():
        spec = prompt.metadata[placeholder]
        absent = [f for f in fields if f not in row]
        if absent:
            raise PromptError(f"{where}: the manifest row has no field(s) {absent} (placeholder {{{placeholder}}})")
        if "fields" in spec:
            item = spec.get("item", "{name}: {value}")
            parts = [item.format(name=f.replace("_", " "), value=_render_value(spec, f, row[f], where)) for f in fields]
            pieces[placeholder] = spec.get("sep", ", ").join(parts)
        else:
            pieces[placeholder] = _render_value(spec, fields[0], row[fields[0]], where)
    # the rendered check: no inserted piece may carry the label (its value or a forbidden field's name)
    forbidden = forbidden_fields(task)
    for placeholder, fields in prompt.source_fields().items():
        bad = [f for f in fields if f in forbidden]
        if bad:  # unreachable through YesNoPrompt built by the registry; kept for hand-built prompts
            raise PromptLeakError(f"{where}: {{{placeholder}}} inserts the label field(s) {bad}")
    needles = {f.replace("_", " ") for f in forbidden if len(f) >= 4} | {f for f in forbidden if len(f) >= 4}
    needles |= {_value_key(row[f]).lower() for f in forbidden if f in row and not _missing(row[f])} - GENERIC_VALUES
    for placeholder, text in pieces.items():
        low = text.lower()
        hits = sorted(n for n in needles if n and _phrase_re(n).search(low))
        if hits:
            raise PromptLeakError(f"{where}: the metadata inserted for {{{placeholder}}} ({text!r}) contains "
                                  f"{hits}: the task's label field or value ({sorted(forbidden)})")
    return prompt.question.format(**pieces), pieces


def render_questions(prompt: YesNoPrompt, rows) -> list[str]:
    """Rendered questions for manifest rows (a DataFrame or an iterable of mappings), in row order; every row is
    checked and the first leak or unrenderable row raises, naming the image."""
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
    if not prompt.placeholders:
        return [prompt.question] * len(records)
    return [_render(prompt, r)[0] for r in records]


# --- protocol names and prompt-variant sensitivity ------------------------------------------------------------
def protocol_name(base: str, set_name: str, default: str) -> str:
    """``base`` for the interface's default prompt set, ``base@set`` for any other."""
    return base if set_name == default else f"{base}@{set_name}"


def split_protocol(protocol: str) -> tuple[str, str | None]:
    """``"mllm@plain"`` -> ``("mllm", "plain")``; ``"mllm"`` -> ``("mllm", None)`` (the default set)."""
    base, _, set_name = protocol.partition("@")
    return base, (set_name or None)

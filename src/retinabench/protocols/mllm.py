"""Multimodal-LLM yes/no prompting on the one predictions contract.

One ``generate()`` call per batch gives both the answer text and the score (``output_logits`` at step one):
batched, left-padded, greedy (sampling and repetition penalties off, so the first generated token is the argmax of
the very distribution that is scored), a short ``max_new_tokens``, bf16 on CUDA.

Score (FOCUS): the full-vocabulary softmax at the first generated position; p_yes = the max over the affirmative
variants that encode as ONE token (``yes``/``Yes``/``YES``, bare, after a space, after a newline; a variant that
needs several tokens, or encodes to the unknown token, does not count), p_no likewise. Protocols:

* ``mllm``: the raw p_yes (FOCUS's score) as the yes-class probability, 1 − p_yes for the other class;
* ``mllm_renorm``: p_yes / (p_yes + p_no), computed as sigmoid(log p_yes − log p_no).

Both carry the same hard prediction, parsed from the generated text: the first standalone ``yes`` / ``no`` word
(case-insensitive; ``Yes.`` and ``no,`` count, ``yesterday`` does not). Anything else is an INVALID answer, handled
by ``mllm.invalid_answers``: ``keep_as_wrong`` (ours, the default) keeps it, encoded as ``y_pred = -1``
(:data:`INVALID`), which every hard-decision metric counts as wrong (retinabench.metrics.classification handles it
explicitly) while ``invalid_rate`` and the valid-only accuracy (with its n) are reported beside it; ``drop`` (FOCUS's,
whose evaluation keeps only parsed answers) leaves it out of the predictions (:func:`drop_invalid`), and every kept
row of its group records ``n_answers`` (answers given) and ``n_dropped`` (invalid ones dropped), from which the
metrics table still reports ``invalid_rate``. Extra columns: ``answer`` (raw text), ``answer_valid``,
``prob_yes``, ``prob_no``, ``mass`` (p_yes + p_no, the diagnostic of how much of the distribution is an answer
at all), ``prompt_set`` and ``prompt`` (the rendered question). They are not named ``p_yes`` / ``p_no``: those
are the class-probability columns of a task with classes ``no``/``yes``.

The model, its processor and its answer tokens load in :mod:`retinabench.models.mllm` (a LoRA adapter on top:
:mod:`retinabench.models.adapters`); an adapter's predictions carry their own protocol names
(:func:`adapter_protocol`: ``mllm_lora``, ``mllm_lora_renorm``).
"""
from __future__ import annotations

import copy
import re
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from retinabench.models.adapters import AdapterError
from retinabench.models.mllm import MLLM, AnswerTokens, chat_texts, load_mllm
from retinabench.prompts import PromptRegistry, YesNoPrompt, protocol_name, render_questions

MLLM_PROTOCOLS = ("mllm", "mllm_renorm")
INVALID = -1
_ANSWER = re.compile(r"(?<![A-Za-z0-9])(yes|no)(?![A-Za-z0-9])", re.IGNORECASE)
DEFAULTS: dict[str, Any] = {"max_new_tokens": 8, "batch_size": 8, "device": "auto", "dtype": "auto"}
ANSWER_GROUP = ["dataset", "task", "encoder", "protocol", "regime", "split"]  # one set of answers (seed is 0)


def parse_yes_no(text: str | None) -> str | None:
    """``"yes"`` / ``"no"`` for the first standalone yes/no word of ``text``, else None (an invalid answer)."""
    if not text:
        return None
    m = _ANSWER.search(text)
    return m.group(1).lower() if m else None


def yes_no_scores(logits, tokens: AnswerTokens) -> dict[str, np.ndarray]:
    """From first-step logits [B, V]: raw p_yes, p_no (full-vocabulary softmax, max over variants), their sum
    and the renormalised p_yes / (p_yes + p_no) (in log space: exact when both are tiny)."""
    import torch
    logp = torch.log_softmax(torch.as_tensor(logits).float(), dim=-1)
    lp_yes = logp[:, list(tokens.yes_ids)].max(dim=1).values.double().cpu()
    lp_no = logp[:, list(tokens.no_ids)].max(dim=1).values.double().cpu()
    p_yes, p_no = lp_yes.exp(), lp_no.exp()
    return {"prob_yes": p_yes.numpy(), "prob_no": p_no.numpy(), "mass": (p_yes + p_no).numpy(),
            "renorm": torch.sigmoid(lp_yes - lp_no).numpy()}


# --- generation ---------------------------------------------------------------------------------------------------
def greedy_config(model, max_new_tokens: int, pad_token_id: int | None, logits: bool = True):
    """The model's generation config made purely greedy: no sampling, no beam search, no repetition penalty
    (the first generated token is then the argmax of the scored distribution), ``max_new_tokens`` new tokens;
    ``logits``: also return the raw logits of every step (``output_logits``)."""
    gc = copy.deepcopy(model.generation_config)
    gc.do_sample, gc.num_beams, gc.max_new_tokens = False, 1, int(max_new_tokens)
    for attr, neutral in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 50), ("repetition_penalty", 1.0),
                          ("min_p", None), ("typical_p", 1.0)):
        if hasattr(gc, attr):
            setattr(gc, attr, neutral)
    gc.return_dict_in_generate, gc.output_logits, gc.output_scores = True, bool(logits), False
    if pad_token_id is not None:
        gc.pad_token_id = pad_token_id
    return gc


def length_order(tokenizer, texts: Sequence[str]) -> np.ndarray:
    """The prompts' order by token count, longest first (equal lengths keep their order): batches of similar
    lengths carry little padding, and the largest batch runs first."""
    lengths = [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")


def _batch_inputs(mllm: MLLM, texts: Sequence[str], images: Sequence[np.ndarray]):
    proc = mllm.processor
    # one image per conversation (nested: the batched form); a decoded original (inputs: native) as the PIL image
    imgs = [[im if hasattr(im, "getbands") else np.asarray(im)] for im in images]
    inputs = proc(text=list(texts), images=imgs, padding=True, return_tensors="pt")
    out = {}
    for k, v in inputs.items():
        if hasattr(v, "to"):
            v = v.to(mllm.device)
            if v.is_floating_point():
                v = v.to(mllm.dtype)
        out[k] = v
    return out


def generate_answers(mllm: MLLM, prompt: YesNoPrompt, questions: Sequence[str], images: Sequence[np.ndarray] | RowView,
                     *,
                     max_new_tokens: int = DEFAULTS["max_new_tokens"], batch_size: int = DEFAULTS["batch_size"],
                     score: bool = True) -> pd.DataFrame:
    """Answer text and yes/no scores for each (question, image), in order, from one generate() per batch; the
    prompts run longest first (:func:`length_order`), the rows come back in the given order. ``attrs``:
    ``prompts`` and ``seconds`` (the throughput the job reports).

    ``score=False``: the text only, from a generate() that returns no logits (the benchmark's "generate alone"
    arm)."""
    import torch
    if len(questions) != len(images):
        raise ValueError(f"{len(questions)} questions for {len(images)} images")
    t0 = time.perf_counter()
    tok = mllm.tokenizer
    texts = chat_texts(mllm.processor, prompt, questions)
    order = length_order(tok, texts)
    gc = greedy_config(mllm.model, max_new_tokens, tok.pad_token_id, logits=score)
    cols: dict[str, list] = {"answer": [], "prob_yes": [], "prob_no": [], "mass": [], "renorm": []}
    mllm.model.eval()
    with torch.inference_mode():
        for start in range(0, len(questions), batch_size):
            rows = order[start:start + batch_size]
            inputs = _batch_inputs(mllm, [texts[i] for i in rows], [images[int(i)] for i in rows])
            out = mllm.model.generate(**inputs, generation_config=gc)
            new = out.sequences[:, inputs["input_ids"].shape[1]:]
            cols["answer"] += tok.batch_decode(new, skip_special_tokens=True)
            if score:
                s = yes_no_scores(out.logits[0], mllm.tokens)
                for k in ("prob_yes", "prob_no", "mass", "renorm"):
                    cols[k] += s[k].tolist()
    frame = pd.DataFrame(cols if score else {"answer": cols["answer"]})
    frame.index = order  # the row each answer belongs to
    frame = frame.sort_index().reset_index(drop=True)
    frame.attrs.update(prompts=len(questions), seconds=time.perf_counter() - t0)
    return frame


def mllm_predictions(rows: pd.DataFrame, answers: pd.DataFrame, questions: Sequence[str], task: dict,
                     encoder: str, prompt: YesNoPrompt, *, default_set: str, regime: str, part: str) -> pd.DataFrame:
    """The predictions of one prompt set on split ``rows`` (image_id, y) from their ``answers``: both protocols
    (``mllm``: raw p_yes; ``mllm_renorm``), the same parsed hard prediction, invalid answers kept as y_pred −1."""
    classes = list(task["classes"])
    yes, no = prompt.yes_index, prompt.no_index
    parsed = [parse_yes_no(a) for a in answers["answer"]]
    y_pred = np.array([yes if p == "yes" else no if p == "no" else INVALID for p in parsed], dtype=np.int64)
    base = pd.DataFrame({"image_id": rows["image_id"].to_numpy(), "dataset": task["dataset"], "task": task["name"],
                         "encoder": encoder, "seed": 0, "regime": regime, "split": part,
                         "y_true": rows["y"].to_numpy(dtype=np.int64), "y_pred": y_pred})
    extras = {"answer": answers["answer"].astype(str).to_numpy(), "answer_valid": y_pred != INVALID,
              "prob_yes": answers["prob_yes"].to_numpy(dtype=np.float64),
              "prob_no": answers["prob_no"].to_numpy(dtype=np.float64),
              "mass": answers["mass"].to_numpy(dtype=np.float64), "prompt_set": prompt.set_name,
              "prompt": list(questions)}
    frames = []
    for proto, score in (("mllm", answers["prob_yes"].to_numpy(dtype=np.float64)),
                         ("mllm_renorm", answers["renorm"].to_numpy(dtype=np.float64))):
        df = base.copy()
        df.insert(4, "protocol", protocol_name(proto, prompt.set_name, default_set))
        proba = np.zeros((len(df), 2))
        proba[:, yes], proba[:, no] = score, 1.0 - score
        for k, c in enumerate(classes):
            df[f"p_{c}"] = proba[:, k]
        frames.append(df.assign(**extras))
    return pd.concat(frames, ignore_index=True)


class RowView:
    """Rows ``rows`` of an image array, read one slice at a time (a memory-mapped image cache is then read batch
    by batch, never copied whole into memory)."""

    def __init__(self, images: np.ndarray, rows: Sequence[int]):
        self.images, self.rows = images, np.asarray(rows, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self.images[self.rows[key]]
        return self.images[self.rows[key]]


def run_mllm(mllm: MLLM, images: np.ndarray, image_ids: Sequence[str], manifest: pd.DataFrame, split: pd.DataFrame,
             task: dict, prompts: PromptRegistry, *, prompt_sets: Iterable[str] | None = None,
             regimes: Sequence[str] = ("u-u",), max_new_tokens: int = DEFAULTS["max_new_tokens"],
             batch_size: int = DEFAULTS["batch_size"], answer=None) -> pd.DataFrame:
    """MLLM predictions of one (model, task): every mllm prompt set of the task (or ``prompt_sets``), both
    protocols, each regime's validation and test rows. Each image is asked once per prompt set (regimes share
    the answers), by ``answer`` (the backend's :func:`generate_answers`: this module's, or
    :func:`retinabench.protocols.mllm_vllm.generate_answers`); ``attrs["throughput"]``: prompts and seconds. ``images``: uint8 NHWC aligned with ``image_ids``; ``manifest``: the dataset's manifest (the
    metadata a question may use, and the label fields the leakage guard checks)."""
    from retinabench.protocols.zeroshot import regime_queries
    sets = list(prompt_sets) if prompt_sets is not None else prompts.sets_for("mllm", task)
    for s, why in prompts.skipped_sets("mllm", task).items():
        if s not in sets:
            print(f"mllm {mllm.name}/{task['name']}: prompt set {s!r} skipped: {why}")
    if not sets:
        raise KeyError(f"no mllm prompt set covers task {task['name']!r} (harmonised {task.get('harmonised')!r})")
    queries = regime_queries(split, regimes)
    needed = list(pd.unique(pd.concat([rows["image_id"] for _, _, rows in queries])))
    index = {i: k for k, i in enumerate(image_ids)}
    lacking = [i for i in needed if i not in index]
    if lacking:
        raise KeyError(f"mllm {mllm.name}/{task['name']}: {len(lacking)} split images are not among the images "
                       f"given, e.g. {lacking[:3]}")
    meta = manifest[manifest["dataset"] == task["dataset"]].drop_duplicates("image_id").set_index("image_id")
    absent = [i for i in needed if i not in meta.index]
    if absent:
        raise KeyError(f"mllm {mllm.name}/{task['name']}: {len(absent)} split images are not in the manifest, "
                       f"e.g. {absent[:3]}")
    meta_rows = meta.loc[needed].reset_index()
    frames, done = [], {"prompts": 0, "seconds": 0.0}
    for s in sets:
        prompt = prompts.mllm(s, task)
        questions = render_questions(prompt, meta_rows)  # every row checked before the model runs
        answers = (answer or generate_answers)(mllm, prompt, questions, RowView(images, [index[i] for i in needed]),
                                               max_new_tokens=max_new_tokens, batch_size=batch_size)
        for k in done:
            done[k] += answers.attrs[k]
        answers.index = pd.Index(needed, name="image_id")
        q_of = dict(zip(needed, questions))
        for regime, part, rows in queries:
            a = answers.loc[rows["image_id"]]
            frames.append(mllm_predictions(rows, a.reset_index(drop=True), [q_of[i] for i in rows["image_id"]],
                                           task, mllm.name, prompt, default_set=prompts.default("mllm"),
                                           regime=regime, part=part))
    out = pd.concat(frames, ignore_index=True)
    out.attrs["throughput"] = done
    return out


# --- predictions of an adapter-carrying model --------------------------------------------------------------------
# an adapter's predictions carry their own protocol names (the base model's mllm / mllm_renorm scoring, on the
# adapted model), so that tables never mix base and adapter rows under one name; "@<set>" suffixes are kept
ADAPTER_PROTOCOLS = {"mllm": "mllm_lora", "mllm_renorm": "mllm_lora_renorm"}


def adapter_protocol(name: str) -> str:
    """``mllm_renorm@plain`` -> ``mllm_lora_renorm@plain``."""
    base, sep, rest = str(name).partition("@")
    if base not in ADAPTER_PROTOCOLS:
        raise AdapterError(f"protocol {name!r} is not an MLLM yes/no protocol {sorted(ADAPTER_PROTOCOLS)}")
    return ADAPTER_PROTOCOLS[base] + sep + rest


def base_protocol(name: str) -> str:
    """The inverse of :func:`adapter_protocol` (a base protocol name is returned as it is)."""
    base, sep, rest = str(name).partition("@")
    inverse = {v: k for k, v in ADAPTER_PROTOCOLS.items()}
    return inverse.get(base, base) + sep + rest


def adapter_predictions(preds: pd.DataFrame, mllm: MLLM) -> pd.DataFrame:
    """Tag :func:`run_mllm`'s predictions of an adapter-carrying model (protocols renamed by
    :func:`adapter_protocol`: ``mllm`` -> ``mllm_lora``) with the adapter's source
    (``train_dataset``, ``train_task``: the transfer convention of the reliability layer) and its digest
    (``adapter``); the prompt set must be the one the adapter was trained with."""
    rec = mllm.weights.get("adapter")
    if not rec:
        raise AdapterError(f"{mllm.name}: no adapter loaded (adapter_predictions needs load_adapter's model)")
    sets = set(preds["prompt_set"]) if "prompt_set" in preds else set()
    if rec.get("prompt_set") and sets and sets != {rec["prompt_set"]}:
        raise AdapterError(f"{mllm.name}: adapter trained with prompt set {rec['prompt_set']!r}, predictions use "
                           f"{sorted(sets)}")
    return preds.assign(protocol=preds["protocol"].map(adapter_protocol), train_dataset=rec["dataset"],
                        train_task=rec["task"], adapter=rec["sha256"])


# --- the pipeline job ---------------------------------------------------------------------------------------------
def answer_counts(predictions: pd.DataFrame) -> pd.DataFrame:
    """Invalid answers per (task, protocol, regime, split): n, n_invalid, invalid_rate (what the job prints); n
    counts the answers given, those :func:`drop_invalid` dropped included."""
    p = predictions.assign(invalid=predictions["y_pred"] == INVALID)
    out = p.groupby(ANSWER_GROUP, sort=True)["invalid"].agg(n="size", n_invalid="sum").reset_index()
    if "n_dropped" in p.columns and p["n_dropped"].notna().any():
        rec = p.groupby(ANSWER_GROUP, sort=True)[["n_answers", "n_dropped"]].first().reset_index()
        out = out.merge(rec, on=ANSWER_GROUP, how="left")
        dropped = out.pop("n_dropped").fillna(0).astype(np.int64)
        out["n"] = out.pop("n_answers").fillna(out["n"]).astype(np.int64)
        out["n_invalid"] = out["n_invalid"] + dropped
    out["invalid_rate"] = out["n_invalid"] / out["n"]
    return out


def drop_invalid(predictions: pd.DataFrame) -> pd.DataFrame:
    """``mllm.invalid_answers: drop`` (FOCUS): the invalid answers (y_pred −1) left out; each kept row records its
    group's ``n_answers`` (answers given) and ``n_dropped`` (invalid answers left out), so that the invalid rate
    stays reported. A group whose every answer is invalid has no row left: :func:`answer_counts` of the undropped
    table (the job's log and provenance) still counts it."""
    invalid = predictions["y_pred"] == INVALID
    g = predictions.assign(invalid=invalid).groupby(ANSWER_GROUP, sort=False)["invalid"]
    out = predictions.assign(n_answers=g.transform("size").astype(np.int64),
                             n_dropped=g.transform("sum").astype(np.int64))
    return out[~invalid.to_numpy()].reset_index(drop=True)


def run(entry: dict, inputs: Sequence, prompts: PromptRegistry, settings=None, *, weights: str | Path | None = None,
        adapter: str | Path | None = None, log=print) -> pd.DataFrame:
    """One MLLM job: registry ``entry``'s model and processor loaded once (strictly, from its locked files or the
    local folder ``weights``), then every task of ``inputs`` (:class:`~retinabench.protocols.interfaces.TaskInput`,
    with its manifest rows) under each of its mllm prompt sets: both protocols, one generate() per batch. Invalid
    answers are kept (``y_pred`` −1) or dropped (``invalid_answers: drop``; + ``n_answers``, ``n_dropped``) and
    their count is printed per task and prompt set. Returns one predictions table (the shared schema + ``answer``,
    ``answer_valid``, ``prob_yes``, ``prob_no``, ``mass``, ``prompt_set``, ``prompt``), checked against the schema.

    ``adapter``: a LoRA adapter folder (retinabench.protocols.lora), verified and applied to the loaded model
    before anything runs (:func:`retinabench.models.adapters.load_adapter`); then the same path — prompts, scoring,
    parser — on the adapter's own prompt set, the rows tagged by :func:`adapter_predictions` (protocols ``mllm_lora``,
    ``mllm_lora_renorm``; ``train_dataset``, ``train_task``, ``adapter``)."""
    from retinabench.protocols.interfaces import MLLMSettings, finish_predictions
    from retinabench.protocols.native_inputs import check_images, mllm_inputs_record
    s = MLLMSettings.of(settings, "mllm")
    answer: Any = None  # the backend's generate_answers (None: this module's)
    m: MLLM
    if s.backend == "vllm":  # vLLM's engine: same processor (chat template, answer tokens), prompts and parser
        from retinabench.models.mllm import load_mllm_vllm
        from retinabench.protocols.mllm_vllm import generate_answers as answer
        if adapter is not None:
            raise AdapterError(f"mllm {entry['name']}: a LoRA adapter runs on backend transformers only (set "
                               "mllm.backend: transformers)")
        m = load_mllm_vllm(entry, weights=weights, device=s.device, dtype=s.dtype)
    else:
        m = load_mllm(entry, weights=weights, device=s.device, dtype=s.dtype)
    record = mllm_inputs_record(s.inputs, m.processor)
    prompt_sets = s.prompt_sets
    if adapter is not None:
        from retinabench.models.adapters import load_adapter
        m = load_adapter(m, adapter)
        rec = m.weights["adapter"]
        prompt_sets = [rec["prompt_set"]]
        log(f"mllm {entry['name']}: adapter {adapter} (sha256 {rec['sha256'][:12]}, trained on "
            f"{rec['dataset']}/{rec['task']}, prompt set {rec['prompt_set']!r})")
    log(f"mllm {entry['name']}: {type(m.model).__name__} ({s.backend}) on {m.device} ({m.dtype}); yes/no tokens "
        f"{sorted(m.tokens.counted, key=repr)}; {len(inputs)} task(s); inputs {record}")
    frames, done = [], {"prompts": 0, "seconds": 0.0}
    for ti in inputs:
        check_images(s.inputs, ti.images, f"mllm {entry['name']}/{ti.task['name']}")
        if ti.manifest is None:
            raise ValueError(f"mllm {entry['name']}/{ti.task['name']}: the job needs the dataset's manifest rows "
                             "(question metadata and the leakage guard)")
        preds = run_mllm(m, ti.images, ti.image_ids, ti.manifest, ti.split, ti.task, prompts,
                         prompt_sets=prompt_sets, regimes=s.regimes, max_new_tokens=s.max_new_tokens,
                         batch_size=s.batch_size, answer=answer)
        if "throughput" in preds.attrs:  # run_mllm's count of the prompts asked and their seconds
            t = preds.attrs["throughput"]
            done = {k: done[k] + t[k] for k in done}
            log(f"mllm {entry['name']}/{ti.task['name']}: {t['prompts']} prompts in {t['seconds']:.1f} s "
                f"({t['prompts'] / max(t['seconds'], 1e-9):.2f} prompts/s, {s.backend})")
        if adapter is not None:
            preds = adapter_predictions(preds, m)
        counts = answer_counts(preds[preds["protocol"].map(lambda p: p.split("@")[0]).isin(["mllm", "mllm_lora"])])
        what = "dropped (FOCUS)" if s.invalid_answers == "drop" else "kept and counted wrong"
        for r in counts.itertuples():
            log(f"mllm {entry['name']}/{r.task} {r.protocol} {r.regime} {r.split}: {r.n_invalid} of {r.n} answers "
                f"invalid ({r.invalid_rate:.1%}), {what}")
        frames.append(drop_invalid(preds) if s.invalid_answers == "drop" else preds)
    out = finish_predictions(frames, f"mllm {entry['name']}")
    out.attrs["inputs"] = record  # the stage's provenance
    out.attrs["throughput"] = {"backend": s.backend, "prompts": done["prompts"], "seconds": round(done["seconds"], 3),
                               "prompts_per_s": round(done["prompts"] / max(done["seconds"], 1e-9), 3)}
    return out

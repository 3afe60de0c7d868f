"""The vLLM backend of MLLM yes/no prompting (``mllm.backend: vllm``): the same chat-template text, one image, the
same answer tokens and parser as the transformers path (:mod:`retinabench.protocols.mllm`), served by vLLM's
offline engine (:func:`retinabench.models.mllm.load_mllm_vllm`).

One request per (question, image): greedy (``temperature=0``), ``max_new_tokens`` tokens, and
``logprob_token_ids`` = the counted yes / no token ids, so the first step's log-probabilities of exactly those
tokens come back with the answer text of the same request. vLLM computes them as the full-vocabulary
log-softmax of the raw logits (``logprobs_mode: raw_logprobs``, its default: before any logits processing), the
distribution the transformers path scores; p_yes / p_no are then the max over the variants, as there
(:func:`scores_from_logprobs`). The engine batches and schedules the requests itself (``batch_size`` is not a
batch here: the prompts go to it ``batch_size`` × 32 at a time, to bound the images held in memory)."""
from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np
import pandas as pd

from retinabench.models.mllm import AnswerTokens, VllmMLLM, chat_texts
from retinabench.prompts import YesNoPrompt

CHUNK = 32  # batches of prompts handed to the engine at once


def sampling_params(tokens: AnswerTokens, max_new_tokens: int, *, score: bool = True):
    """Greedy decoding of ``max_new_tokens`` tokens; ``score``: the log-probabilities of the answer tokens."""
    from vllm import SamplingParams
    ids = sorted(set(tokens.yes_ids) | set(tokens.no_ids))
    return SamplingParams(temperature=0.0, max_tokens=int(max_new_tokens), repetition_penalty=1.0,
                          logprob_token_ids=ids if score else None, skip_special_tokens=True)


def _logprob(entry: Any) -> float:
    """A ``vllm.logprobs.Logprob`` (or a bare float) as a float."""
    return float(getattr(entry, "logprob", entry))


def scores_from_logprobs(first_step: dict | None, tokens: AnswerTokens, where: str) -> dict[str, float]:
    """prob_yes, prob_no, mass and renorm from one request's first-step ``{token_id: Logprob}`` (the requested
    answer tokens + the sampled one): the max over variants, renorm = sigmoid(log p_yes − log p_no) (exact when
    both are tiny). A missing answer token is an error naming the request: the score would be undefined."""
    if not first_step:
        raise ValueError(f"{where}: vLLM returned no first-step log-probabilities (logprob_token_ids unsupported "
                         "by this vLLM version?)")
    lps = {int(k): _logprob(v) for k, v in first_step.items()}
    lacking = [t for t in (*tokens.yes_ids, *tokens.no_ids) if t not in lps]
    if lacking:
        raise ValueError(f"{where}: no log-probability for answer token id(s) {lacking} (got {sorted(lps)})")
    lp_yes = max(lps[t] for t in tokens.yes_ids)
    lp_no = max(lps[t] for t in tokens.no_ids)
    d = lp_yes - lp_no
    renorm = 1.0 / (1.0 + math.exp(-d)) if d >= 0 else math.exp(d) / (1.0 + math.exp(d))
    p_yes, p_no = math.exp(lp_yes), math.exp(lp_no)
    return {"prob_yes": p_yes, "prob_no": p_no, "mass": p_yes + p_no, "renorm": renorm}


def _image(im):
    """A PIL image (a decoded original stays as it is; a uint8 HWC array from the image cache is wrapped)."""
    if hasattr(im, "getbands"):
        return im
    from PIL import Image
    return Image.fromarray(np.ascontiguousarray(np.asarray(im, dtype=np.uint8)))


def generate_answers(mllm: VllmMLLM, prompt: YesNoPrompt, questions: Sequence[str], images, *,
                     max_new_tokens: int = 8, batch_size: int = 8, score: bool = True) -> pd.DataFrame:
    """Answer text and yes/no scores for each (question, image), in order, as
    :func:`retinabench.protocols.mllm.generate_answers` gives them, from one vLLM request each. ``attrs``:
    ``prompts`` and ``seconds``."""
    if len(questions) != len(images):
        raise ValueError(f"{len(questions)} questions for {len(images)} images")
    t0 = time.perf_counter()
    texts = chat_texts(mllm.processor, prompt, questions)
    params = sampling_params(mllm.tokens, max_new_tokens, score=score)
    cols: dict[str, list] = {"answer": [], "prob_yes": [], "prob_no": [], "mass": [], "renorm": []}
    step = max(1, batch_size) * CHUNK
    for start in range(0, len(texts), step):
        requests = [{"prompt": texts[i], "multi_modal_data": {"image": _image(images[i])}}
                    for i in range(start, min(start + step, len(texts)))]
        outputs = mllm.model.generate(requests, params, use_tqdm=False)
        if len(outputs) != len(requests):
            raise RuntimeError(f"mllm {mllm.name}: vLLM answered {len(outputs)} of {len(requests)} requests")
        for k, out in enumerate(outputs):  # LLM.generate returns the outputs in the order of the requests
            completion = out.outputs[0]
            cols["answer"].append(completion.text)
            if score:
                where = f"mllm {mllm.name} request {start + k}"
                s = scores_from_logprobs(completion.logprobs[0] if completion.logprobs else None, mllm.tokens,
                                         where)
                for key, value in s.items():
                    cols[key].append(value)
    frame = pd.DataFrame(cols if score else {"answer": cols["answer"]})
    frame.attrs.update(prompts=len(questions), seconds=time.perf_counter() - t0)
    return frame

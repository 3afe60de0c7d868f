"""The vLLM backend of MLLM prompting (mllm.backend: vllm), pinned without vLLM: a stand-in ``vllm`` module whose
engine answers each request with the tiny transformers model itself and returns vLLM's output objects
(RequestOutput -> CompletionOutput -> {token_id: Logprob}, only the requested ids + the sampled one). The job then
gives the transformers backend's predictions: same prompts, scores, parser and schema. Also the transformers
path's length-sorted batches (rows back in their order)."""
import math
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest
import torch

from retinabench.models import answer_tokens, load_mllm
from retinabench.models.mllm import chat_texts
from retinabench.models.tiny import tiny_tokenizer
from retinabench.prompts import load_prompts
from retinabench.protocols import mllm as mllm_mod
from retinabench.protocols.mllm_vllm import scores_from_logprobs
from tests.conftest import REPO

TASK = {"name": "t", "dataset": "d", "label": "dr5", "classes": ["no", "yes"], "ordinal": False,
        "harmonised": "any_dr", "modality": "cfp"}


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput (the fields read)
    index: int
    text: str
    token_ids: list
    logprobs: list | None = None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    request_id: str
    prompt: str
    outputs: list = field(default_factory=list)


class SamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeLLM:
    """vllm.LLM over the transformers model of the same folder: greedy answers, raw first-step log-softmax."""
    instances: list = []

    def __init__(self, model, tokenizer=None, dtype="float32", seed=0, limit_mm_per_prompt=None, **kw):
        self.args = dict(model=model, dtype=dtype, seed=seed, limit_mm_per_prompt=limit_mm_per_prompt, **kw)
        entry = {"name": "fake", "interfaces": ["mllm"], "hf_full_class": "AutoModelForImageTextToText"}
        self.m = load_mllm(FakeLLM.entry or entry, weights=FakeLLM.folder, device="cpu")
        self.requests = []
        FakeLLM.instances.append(self)

    def generate(self, requests, params, use_tqdm=True):
        assert params.temperature == 0.0 and params.repetition_penalty == 1.0
        out = []
        for k, r in enumerate(requests):
            self.requests.append(r)
            img = r["multi_modal_data"]["image"]
            assert hasattr(img, "getbands")  # a PIL image, as vLLM takes it
            inputs = self.m.processor(text=[r["prompt"]], images=[[np.asarray(img)]], return_tensors="pt")
            gc = mllm_mod.greedy_config(self.m.model, params.max_tokens, self.m.tokenizer.pad_token_id)
            with torch.inference_mode():
                g = self.m.model.generate(**inputs, generation_config=gc)
            new = g.sequences[0, inputs["input_ids"].shape[1]:].tolist()
            logp = torch.log_softmax(g.logits[0][0].double(), -1)
            wanted = list(params.logprob_token_ids or []) + [new[0]]
            first = {t: Logprob(float(logp[t])) for t in wanted}
            text = self.m.tokenizer.decode(new, skip_special_tokens=True)
            out.append(RequestOutput(str(k), r["prompt"], [CompletionOutput(0, text, new, [first])]))
        return out


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams, mod.__version__ = FakeLLM, SamplingParams, "fake"
    monkeypatch.setitem(sys.modules, "vllm", mod)
    FakeLLM.instances = []
    return mod


@pytest.fixture(scope="module")
def prompts():
    return load_prompts(REPO / "config/prompts.yaml")


def test_scores_from_the_requested_token_logprobs_are_the_transformers_scores():
    tok = tiny_tokenizer()
    t = answer_tokens(tok)
    v = tok.get_vocab()
    logits = torch.zeros(len(v), dtype=torch.float64)
    logits[v["yes"]], logits[v["Yes"]], logits[v["no"]], logits[v["Yes."]] = 1.0, 2.0, 0.5, 6.0
    logp = torch.log_softmax(logits, 0)
    first = {i: Logprob(float(logp[i])) for i in (*t.yes_ids, *t.no_ids, v["Yes."])}
    got = scores_from_logprobs(first, t, "r0")
    want = mllm_mod.yes_no_scores(logits[None], t)
    for k in ("prob_yes", "prob_no", "mass", "renorm"):
        assert got[k] == pytest.approx(float(want[k][0]), rel=1e-6)  # the transformers path: float32 logits
    assert got["prob_yes"] == pytest.approx(math.exp(logp[v["Yes"]]))  # the max variant; 'Yes.' is not one
    # both tiny: the renormalised score stays exact
    far = scores_from_logprobs({i: -1e4 + (2.0 if i == v["yes"] else 0.0) for i in (*t.yes_ids, *t.no_ids)}, t, "r")
    assert far["prob_yes"] == 0.0 and far["renorm"] == pytest.approx(1 / (1 + math.exp(-2.0)))
    with pytest.raises(ValueError, match=r"r7: no log-probability for answer token id\(s\)"):
        scores_from_logprobs({t.yes_ids[0]: -1.0}, t, "r7")
    with pytest.raises(ValueError, match="r8: vLLM returned no first-step"):
        scores_from_logprobs(None, t, "r8")


def _split(n):
    ids = [f"i{k}" for k in range(n)]
    manifest = pd.DataFrame({"image_id": ids, "dataset": "d", "age": 40.0 + 7 * np.arange(n), "sex": "male",
                             "dr5": "none"})
    split = pd.DataFrame({"image_id": ids, "patient_id": ids, "dataset": "d", "task": "t", "label": "no",
                          "y": [0, 1] * (n // 2), "split": ["val", "test"] * (n // 2), "balanced": True})
    images = np.random.default_rng(3).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    return ids, manifest, split, images


@pytest.mark.parametrize("name", ["tiny_llava", "tiny_qwen2_vl"])
def test_both_backends_give_the_same_predictions(tiny_mllms, prompts, fake_vllm, name):
    from retinabench.protocols.interfaces import MLLMSettings, TaskInput
    entry, folder = tiny_mllms[name]
    FakeLLM.entry, FakeLLM.folder = entry, folder
    ids, manifest, split, images = _split(6)
    ti = TaskInput(TASK, split, ids, images, manifest)
    logs: list[str] = []
    out = {b: mllm_mod.run(entry, [ti], prompts, MLLMSettings(backend=b, device="cpu", max_new_tokens=3,
                                                              batch_size=4, prompt_sets=["focus", "plain"]),
                           weights=folder, log=logs.append)
           for b in ("transformers", "vllm")}
    a, b = out["transformers"], out["vllm"]
    assert list(a.columns) == list(b.columns) and len(a) == len(b) == 4 * 6
    for col in ("image_id", "protocol", "regime", "split", "y_true", "y_pred", "answer", "answer_valid", "prompt"):
        assert a[col].tolist() == b[col].tolist(), col
    for col in ("prob_yes", "prob_no", "mass", "p_yes", "p_no"):
        np.testing.assert_allclose(a[col], b[col], rtol=1e-4, atol=1e-7, err_msg=col)
    # the engine received the chat-template text and the answer tokens' ids, loaded from the verified files
    engine = FakeLLM.instances[-1]
    m = load_mllm(entry, weights=folder, device="cpu")
    assert engine.args["limit_mm_per_prompt"] == {"image": 1} and engine.args["seed"] == 0
    assert engine.requests[0]["prompt"] == chat_texts(m.processor, prompts.mllm("focus", TASK),
                                                               b["prompt"].iloc[:1])[0]
    assert len(engine.requests) == 2 * 6  # one request per (prompt set, image): both protocols share it
    assert b.attrs["throughput"]["backend"] == "vllm" and b.attrs["throughput"]["prompts"] == 12
    assert any("prompts/s, vllm" in line for line in logs) and any("prompts/s, transformers" in line for line in logs)


def test_a_lora_adapter_on_vllm_is_refused_before_loading(tiny_mllms, prompts, fake_vllm, tmp_path):
    from retinabench.models.adapters import AdapterError
    from retinabench.protocols.interfaces import MLLMSettings
    entry, folder = tiny_mllms["tiny_llava"]
    with pytest.raises(AdapterError, match="backend transformers only"):
        mllm_mod.run(entry, [], prompts, MLLMSettings(backend="vllm", device="cpu"), weights=folder,
                     adapter=tmp_path)
    assert FakeLLM.instances == []


def test_transformers_batches_run_longest_first_and_rows_keep_their_order(tiny_mllms, prompts, monkeypatch):
    entry, folder = tiny_mllms["tiny_llava"]
    m = load_mllm(entry, weights=folder, device="cpu")
    p = prompts.mllm("plain", TASK)
    questions = ["is it ?", "is there diabetic retinopathy in this image ?", "is there retinopathy ?", "q", "is"]
    images = list(np.random.default_rng(0).integers(0, 256, (5, 32, 32, 3), dtype=np.uint8))
    seen = []
    gen = m.model.generate

    def recording(*a, **k):
        seen.append(int(k["input_ids"].shape[1]))
        return gen(*a, **k)
    monkeypatch.setattr(m.model, "generate", recording)
    batched = mllm_mod.generate_answers(m, p, questions, images, max_new_tokens=2, batch_size=2)
    assert seen == sorted(seen, reverse=True) and len(seen) == 3
    assert batched.attrs["prompts"] == 5 and batched.attrs["seconds"] > 0
    texts = chat_texts(m.processor, p, questions)
    order = mllm_mod.length_order(m.tokenizer, texts)
    assert order[0] == 1 and sorted(order.tolist()) == list(range(5))
    one = pd.concat([mllm_mod.generate_answers(m, p, [q], [im], max_new_tokens=2) for q, im in
                     zip(questions, images)], ignore_index=True)  # each row alone: no batch, no padding
    assert batched["answer"].tolist() == one["answer"].tolist()
    np.testing.assert_allclose(batched["prob_yes"], one["prob_yes"], rtol=1e-4)

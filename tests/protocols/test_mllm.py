"""MLLM yes/no prompting: the answer parser, which token variants count, the first-step score (pinned on a model
whose logits are known), one generate() per batch, and invalid answers kept, on tiny LLaVA / Qwen2-VL models
loaded through the same loader users run."""
import numpy as np
import pandas as pd
import pytest
import torch

from retinabench.prompts import load_prompts
from retinabench.models import answer_tokens, load_mllm
from retinabench.protocols.mllm import INVALID, generate_answers, parse_yes_no, run_mllm, yes_no_scores
from retinabench.schemas import conform
from retinabench.models.tiny import tiny_tokenizer

from tests.conftest import REPO

TASK = {"name": "t", "dataset": "d", "label": "dr5", "classes": ["no", "yes"], "ordinal": False,
        "harmonised": "any_dr", "modality": "cfp"}


@pytest.mark.parametrize("text, want", [
    ("Yes.", "yes"), ("no,", "no"), ("yes", "yes"), ("No", "no"), ("  YES! it is", "yes"),
    ("The answer is no.", "no"), ("no-one knows, yes", "no"), ("\nYes", "yes"),
    ("yesterday", None), ("I cannot tell", None), ("", None), (None, None), ("know nothing", None),
    ("noyes", None), ("maybe", None)])
def test_parser_takes_the_first_standalone_yes_or_no_word(text, want):
    assert parse_yes_no(text) == want


def test_only_single_token_variants_count():
    tok = tiny_tokenizer()
    t = answer_tokens(tok)
    vocab = tok.get_vocab()
    assert set(t.yes_ids) == {vocab["yes"], vocab["Yes"]} and set(t.no_ids) == {vocab["no"], vocab["No"]}
    assert {"yes", " yes", "\nyes", "Yes", " Yes", "\nYes"} <= set(t.counted)
    assert t.excluded["YES"] == "unknown/special token"  # not in the vocabulary: encodes to <unk>
    assert vocab["Yes."] not in t.yes_ids  # another token that starts with Yes is not a variant
    wp = answer_tokens(tiny_tokenizer(model="wordpiece"))  # YES -> YE + ##S
    assert wp.excluded["YES"] == "2 tokens" and wp.excluded[" YES"] == "2 tokens"


def test_scores_are_the_full_vocabulary_softmax_max_over_variants():
    tok = tiny_tokenizer()
    t = answer_tokens(tok)
    v = tok.get_vocab()
    logits = torch.zeros(2, len(v))
    logits[0, v["yes"]], logits[0, v["Yes"]], logits[0, v["no"]], logits[0, v["Yes."]] = 1.0, 2.0, 0.5, 6.0
    logits[1, v["No"]] = 3.0
    s = yes_no_scores(logits, t)
    p = torch.softmax(logits.double(), 1).numpy()
    assert s["prob_yes"][0] == pytest.approx(p[0, v["Yes"]]) and s["prob_no"][0] == pytest.approx(p[0, v["no"]])
    assert s["mass"][0] == pytest.approx(p[0, v["Yes"]] + p[0, v["no"]])
    assert s["renorm"][0] == pytest.approx(p[0, v["Yes"]] / (p[0, v["Yes"]] + p[0, v["no"]]))
    assert s["prob_no"][1] == pytest.approx(p[1, v["No"]])
    # renormalised score stays exact when both probabilities underflow
    far = torch.full((1, len(v)), -1e4)
    far[0, v["<pad>"]] = 0.0
    far[0, v["yes"]], far[0, v["no"]] = -1e4 + 2.0, -1e4
    r = yes_no_scores(far, t)
    assert r["prob_yes"][0] == 0.0 and r["renorm"][0] == pytest.approx(1 / (1 + np.exp(-2.0)))


@pytest.fixture(scope="module")
def prompts():
    return load_prompts(REPO / "config/prompts.yaml")


def _pinned_head(mllm, favourites: dict[str, float]):
    """Replace the LM head by a constant bias: every position's logits are known exactly."""
    v = mllm.tokenizer.get_vocab()
    lm = mllm.model.lm_head
    head = torch.nn.Linear(lm.in_features, lm.out_features, bias=True)
    torch.nn.init.zeros_(head.weight)
    with torch.no_grad():
        head.bias.zero_()
        for word, value in favourites.items():
            head.bias[v[word]] = value
    mllm.model.lm_head = head
    return head.bias.detach().double()


def _images(n, size=32, seed=0):
    return list(np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8))


def test_scores_and_text_come_from_one_generate_call(tiny_mllms, prompts, monkeypatch):
    entry, folder = tiny_mllms["tiny_llava"]
    m = load_mllm(entry, weights=folder, device="cpu")
    bias = _pinned_head(m, {"Yes.": 5.0, "Yes": 3.0, "yes": 2.0, "no": 1.0})
    calls = {"generate": 0, "forward": 0}
    gen = m.model.generate

    def counting_generate(*a, **k):
        calls["generate"] += 1
        return gen(*a, **k)
    monkeypatch.setattr(m.model, "generate", counting_generate)
    m.model.register_forward_pre_hook(lambda *_: calls.__setitem__("forward", calls["forward"] + 1))
    p = prompts.mllm("plain", TASK)
    out = generate_answers(m, p, [p.question] * 5, _images(5), max_new_tokens=3, batch_size=2)
    assert calls == {"generate": 3, "forward": 9}  # 3 batches x 3 steps: no separate scoring pass
    want = torch.softmax(bias, 0).numpy()
    v = m.tokenizer.get_vocab()
    np.testing.assert_allclose(out["prob_yes"], want[v["Yes"]], rtol=1e-5)  # 'Yes.' (p larger) is not a variant
    np.testing.assert_allclose(out["prob_no"], want[v["no"]], rtol=1e-5)
    np.testing.assert_allclose(out["renorm"], want[v["Yes"]] / (want[v["Yes"]] + want[v["no"]]), rtol=1e-5)
    assert (out["answer"] == "Yes. Yes. Yes.").all() and {parse_yes_no(a) for a in out["answer"]} == {"yes"}


def test_invalid_answers_are_kept_with_y_pred_minus_one(tiny_mllms, prompts):
    entry, folder = tiny_mllms["tiny_llava"]
    m = load_mllm(entry, weights=folder, device="cpu")
    _pinned_head(m, {"yesterday": 4.0, "Yes": 1.0})
    n = 6
    ids = [f"i{k}" for k in range(n)]
    manifest = pd.DataFrame({"image_id": ids, "dataset": "d", "age": 50.0, "sex": "female", "dr5": "none"})
    split = pd.DataFrame({"image_id": ids, "patient_id": ids, "dataset": "d", "task": "t", "label": "no",
                          "y": [0, 1] * 3, "split": ["val", "test"] * 3, "balanced": True})
    preds = run_mllm(m, np.stack(_images(n)), ids, manifest, split, TASK, prompts, prompt_sets=["focus"],
                     max_new_tokens=2)
    assert len(preds) == 2 * n and set(preds["protocol"]) == {"mllm", "mllm_renorm"}  # nothing dropped
    assert (preds["y_pred"] == INVALID).all() and not preds["answer_valid"].any()
    assert (preds["answer"] == "yesterday yesterday").all()
    conform(preds, "predictions")
    # the same hard predictions under both scores; the scores differ (raw p_yes vs renormalised)
    a, b = (preds[preds["protocol"] == p].set_index("image_id") for p in ("mllm", "mllm_renorm"))
    assert a["y_pred"].equals(b["y_pred"]) and not np.allclose(a["p_yes"], b["p_yes"])
    np.testing.assert_allclose(a["p_yes"], a["prob_yes"])


@pytest.mark.parametrize("name", ["tiny_llava", "tiny_qwen2_vl", "tiny_llava_next", "tiny_gemma3"])
def test_run_mllm_on_tiny_models_keeps_every_row(tiny_mllms, prompts, name):
    entry, folder = tiny_mllms[name]
    m = load_mllm(entry, weights=folder, device="cpu")
    assert m.weights["origin"] == "local file" and "answer_tokens" in m.weights
    n = 8
    ids = [f"i{k}" for k in range(n)]
    manifest = pd.DataFrame({"image_id": ids, "dataset": "d", "age": 40.0 + np.arange(n), "sex": "male",
                             "dr5": "none"})
    split = pd.DataFrame({"image_id": ids, "patient_id": ids, "dataset": "d", "task": "t", "label": "no",
                          "y": [0, 1] * 4, "split": ["val", "test"] * 4, "balanced": [True, True, False, False] * 2})
    preds = run_mllm(m, np.stack(_images(n, seed=1)), ids, manifest, split, TASK, prompts,
                     prompt_sets=["focus", "plain"], regimes=["u-u", "u-b"], max_new_tokens=3, batch_size=3)
    conform(preds, "predictions")
    per = preds.groupby(["protocol", "regime", "split"]).size()
    assert per[("mllm", "u-u", "test")] == 4 and per[("mllm", "u-b", "test")] == 2  # balanced subset
    assert set(preds["protocol"]) == {"mllm", "mllm_renorm", "mllm@plain", "mllm_renorm@plain"}
    valid = preds["answer"].map(parse_yes_no).notna()
    assert (preds["answer_valid"] == valid).all() and ((preds["y_pred"] == INVALID) == ~valid).all()
    assert ((preds["mass"] - preds["prob_yes"] - preds["prob_no"]).abs() < 1e-12).all()
    assert (preds["prompt"].str.contains("diabetic retinopathy")).all()
    # the image reaches the model: two very different images give different first-step scores
    out = generate_answers(m, prompts.mllm("plain", TASK), ["q"] * 2,
                           [np.zeros((32, 32, 3), np.uint8), np.full((32, 32, 3), 255, np.uint8)], max_new_tokens=1)
    assert out["prob_yes"].iloc[0] != out["prob_yes"].iloc[1]


def test_the_hub_path_users_run_loads_every_pinned_file_at_the_locked_revision(tiny_mllms, monkeypatch):
    """What a user's run does: the lock record's files fetched at its revision, each sha256-checked, then the
    model and its processor from exactly those files (here a stand-in hub serves the tiny model's folder)."""
    import huggingface_hub

    from retinabench.models import WeightsError
    from tests.models.conftest import FakeHub, lock_record
    hub = FakeHub()
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub.download)
    entry, folder = tiny_mllms["tiny_qwen2_vl"]
    files = {p.name: p for p in sorted(folder.iterdir())}
    for name, path in files.items():
        hub.add("org/tiny-qwen2-vl", name, path)
    pinned = dict(entry, hub_id="org/tiny-qwen2-vl", hf_files=["config.json", "*.json", "*.jinja"])
    pinned["lock"] = lock_record(pinned, files)
    m = load_mllm(pinned, device="cpu")
    assert sorted(c[1] for c in hub.calls) == sorted(files) and {c[2] for c in hub.calls} == {"a" * 40}
    assert m.weights["hub_id"] == "org/tiny-qwen2-vl" and set(m.weights["files"]) == set(files)
    assert type(m.processor).__name__ == "Qwen2VLProcessor" and m.tokenizer.padding_side == "left"
    tampered = dict(pinned, lock=dict(pinned["lock"], files=dict(pinned["lock"]["files"], **{"config.json": "0" * 64})))
    with pytest.raises(WeightsError, match="sha256 mismatch"):
        load_mllm(tampered, device="cpu")


def test_check_encoder_loads_an_mllm_and_lists_its_answer_tokens(tiny_mllms):
    from retinabench.models.check import check_encoder
    entry, folder = tiny_mllms["tiny_llava"]
    ok, lines = check_encoder(entry, weights=folder)
    text = "\n".join(lines)
    assert ok and "LlavaProcessor, chat template: yes" in text and "'YES': 'unknown/special token'" in text
    bad, lines = check_encoder(dict(entry, hf_config={"model_type": "qwen2_vl"}), weights=folder)
    assert not bad and "disagrees with the entry's hf_config" in "\n".join(lines)


def _answered(answers):
    """mllm_predictions of test rows whose generated answers are ``answers`` (no model: the answer path only)."""
    from retinabench.protocols.mllm import mllm_predictions
    from retinabench.prompts import load_prompts
    n = len(answers)
    rows = pd.DataFrame({"image_id": [f"i{k}" for k in range(n)], "y": [k % 2 for k in range(n)]})
    a = pd.DataFrame({"answer": answers, "prob_yes": np.linspace(0.1, 0.9, n), "prob_no": 0.05, "mass": 0.5,
                      "renorm": np.linspace(0.2, 0.8, n)})
    prompt = load_prompts(REPO / "config/prompts.yaml").mllm("focus", TASK)
    return mllm_predictions(rows, a, ["q"] * n, TASK, "m", prompt, default_set="focus", regime="u-u", part="test")


def test_dropped_invalid_answers_reduce_n_and_are_reported():
    """mllm.invalid_answers: drop (FOCUS) leaves the invalid answers out; invalid_rate stays reported."""
    from retinabench.metrics.classification import metrics_table
    from retinabench.protocols.mllm import answer_counts, drop_invalid
    kept = _answered(["Yes", "no", "maybe", "No.", "I cannot tell", "yes"])
    dropped = drop_invalid(kept)
    conform(dropped, "predictions")
    assert len(kept) == 12 and len(dropped) == 8 and (dropped["y_pred"] != INVALID).all()  # 2 of 6, per protocol
    assert (dropped["n_answers"] == 6).all() and (dropped["n_dropped"] == 2).all()
    tasks = {"t": TASK}
    mk, md = (metrics_table(p, tasks).set_index(["protocol", "metric"]) for p in (kept, dropped))
    for m in (mk, md):  # the invalid rate, over every answer given, whichever is chosen
        assert m.loc[("mllm", "invalid_rate"), "value"] == pytest.approx(2 / 6)
        assert m.loc[("mllm", "invalid_rate"), "n"] == 6
    # accuracy: kept, an invalid answer is wrong (n 6); dropped, over the 4 valid answers (n 4)
    y = np.arange(6) % 2
    assert mk.loc[("mllm", "accuracy"), "n"] == 6 and md.loc[("mllm", "accuracy"), "n"] == 4
    valid_pred = {0: 1, 1: 0, 3: 0, 5: 1}  # yes index 1, no index 0
    want = np.mean([valid_pred[k] == y[k] for k in valid_pred])
    assert md.loc[("mllm", "accuracy"), "value"] == pytest.approx(want)
    assert mk.loc[("mllm", "accuracy"), "value"] == pytest.approx(want * 4 / 6)
    assert md.loc[("mllm", "accuracy_valid"), "value"] == pytest.approx(mk.loc[("mllm", "accuracy_valid"), "value"])
    c_kept, c_drop = answer_counts(kept), answer_counts(dropped)
    assert c_kept[["n", "n_invalid"]].equals(c_drop[["n", "n_invalid"]]) and (c_drop["n"] == 6).all()


def test_the_job_drops_invalid_answers_only_when_asked(tiny_mllms, prompts, monkeypatch):
    from retinabench.protocols import mllm as mllm_mod
    from retinabench.protocols.interfaces import MLLMSettings, TaskInput
    entry, folder = tiny_mllms["tiny_llava"]
    answers = _answered(["Yes", "maybe", "no", "no"])
    monkeypatch.setattr(mllm_mod, "run_mllm", lambda *a, **k: answers.copy())
    ti = TaskInput(TASK, pd.DataFrame(), [], np.zeros((0, 8, 8, 3), np.uint8), pd.DataFrame())
    logs = []
    for policy, n in (("keep_as_wrong", 8), ("drop", 6)):
        s = MLLMSettings(invalid_answers=policy, device="cpu")
        out = mllm_mod.run(entry, [ti], prompts, s, weights=folder, log=logs.append)
        assert len(out) == n and ((out["y_pred"] == INVALID).sum() == 0) == (policy == "drop")
    assert MLLMSettings().invalid_answers == "keep_as_wrong" and MLLMSettings().max_new_tokens == 8
    assert any("1 of 4 answers invalid (25.0%), dropped (FOCUS)" in line for line in logs)

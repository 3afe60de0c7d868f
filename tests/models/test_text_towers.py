"""RET-CLIP and FLAIR zero-shot built offline: a tiny random BERT and a tiny WordPiece vocabulary (tokenizers
library) written in each published checkpoint layout, loaded through the real path (load_dual_encoder with the
registry entry, its architecture made tiny), the zero-shot scores checked against a hand computation from the same
tensors, and the strict load's errors naming the key."""
import json
import math

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from retinabench.features.extract import to_model_input
from retinabench.models import WeightsError, load_dual_encoder
from retinabench.models.tiny import register_tiny_open_clip
from retinabench.prompts import load_prompts
from retinabench.protocols.zeroshot import class_embeddings, embed_images, focus_proba, native_proba
from retinabench.registry import load_registry

from tests.conftest import REPO

ALL = load_registry(REPO / "config/encoders.yaml", "encoders")
PROMPTS = load_prompts(REPO / "config/prompts.yaml")
TASK = {"name": "t_anydr", "harmonised": "any_dr", "classes": ["no", "yes"]}
BERT = dict(hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=24,
            max_position_embeddings=80, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab(folder):
    """A WordPiece vocabulary trained here on the prompts' words (vocab.txt, [PAD] = 0 as BERT's)."""
    from tokenizers import BertWordPieceTokenizer
    texts = [t for s in ("focus", "plain") for c in PROMPTS.zeroshot(s, TASK).texts for t in c]
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(texts * 5 + ["a fundus photograph of"], vocab_size=120, special_tokens=SPECIALS,
                            min_frequency=1, show_progress=False)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(folder))
    return folder / "vocab.txt", tok


def _bert(vocab_size, pooler, seed):
    torch.manual_seed(seed)
    return BertModel(BertConfig(vocab_size=vocab_size, **BERT), add_pooling_layer=pooler).eval()


def _images(n=3, size=40, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def _ids(tok, texts, length=None):
    """Token ids by the tokenizers library (independent of transformers): [CLS] ... [SEP], [PAD]-padded."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    enc = [[cls, *tok.encode(t, add_special_tokens=False).ids, sep] for t in texts]
    n = length or max(map(len, enc))
    ids = torch.tensor([e + [0] * (n - len(e)) for e in enc])
    return ids, ids.ne(0).long()


def _probas(dual, prompts, images):
    cls = class_embeddings(dual, prompts)
    emb = embed_images(dual, images, device="cpu")
    return native_proba(emb, cls, dual.logit_scale), focus_proba(emb, cls)


def _hand(img_emb, txt_emb, scale):
    """softmax over classes of scale * cosine (each class one text)."""
    i = img_emb / np.linalg.norm(img_emb, axis=1, keepdims=True)
    t = txt_emb / np.linalg.norm(txt_emb, axis=1, keepdims=True)
    z = scale * i @ t.T
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# --- RET-CLIP ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ret_clip(tmp_path_factory):
    import open_clip
    root = tmp_path_factory.mktemp("ret_clip")
    arch = register_tiny_open_clip(root / "model_configs")
    vocab, tok = _vocab(root / "text_tower")
    torch.manual_seed(0)
    visual = open_clip.create_model(arch, pretrained=None).visual.eval()
    bert = _bert(tok.get_vocab_size(), pooler=True, seed=1)  # the checkpoint keeps bert.pooler (RET-CLIP drops it)
    h, e = BERT["hidden_size"], visual.output_dim
    g = torch.Generator().manual_seed(2)
    extra = {"text_projection.0.weight": (h, h), "text_projection.0.bias": (h,), "text_projection.2.weight": (e, h),
             "text_projection.2.bias": (e,), "global_feature_mapping.weight": (e, 2 * e),
             "left_feature_mapping.weight": (e, e), "right_feature_mapping.weight": (e, e)}
    for side in ("left", "right"):
        extra |= {f"text_projection_{side}.0.weight": (h, h), f"text_projection_{side}.2.weight": (e, h)}
    sd = {f"visual.{k}": v for k, v in visual.state_dict().items()} | {f"bert.{k}": v for k, v in
                                                                         bert.state_dict().items()}
    sd |= {k: torch.randn(s, generator=g) * 0.3 for k, s in extra.items()}
    sd |= {"logit_scale": torch.tensor(math.log(90.0)), "logit_scale_left": torch.tensor(1.0),
           "logit_scale_right": torch.tensor(1.0)}
    sd = {f"module.{k}": v for k, v in sd.items()}
    torch.save({"state_dict": sd, "epoch": 3}, root / "ret_clip_vitb16.pt")
    entry = {**ALL["ret_clip"], "architecture": arch, "input_size": 32, "embed_dim": 32,
             "text_tower": {**ALL["ret_clip"]["text_tower"],
                            "config": {"model_type": "bert", "vocab_size": tok.get_vocab_size(), **BERT}}}
    return entry, root / "ret_clip_vitb16.pt", sd, visual, tok


def test_ret_clip_zero_shot_equals_the_hand_computation(ret_clip):
    entry, path, sd, visual, tok = ret_clip
    dual = load_dual_encoder(entry, weights=path)
    prompts = PROMPTS.zeroshot("focus", TASK)
    texts = [t[0] for t in prompts.texts]
    # the text tower: [CLS] state of the checkpoint's BERT (pooler unused), Linear-ReLU-Linear (global projection)
    bert = _bert(tok.get_vocab_size(), pooler=True, seed=99)
    bert.load_state_dict({k[len("module.bert."):]: v for k, v in sd.items() if k.startswith("module.bert.")})
    ids, mask = _ids(tok, texts, length=52)  # RET-CLIP's tokenize: context length 52
    with torch.no_grad():
        cls = bert(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        hid = torch.relu(cls @ sd["module.text_projection.0.weight"].T + sd["module.text_projection.0.bias"])
        txt = hid @ sd["module.text_projection.2.weight"].T + sd["module.text_projection.2.bias"]
        np.testing.assert_allclose(dual.encode_text(texts).numpy(), txt.numpy(), rtol=1e-5, atol=1e-6)
        # the image tower: one eye's projected embedding (FOCUS: encode_image(img, None)), no binocular mapping
        images = _images()
        x = to_model_input(images, dual, torch.device("cpu"))
        img = visual(x)
    assert dual.logit_scale == pytest.approx(90.0, rel=1e-6) and dual.logit_bias is None
    native, focus = _probas(dual, prompts, images)
    np.testing.assert_allclose(native, _hand(img.numpy(), txt.numpy(), 90.0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(focus, _hand(img.numpy(), txt.numpy(), 100.0), rtol=1e-4, atol=1e-6)
    # every binocular / per-eye key and the BERT pooler: dropped by declaration and recorded
    dropped = dual.weights["dropped"]["keys"]
    assert "module.global_feature_mapping.weight" in dropped and "module.bert.pooler.dense.weight" in dropped
    assert dual.weights["ignored_top_level"] == ["epoch"] and dual.weights["text_tower"]["origin"] == "local file"
    assert dual.weights["unmatched_drop_keys"] == [] and "prefix 'module.' stripped" in dual.weights["transforms"]


@pytest.mark.parametrize("edit, message", [
    ("missing", r"missing keys \['text_projection.2.bias'\]"),
    ("unexpected", r"unexpected keys \['extra_head.weight'\]"),
])
def test_ret_clip_missing_or_unexpected_key_is_named(ret_clip, tmp_path, edit, message):
    entry, _path, sd, _visual, _tok = ret_clip
    sd = dict(sd)
    if edit == "missing":
        del sd["module.text_projection.2.bias"]
    else:
        sd["module.extra_head.weight"] = torch.zeros(2)
    torch.save({"state_dict": sd}, tmp_path / "ret_clip_vitb16.pt")
    (tmp_path / "text_tower").mkdir()
    (tmp_path / "text_tower" / "vocab.txt").write_text((_path.parent / "text_tower" / "vocab.txt").read_text())
    with pytest.raises(WeightsError, match=message):
        load_dual_encoder(entry, weights=tmp_path / "ret_clip_vitb16.pt")


def test_ret_clip_local_weights_without_the_vocabulary_are_refused(ret_clip, tmp_path):
    entry, path, *_ = ret_clip
    (tmp_path / "ret_clip_vitb16.pt").write_bytes(path.read_bytes())
    with pytest.raises(WeightsError, match="text tower's files"):
        load_dual_encoder(entry, weights=tmp_path / "ret_clip_vitb16.pt")


# --- FLAIR ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flair(tmp_path_factory):
    import torchvision
    from safetensors.torch import save_file
    root = tmp_path_factory.mktemp("flair")
    vocab, tok = _vocab(root / "text_tower")
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), **BERT)
    cfg.to_json_file(str(root / "text_tower" / "config.json"))
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None)
    resnet.fc = torch.nn.Identity()
    bert = _bert(tok.get_vocab_size(), pooler=True, seed=1)  # AutoModel's BertModel keeps its pooler
    g = torch.Generator().manual_seed(2)
    sd = {f"vision_model.model.{k}": v for k, v in resnet.eval().state_dict().items()}
    sd |= {f"text_model.model.{k}": v for k, v in bert.state_dict().items()}
    sd |= {"vision_model.projection_head_vision.projection.weight": torch.randn(8, 512, generator=g),
           "text_model.projection_head_text.projection.weight": torch.randn(8, 16, generator=g),
           "logit_scale": torch.tensor(5.0)}  # beyond FLAIR's clamp (4.6052)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"caption": "A fundus photograph of [CLS]", "proj_dim": 8,
                                                  "proj_bias": False, "projection": True, "norm_features": True}))
    entry = {**ALL["flair"], "architecture": "resnet18", "embed_dim": 512, "input_size": 48,
             "text_tower": {**ALL["flair"]["text_tower"], "proj_dim": 8}}
    return entry, root, sd, resnet.eval(), tok


def _flair_text(sd, tok, texts, vocab_size):
    """TextModel.forward by hand: hidden states 1, 2 and last, mean over every token (pads too), mean of the three;
    L2 norm, projection, L2 norm."""
    bert = _bert(vocab_size, pooler=True, seed=99)
    bert.load_state_dict({k[len("text_model.model."):]: v for k, v in sd.items() if k.startswith("text_model.model.")})
    ids, mask = _ids(tok, ["A fundus photograph of " + t for t in texts])
    with torch.no_grad():
        hs = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        emb = (hs[1].mean(1) + hs[2].mean(1) + hs[-1].mean(1)) / 3
        emb = emb / emb.norm(dim=-1, keepdim=True)
        emb = emb @ sd["text_model.projection_head_text.projection.weight"].T
    return emb / emb.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("padding", ["max_length", "focus"])
def test_flair_zero_shot_equals_the_hand_computation(flair, padding):
    entry, root, sd, resnet, tok = flair
    dual = load_dual_encoder(entry, weights=root)
    assert dual.logit_scale == pytest.approx(math.exp(4.6052), rel=1e-6) and dual.pads_jointly
    prompts = PROMPTS.zeroshot("plain", TASK)  # two texts of different lengths: the padding shows
    texts = [t[0] for t in prompts.texts]
    if padding == "focus":  # FOCUS's HFFLAIR: both classes' texts in one call, padded to the longer
        txt = _flair_text(sd, tok, texts, tok.get_vocab_size())
    else:  # FLAIR's compute_text_embeddings: one call per class
        txt = torch.cat([_flair_text(sd, tok, [t], tok.get_vocab_size()) for t in texts])
    cls = class_embeddings(dual, prompts, padding)
    np.testing.assert_allclose(cls, txt.numpy(), rtol=1e-5, atol=1e-6)
    images = _images(size=48)  # at the input size: no resampling
    with torch.no_grad():
        x = to_model_input(images, dual, torch.device("cpu"))
        assert float(x.max()) <= 1.0 and float(x.min()) >= 0.0  # pixels in [0, 1], no mean / std
        img = resnet(x) / resnet(x).norm(dim=-1, keepdim=True)  # torchvision's ResNet: FLAIR's own architecture
        img = img @ sd["vision_model.projection_head_vision.projection.weight"].T
    emb = embed_images(dual, images, device="cpu")
    np.testing.assert_allclose(native_proba(emb, cls, dual.logit_scale),
                               _hand(img.numpy(), txt.numpy(), math.exp(4.6052)), rtol=1e-4, atol=1e-6)


def test_the_two_paddings_differ_for_flair(flair):
    entry, root, *_ = flair
    dual = load_dual_encoder(entry, weights=root)
    prompts = PROMPTS.zeroshot("plain", TASK)
    assert not np.allclose(class_embeddings(dual, prompts, "focus"), class_embeddings(dual, prompts, "max_length"))


@pytest.mark.parametrize("edit, message", [
    ("missing", r"missing keys \['text_model.projection_head_text.projection.weight'\]"),
    ("unexpected", r"unexpected keys \['text_model.model.embeddings.extra'\]"),
])
def test_flair_missing_or_unexpected_key_is_named(flair, tmp_path, edit, message):
    import shutil

    from safetensors.torch import save_file
    entry, root, sd, *_ = flair
    sd = dict(sd)
    if edit == "missing":
        del sd["text_model.projection_head_text.projection.weight"]
    else:
        sd["text_model.model.embeddings.extra"] = torch.zeros(2)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    shutil.copytree(root / "text_tower", tmp_path / "text_tower")
    with pytest.raises(WeightsError, match=message):
        load_dual_encoder(entry, weights=tmp_path)


def test_flair_checkpoint_config_must_agree_with_the_caption(flair, tmp_path):
    import shutil
    entry, root, *_ = flair
    shutil.copytree(root, tmp_path / "w")
    (tmp_path / "w" / "config.json").write_text(json.dumps({"caption": "[CLS]", "proj_dim": 8}))
    with pytest.raises(WeightsError, match="caption"):
        load_dual_encoder(entry, weights=tmp_path / "w")


def test_features_stay_the_image_towers_of_today():
    """The features interface is unchanged: same pooling and dimension as before the text towers."""
    assert (ALL["ret_clip"]["pooling"], ALL["ret_clip"]["embed_dim"], ALL["ret_clip"]["keep_prefix"]) == \
        ("cls", 768, "module.visual.")
    assert (ALL["flair"]["pooling"], ALL["flair"]["embed_dim"], ALL["flair"]["keep_prefix"]) == \
        ("avg", 2048, "vision_model.model.")
    assert "zeroshot_note" not in ALL["ret_clip"] and "zeroshot_note" not in ALL["flair"]


def test_flair_loads_from_its_locked_hub_files_and_text_tower(flair, fake_hub, tmp_path):
    """The pinned path: FLAIR's files from its repo, BioClinicalBERT's from the second repo, both at their locked
    revisions and sha256 (the lock record's text_tower part); a changed text-tower file is refused."""
    from retinabench.hashing import sha256_file
    from retinabench.registry.lockfile import lock_state

    from tests.models.conftest import REV, lock_record
    entry, root, *_ = flair
    entry = {**entry, "name": "flair"}
    files = {"model.safetensors": root / "model.safetensors", "config.json": root / "config.json"}
    text = {f: root / "text_tower" / f for f in ("config.json", "vocab.txt")}
    for f, p in files.items():
        fake_hub.add(entry["hub_id"], f, p)
    for f, p in text.items():
        fake_hub.add(entry["text_tower"]["hub_id"], f, p)
    record = lock_record(entry, files) | {"text_tower": {"revision": "b" * 40,
                                                         "files": {f: sha256_file(p) for f, p in text.items()}}}
    assert lock_state({**entry, "text_tower": {**entry["text_tower"], "hub_id": "other/bert"}}, record) == "STALE"
    dual = load_dual_encoder({**entry, "lock": record})
    assert dual.weights["text_tower"] == {"origin": "hub", "hub_id": "emilyalsentzer/Bio_ClinicalBERT",
                                          "revision": "b" * 40, "files": record["text_tower"]["files"]}
    assert ("emilyalsentzer/Bio_ClinicalBERT", "vocab.txt", "b" * 40) in fake_hub.calls
    assert (entry["hub_id"], "model.safetensors", REV) in fake_hub.calls
    changed = tmp_path / "vocab.txt"
    changed.write_text(text["vocab.txt"].read_text() + "extra\n")
    fake_hub.add(entry["text_tower"]["hub_id"], "vocab.txt", changed)
    with pytest.raises(WeightsError, match=r"\(text tower\): sha256 mismatch"):
        load_dual_encoder({**entry, "lock": record})
    with pytest.raises(WeightsError, match="no text_tower part"):
        load_dual_encoder({**entry, "lock": lock_record(entry, files)})


def test_lock_encoders_pins_the_text_tower_of_a_second_hub_repo(flair, fake_hub, monkeypatch):
    """`retinabench lock-encoders flair` hashes the text tower's files at its repo's current commit (globs
    optional, plain names required) into the record's text_tower part."""
    from types import SimpleNamespace

    import huggingface_hub

    from retinabench.hashing import sha256_file
    from retinabench.models.lock import lock_entry
    from retinabench.registry.lockfile import LockError
    from retinabench.registry.lockfile import lock_state
    entry, root, *_ = flair
    repos = {entry["hub_id"]: {"model.safetensors": root / "model.safetensors", "config.json": root / "config.json"},
             "emilyalsentzer/Bio_ClinicalBERT": {f: root / "text_tower" / f for f in ("config.json", "vocab.txt")}}
    for repo, files in repos.items():
        for f, p in files.items():
            fake_hub.add(repo, f, p)

    class Api:
        def model_info(self, repo):
            return SimpleNamespace(sha=("c" if repo == entry["hub_id"] else "d") * 40,
                                   siblings=[SimpleNamespace(rfilename=f) for f in repos[repo]])
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    record = lock_entry({**entry, "name": "flair"})
    assert record["text_tower"] == {"revision": "d" * 40, "files": {
        f: sha256_file(p) for f, p in repos["emilyalsentzer/Bio_ClinicalBERT"].items()}}
    assert sorted(record["files"]) == ["config.json", "model.safetensors"]
    assert lock_state(entry, record) == "locked"
    del repos["emilyalsentzer/Bio_ClinicalBERT"]["vocab.txt"]
    with pytest.raises(LockError, match="has no file .vocab.txt."):
        lock_entry({**entry, "name": "flair"})


def test_check_encoder_loads_features_and_zero_shot_of_both(ret_clip, flair):
    """`retinabench check-encoder NAME --weights ...`: the image tower for features (unchanged pooling) and the
    whole dual encoder, from the same published files."""
    from retinabench.models.check import check_encoder
    for entry, weights, dim in ((ret_clip[0], ret_clip[1], "32"), (flair[0], flair[1], "512")):
        ok, lines = check_encoder(entry, weights=weights)
        text = "\n".join(lines)
        assert ok, text
        assert f"embedding dimension: {dim}" in text and "clip family, head softmax(logit_scale" in text

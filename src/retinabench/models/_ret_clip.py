"""RET-CLIP (github.com/sStonemason/RET-CLIP) as a dual encoder: the whole published checkpoint (Chinese-CLIP
layout, ``state_dict`` under DataParallel's ``module.``) loaded strictly into

* the image tower: open_clip's ViT of the entry's ``architecture`` (Chinese-CLIP's ViT-B/16 is OpenAI CLIP's
  layout), whose output is the projected embedding (``visual.proj``);
* the text tower: Chinese-CLIP's RoBERTa-wwm-ext, a BERT without pooler built by transformers from the entry's
  ``text_tower.config`` (RET-CLIP's ``RoBERTa-wwm-ext-base-chinese.json``), its [CLS] hidden state through
  ``text_projection`` (Linear, ReLU, Linear) = RET-CLIP's ``encode_text(...)[0]``;
* ``logit_scale``.

Single images. RET-CLIP trains on binocular pairs: ``encode_image(left, right)`` maps the two projected image
embeddings to a global one (``global_feature_mapping``) and to per-eye ones, matched against three text
projections. FOCUS scores one image as ``encode_image(image, None)``: the projected image embedding of that eye,
without any mapping, against the global text projection (``encode_text(...)[0]``). We do the same; the binocular
and per-eye parts (``text_projection_left/right``, ``logit_scale_left/right``, the three feature mappings) are
declared in ``text_tower.drop_keys``, dropped and recorded.

Tokenizer: RET-CLIP's ``FullTokenizer`` over its ``vocab.txt`` (lower-cased, Chinese characters split) is BERT's
WordPiece: transformers' ``BertTokenizer`` on the same vocabulary, [CLS] text [SEP] padded with [PAD] to 52 tokens
(RET-CLIP's ``tokenize``, context length 52), the attention mask marking the non-pad tokens.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from retinabench.models._dual import DualEncoder, module_device
from retinabench.models._open_clip import _open_clip_model, resample_pos_embed
from retinabench.models._registry import register_text_tower, weight_files
from retinabench.models._text_tower import bert, load_whole, text_tower_files
from retinabench.models.preprocess import resolve_normalization
from retinabench.models.strict import WeightsError

CONTEXT_LENGTH = 52  # RET_CLIP.clip.utils.tokenize


class RetClip(nn.Module):
    """RET-CLIP's single-image zero-shot path, with the checkpoint's key names (``visual.*``, ``bert.*``,
    ``text_projection.*``, ``logit_scale``)."""

    def __init__(self, visual: nn.Module, text: Any, embed_dim: int):
        super().__init__()
        hidden = int(text.config.hidden_size)
        self.visual, self.bert = visual, text
        self.text_projection = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, embed_dim))
        self.logit_scale = nn.Parameter(torch.zeros(()))

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        return self.visual(x)  # encode_image(img, None): the projected embedding of one eye

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        cls = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0]
        return self.text_projection(cls)


def ret_clip_tokenizer(vocab: Path):
    """RET-CLIP's tokenizer (``FullTokenizer(do_lower_case=True)``) over its vocabulary file."""
    from transformers import BertTokenizer
    return BertTokenizer(vocab=str(vocab), do_lower_case=True, tokenize_chinese_chars=True)


def load_ret_clip(entry: dict, weights: str | Path | None = None):
    """The whole RET-CLIP model (strict) and its tokenizer; ``weights``: a local checkpoint in the published
    layout, its ``text_tower/`` folder beside it."""
    what = f"encoder {entry['name']!r}"
    files, prov = weight_files(entry, weights)
    tfiles, tprov = text_tower_files(entry, weights)
    tt = entry["text_tower"]
    visual = _open_clip_model(entry).visual
    assert isinstance(visual, nn.Module)
    out_dim = getattr(visual, "output_dim", None)
    if not isinstance(out_dim, int):
        raise WeightsError(f"{what}: {entry['architecture']} has no projected image output")
    model = RetClip(visual, bert(tt["config"], pooler=False, what=what), out_dim)
    report = load_whole(model, entry, files, prefix="module.", adapt=resample_pos_embed)
    tokenizer = ret_clip_tokenizer(tfiles["vocab.txt"])
    if tokenizer.pad_token_id is None or tokenizer.convert_tokens_to_ids("[PAD]") != tokenizer.pad_token_id:
        raise WeightsError(f"{what}: the text tower's vocab.txt has no [PAD] token")
    return model.eval(), tokenizer, prov | report.record() | {"text_tower": tprov}


def _dual_encoder(entry: dict, weights: str | Path | None = None) -> DualEncoder:
    mean, std = resolve_normalization(entry)
    model, tokenizer, prov = load_ret_clip(entry, weights)

    def enc_text(texts, *, padding: str = "max_length"):
        tok = tokenizer(list(texts), padding="max_length", truncation=True, max_length=CONTEXT_LENGTH,
                        return_tensors="pt")
        dev = module_device(model)
        ids = tok["input_ids"].to(dev)
        return model.encode_text(ids, ids.ne(tokenizer.pad_token_id).long())

    with torch.no_grad():
        scale = float(model.logit_scale.exp())
    return DualEncoder(entry["name"], "clip", model, model.encode_image, enc_text, entry["input_size"], mean, std,
                       scale, None, prov)


register_text_tower("ret_clip", _dual_encoder)

"""FLAIR (github.com/jusiro/FLAIR, hub ``jusiro2/FLAIR``) as a dual encoder: the whole published state dict
(``FLAIRModel``, PyTorchModelHubMixin) loaded strictly into the modules of ``flair.modeling.model``, same key names:

* ``vision_model``: the ResNet-50 (``vision_model.model``; timm's resnet50 has torchvision's layout, ``fc`` =
  Identity) and ``projection_head_vision`` (Linear 2048 -> 512, no bias);
* ``text_model``: BioClinicalBERT (``text_model.model``, transformers ``BertModel`` with pooler, as FLAIR's
  ``AutoModel.from_pretrained`` builds it, from the text tower's ``config.json``) and ``projection_head_text``
  (Linear 768 -> 512, no bias);
* ``logit_scale``.

Text embedding (``TextModel.forward``): the hidden states 1, 2 and the last, each averaged over every token
position (padding included: FLAIR passes no mask to this mean), averaged; then FLAIR's ``ProjectionLayer``:
L2 norm, projection, L2 norm. Image embedding (``VisionModel.forward``): the 2048-d pool through the same
``ProjectionLayer``. Scale: ``exp(clamp(logit_scale, 0, 4.6052))`` (``FLAIRModel.compute_logits``).

Each text is FLAIR's caption with the prompt in place of ``[CLS]`` (``FLAIRModel.preprocess_text``, the path FOCUS
calls; the entry's ``text_tower.caption``, checked against the checkpoint's ``config.json`` where it is pinned),
tokenised by the text tower's tokenizer with ``model_max_length`` 77, truncated and padded to the longest text of
the call: an embedding depends on the texts tokenised with it (``pads_jointly``), so
``zeroshot.siglip_text_padding: focus`` tokenises all the classes' texts in one call as FOCUS does, and the default
one call per class, as FLAIR's own ``compute_text_embeddings`` does.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from retinabench.models._dual import DualEncoder, module_device
from retinabench.models._registry import build_architecture, register_text_tower, weight_files
from retinabench.models._transformers import _staged
from retinabench.models._text_tower import bert, l2, load_whole, text_tower_files
from retinabench.models.preprocess import resolve_normalization
from retinabench.models.strict import WeightsError

MAX_TOKENS = 77           # TextModel: tokenizer.model_max_length = 77
LOGIT_SCALE_MAX = 4.6052  # compute_logits: logit_scale clamped to [0, 4.6052]


class _Projection(nn.Module):
    """FLAIR's ``ProjectionLayer`` (projection and norm on): L2 norm, Linear without bias, L2 norm."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.projection = nn.Linear(dim_in, dim_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2(self.projection(l2(x)))


class _Vision(nn.Module):
    def __init__(self, model: nn.Module, dim_in: int, dim_out: int):
        super().__init__()
        self.model, self.projection_head_vision = model, _Projection(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection_head_vision(self.model(x))


class _Text(nn.Module):
    def __init__(self, model: Any, dim_out: int):
        super().__init__()
        self.model = model
        self.projection_head_text = _Projection(int(model.config.hidden_size), dim_out)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hs = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
        embed = torch.stack([hs[1], hs[2], hs[-1]]).mean(dim=2).mean(dim=0)  # tokens, then the three layers
        return self.projection_head_text(embed)


class Flair(nn.Module):
    def __init__(self, vision: nn.Module, text: nn.Module, vision_dim: int, proj_dim: int):
        super().__init__()
        self.vision_model = _Vision(vision, vision_dim, proj_dim)
        self.text_model = _Text(text, proj_dim)
        self.logit_scale = nn.Parameter(torch.zeros(()))


def _checkpoint_config(entry: dict, files: dict[str, Path]) -> dict:
    """FLAIRModel's init arguments (its hub ``config.json``, where pinned): what this loader assumes must hold."""
    tt = entry["text_tower"]
    if "config.json" not in files:
        return {}
    cfg = json.loads(files["config.json"].read_text())
    want = {"caption": tt["caption"], "proj_dim": tt["proj_dim"], "proj_bias": False, "projection": True,
            "norm_features": True}
    diffs = [(k, w, cfg[k]) for k, w in want.items() if k in cfg and cfg[k] != w]
    if diffs:
        raise WeightsError(f"encoder {entry['name']!r}: the checkpoint's config.json disagrees with the loader "
                           f"(key, expected, file): {diffs}")
    return cfg


def load_flair(entry: dict, weights: str | Path | None = None):
    """The whole FLAIR model (strict) and its tokenizer; ``weights``: a local folder in the hub layout
    (``model.safetensors``, optional ``config.json``) with the text tower's files in ``text_tower/``."""
    from transformers import AutoTokenizer
    what = f"encoder {entry['name']!r}"
    tt = entry["text_tower"]
    files, prov = weight_files(entry, weights)
    tfiles, tprov = text_tower_files(entry, weights)
    checked = _checkpoint_config(entry, files)
    vision = build_architecture({**entry, "pooling": "avg"})
    vision_dim = int(entry.get("embed_dim") or 2048)
    model = Flair(vision, bert(tfiles["config.json"], pooler=True, what=what), vision_dim, int(tt["proj_dim"]))
    report = load_whole(model, entry, files)
    with _staged(tfiles) as folder:  # exactly the verified files
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer.model_max_length = MAX_TOKENS
    return model.eval(), tokenizer, prov | report.record() | {"text_tower": tprov,
                                                              "config_checked": sorted(checked)}


def _dual_encoder(entry: dict, weights: str | Path | None = None) -> DualEncoder:
    mean, std = resolve_normalization(entry)
    model, tokenizer, prov = load_flair(entry, weights)
    caption = entry["text_tower"]["caption"]

    def enc_text(texts, *, padding: str = "longest"):
        prompts = [caption.replace("[CLS]", t) for t in texts]
        tok = tokenizer(prompts, truncation=True, padding=True, return_tensors="pt")
        dev = module_device(model)
        return model.text_model(tok["input_ids"].to(dev), tok["attention_mask"].to(dev))

    with torch.no_grad():
        scale = float(model.logit_scale.clamp(0, LOGIT_SCALE_MAX).exp())
    return DualEncoder(entry["name"], "clip", model, model.vision_model, enc_text, entry["input_size"], mean, std,
                       scale, None, prov, pads_jointly=True)


register_text_tower("flair", _dual_encoder)

"""CLIP-like zero-shot classification on the one predictions contract.

A dual encoder (open_clip, or transformers CLIP / SigLIP with both towers; loaded by
:func:`retinabench.models.dual_encoder.load_dual_encoder`) embeds each image and each class's
prompt texts; a class embedding is the mean of its L2-normalised text embeddings, renormalised (one text, several
paraphrases, or templates × class names: the prompt registry decides). Two scorings, each its own protocol:

* ``zeroshot_focus`` (FOCUS, for reproduction): cosine similarities × 100, softmax over classes — whatever the
  model learned; FOCUS's fixed ×100 is what decides its VLM calibration;
* ``zeroshot`` (the model's own head): CLIP family softmax(exp(logit_scale) · cos); SigLIP family the sigmoid
  with the learned bias, sigmoid(exp(logit_scale) · cos + logit_bias), normalised over classes.

:func:`ece_difference` reports ECE(zeroshot_focus) − ECE(zeroshot) per cell. Zero-shot trains nothing, so a
regime ``a-b`` only chooses rows: validation rows balanced when ``a`` is ``b``, test rows when ``b`` is; seed 0.

Inputs (``zeroshot.inputs``): ``cache``, uint8 HWC images (the image cache, any size: resized bicubically to the
model's input size and normalised with the entry's statistics, as frozen features are), or ``native``, the decoded
original files through the model's own image processor (:mod:`retinabench.protocols.native_inputs`); the task's
split table and the prompt registry.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from retinabench.models.dual_encoder import DualEncoder, load_dual_encoder
from retinabench.prompts import PromptRegistry, ZeroShotPrompts, protocol_name, split_protocol

ZEROSHOT_PROTOCOLS = ("zeroshot", "zeroshot_focus")
FOCUS_SCALE = 100.0
DEFAULTS: dict = {"batch_size": 64, "device": "auto", "regimes": ("u-u",)}
FAMILIES = ("clip", "siglip")


# --- scoring (pure functions on embeddings) -------------------------------------------------------------------
def l2_normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    if (norm == 0).any():
        raise ValueError("zero-norm embedding: cannot L2-normalise")
    return x / norm


def class_embedding(text_embeddings: np.ndarray) -> np.ndarray:
    """One class's embedding from its texts' embeddings [T, D]: mean of the L2-normalised rows, renormalised."""
    return l2_normalize(l2_normalize(text_embeddings).mean(axis=0))


def cosine(image_emb: np.ndarray, class_emb: np.ndarray) -> np.ndarray:
    """[N, C] cosine similarities (both sides L2-normalised here)."""
    return l2_normalize(image_emb) @ l2_normalize(class_emb).T


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def focus_proba(image_emb: np.ndarray, class_emb: np.ndarray, scale: float = FOCUS_SCALE) -> np.ndarray:
    """FOCUS's zero-shot probabilities: softmax over classes of 100 × cosine similarity."""
    return _softmax(scale * cosine(image_emb, class_emb))


def native_proba(image_emb: np.ndarray, class_emb: np.ndarray, logit_scale: float,
                 logit_bias: float | None = None) -> np.ndarray:
    """The model's own head: ``logit_scale`` is the *multiplier* (exp of the stored log-scale).

    CLIP family (``logit_bias`` None): softmax(logit_scale · cos). SigLIP family: per-class sigmoid(logit_scale ·
    cos + logit_bias), normalised to sum to 1 over the classes (in log space: a sigmoid near 0 stays exact)."""
    logits = float(logit_scale) * cosine(image_emb, class_emb)
    if logit_bias is None:
        return _softmax(logits)
    from scipy.special import log_expit
    return _softmax(log_expit(logits + float(logit_bias)))


def embed_images(dual: DualEncoder, images: np.ndarray, *, rows: np.ndarray | None = None, batch_size: int = 64,
                 device: str = "auto", prepare: Callable | None = None) -> np.ndarray:
    """Image embeddings [N, D] (float32, not normalised) of uint8 NHWC images (``rows``: only these rows, in this
    order; a memory-mapped cache is then read one batch at a time); bf16 autocast on CUDA. ``prepare``: the
    model's own processor (``inputs: native``, :func:`retinabench.protocols.native_inputs.dual_processor`) turning
    a batch of ``images`` (decoded originals) into pixel values, instead of resizing the cache."""
    import torch

    from retinabench.features.extract import pick_device, to_model_input
    dev = pick_device(device)
    dual.to(dev)
    dual.module.eval()
    rows = np.arange(len(images)) if rows is None else np.asarray(rows, dtype=np.int64)
    out = []
    with torch.inference_mode():
        for start in range(0, len(rows), batch_size):
            batch = images[rows[start:start + batch_size]]
            x = prepare(batch).to(dev) if prepare is not None else to_model_input(batch, dual, dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                emb = dual.encode_image(x)
            out.append(emb.float().cpu().numpy())
    emb = np.concatenate(out) if out else np.zeros((0, 0), np.float32)
    if not np.isfinite(emb).all():
        raise FloatingPointError(f"{dual.name}: non-finite image embedding")
    return emb


def class_embeddings(dual: DualEncoder, prompts: ZeroShotPrompts, siglip_text_padding: str = "max_length"
                     ) -> np.ndarray:
    """[C, D] class embeddings of one prompt set (texts ensembled per class), in the task's class order.

    ``siglip_text_padding`` (``zeroshot.siglip_text_padding``; a transformers SigLIP only): ``max_length`` (ours:
    each class's texts, every text padded to the text tower's length, as SigLIP was trained) or ``focus`` (FOCUS's
    ``HFSiglipModel.get_text_embeddings``: every class's texts tokenised in one call with padding=True, the shorter
    ones padded to the longest, and the tokenizer's attention mask passed on). FLAIR (``pads_jointly``: its padding
    positions enter the text embedding) pads each call's texts to the longest: ``max_length`` = one call per class
    (FLAIR's own ``compute_text_embeddings``), ``focus`` = every class's texts in one call (FOCUS's ``HFFLAIR``)."""
    import torch
    if siglip_text_padding not in ("max_length", "focus"):
        raise ValueError(f"zeroshot.siglip_text_padding must be max_length or focus, got {siglip_text_padding!r}")
    with torch.inference_mode():
        if siglip_text_padding == "focus" and (dual.family == "siglip" or dual.pads_jointly):
            texts = [t for class_texts in prompts.texts for t in class_texts]
            emb = dual.encode_text(texts, padding="focus").float().cpu().numpy()
            ends = np.cumsum([len(t) for t in prompts.texts])
            return np.stack([class_embedding(e) for e in np.split(emb, ends[:-1])])
        return np.stack([class_embedding(dual.encode_text(list(texts)).float().cpu().numpy())
                         for texts in prompts.texts])


# --- predictions ----------------------------------------------------------------------------------------------
def regime_queries(split: pd.DataFrame, regimes: Sequence[str]) -> list[tuple[str, str, pd.DataFrame]]:
    """(regime, split part, rows) for each regime: validation rows of the training choice and the test rows."""
    from retinabench.data.splits import regime_rows
    from retinabench.regimes import Regime
    out = []
    for regime in regimes:
        parsed = Regime.parse(regime)
        out.append((regime, "val", regime_rows(split, "val", parsed.train_balanced)))
        out.append((regime, "test", regime_rows(split, "test", parsed.test_balanced)))
    return out


def zeroshot_predictions(image_ids: Sequence[str], image_emb: np.ndarray, split: pd.DataFrame, task: dict,
                         encoder: str, class_emb: dict[str, np.ndarray], *, logit_scale: float,
                         logit_bias: float | None, default_set: str, regimes: Sequence[str] = ("u-u",)
                         ) -> pd.DataFrame:
    """Predictions (the shared schema + ``prompt_set``) of both scorings for every prompt set in ``class_emb``."""
    from retinabench.protocols.common import predictions_frame
    classes = list(task["classes"])
    row_of = {i: k for k, i in enumerate(image_ids)}
    frames = []
    for regime, part, rows in regime_queries(split, regimes):
        missing = [i for i in rows["image_id"] if i not in row_of]
        if missing:
            raise KeyError(f"zero-shot {encoder}/{task['name']}: {len(missing)} {part} images have no embedding, "
                           f"e.g. {missing[:3]}")
        emb = image_emb[[row_of[i] for i in rows["image_id"]]]
        for set_name, cls_emb in class_emb.items():
            if cls_emb.shape[0] != len(classes):
                raise ValueError(f"prompt set {set_name!r}: {cls_emb.shape[0]} class embeddings for {classes}")
            for base, proba in (("zeroshot_focus", focus_proba(emb, cls_emb)),
                                ("zeroshot", native_proba(emb, cls_emb, logit_scale, logit_bias))):
                df = predictions_frame(rows["image_id"], rows["y"], proba, classes, dataset=task["dataset"],
                                       task=task["name"], encoder=encoder,
                                       protocol=protocol_name(base, set_name, default_set), seed=0, regime=regime,
                                       split=part)
                frames.append(df.assign(prompt_set=set_name))
    return pd.concat(frames, ignore_index=True)


def run_zeroshot(dual: DualEncoder, images: np.ndarray, image_ids: Sequence[str], split: pd.DataFrame, task: dict,
                 prompts: PromptRegistry, *, prompt_sets: Iterable[str] | None = None,
                 regimes: Sequence[str] = ("u-u",), batch_size: int = 64, device: str = "auto",
                 siglip_text_padding: str = "max_length", prepare: Callable | None = None) -> pd.DataFrame:
    """Zero-shot predictions of one (dual encoder, task): every prompt set of the task (or ``prompt_sets``),
    both scorings (SigLIP prompts padded by ``siglip_text_padding``, :func:`class_embeddings`). ``images``: uint8 NHWC aligned with ``image_ids`` (e.g. the memory-mapped image cache); only
    the images of the needed validation / test rows are embedded, once."""
    sets = list(prompt_sets) if prompt_sets is not None else prompts.sets_for("zeroshot", task)
    if not sets:
        raise KeyError(f"no zeroshot prompt set covers task {task['name']!r} (harmonised {task.get('harmonised')!r})")
    needed = pd.unique(pd.concat([rows["image_id"] for _, _, rows in regime_queries(split, regimes)]))
    index = {i: k for k, i in enumerate(image_ids)}
    lacking = [i for i in needed if i not in index]
    if lacking:
        raise KeyError(f"zero-shot {dual.name}/{task['name']}: {len(lacking)} split images are not among the "
                       f"images given, e.g. {lacking[:3]}")
    order = np.sort(np.fromiter((index[i] for i in needed), dtype=np.int64, count=len(needed)))
    emb = embed_images(dual, images, rows=order, batch_size=batch_size, device=device, prepare=prepare)
    cls = {s: class_embeddings(dual, prompts.zeroshot(s, task), siglip_text_padding) for s in sets}
    return zeroshot_predictions([image_ids[k] for k in order], emb, split, task, dual.name, cls,
                                logit_scale=dual.logit_scale, logit_bias=dual.logit_bias,
                                default_set=prompts.default("zeroshot"), regimes=regimes)


def ece_difference(predictions: pd.DataFrame, tasks: dict[str, dict], n_bins: int = 10) -> pd.DataFrame:
    """Per (dataset, task, encoder, prompt set, regime, split): ECE of ``zeroshot_focus`` (×100 softmax), of
    ``zeroshot`` (the model's own head) and their difference ``ece_focus − ece_native`` — how much FOCUS's fixed
    scale decides the calibration it reports. ECE: binary positive-class for two classes, top-label otherwise
    (retinabench.metrics.calibration.ece, as the reliability layer)."""
    from retinabench.metrics.calibration import ece
    keys = ["dataset", "task", "encoder", "prompt_set", "regime", "split"]
    cols = [*keys, "ece_focus", "ece_native", "ece_diff", "n"]
    p = predictions.copy()
    parts = p["protocol"].map(split_protocol)
    p["base"] = [b for b, _ in parts]
    p = p[p["base"].isin(ZEROSHOT_PROTOCOLS)]
    if "prompt_set" not in p.columns:
        p["prompt_set"] = [s or "default" for _, s in parts[p.index]]
    rows = []
    for key, g in p.groupby(keys, sort=True):
        pcols = [f"p_{c}" for c in tasks[key[1]]["classes"]]
        vals = {}
        for base, name in (("zeroshot_focus", "ece_focus"), ("zeroshot", "ece_native")):
            s = g[g["base"] == base].sort_values("image_id")
            vals[name] = ece(s["y_true"].to_numpy(), s[pcols].to_numpy(dtype=np.float64), n_bins) if len(s) else np.nan
            vals["n"] = len(s)
        rows.append({**dict(zip(keys, key)), **vals, "ece_diff": vals["ece_focus"] - vals["ece_native"]})
    return pd.DataFrame(rows, columns=cols)


# --- the pipeline job ---------------------------------------------------------------------------------------------
def run(entry: dict, inputs: Sequence, prompts: PromptRegistry, settings=None, *, weights: str | Path | None = None,
        log: Callable[[str], None] = print) -> pd.DataFrame:
    """One zero-shot job: the dual encoder of registry ``entry`` loaded once (strictly, from its locked files or
    the local folder ``weights``), then every task of ``inputs`` (:class:`~retinabench.protocols.interfaces.TaskInput`)
    under each of its prompt sets and both scorings. Returns one predictions table (the shared schema +
    ``prompt_set``), checked against the schema; ``settings``: a
    :class:`~retinabench.protocols.interfaces.ZeroShotSettings` or its config section."""
    from retinabench.protocols.interfaces import ZeroShotSettings, finish_predictions
    from retinabench.protocols.native_inputs import check_images, dual_processor
    s = ZeroShotSettings.of(settings, "zeroshot")
    dual = load_dual_encoder(entry, weights=weights)
    proc = dual_processor(entry, dual, weights) if s.inputs == "native" else None
    record = proc.record() if proc is not None else {"mode": "cache"}
    log(f"zeroshot {entry['name']}: inputs {record}")
    log(f"zeroshot {entry['name']}: {dual.family} head, logit_scale {dual.logit_scale:.4g}"
        + ("" if dual.logit_bias is None else f", logit_bias {dual.logit_bias:.4g}, text padding "
                                              f"{s.siglip_text_padding}")
        + f"; {len(inputs)} task(s)")
    frames = []
    for ti in inputs:
        check_images(s.inputs, ti.images, f"zeroshot {entry['name']}/{ti.task['name']}")
        preds = run_zeroshot(dual, ti.images, ti.image_ids, ti.split, ti.task, prompts, prompt_sets=s.prompt_sets,
                             regimes=s.regimes, batch_size=s.batch_size, device=s.device,
                             siglip_text_padding=s.siglip_text_padding, prepare=proc)
        log(f"zeroshot {entry['name']}/{ti.task['name']}: {preds['protocol'].nunique()} protocol(s) "
            f"{sorted(preds['protocol'].unique())}, {len(preds)} rows")
        frames.append(preds)
    out = finish_predictions(frames, f"zeroshot {entry['name']}")
    out.attrs["inputs"] = record  # the stage's provenance
    return out

"""Tiny random models built from configs, offline: the stand-ins the tests, the benchmarks and the demo load
through the *same* loaders users run (no hub, no download).

- :func:`tiny_tokenizer`: a ``tokenizers`` WordLevel vocabulary (special tokens + the handful of words the tests
  use, ``yes``/``no``/``Yes``/``No`` among them), whitespace pre-tokenizer, wrapped in ``PreTrainedTokenizerFast``
  with a small Jinja chat template. ``YES`` is deliberately *not* in the vocabulary (it encodes to ``<unk>``: a
  variant that must not count), and ``Yes.`` / ``no,`` are single tokens (the parser must read them).
- :func:`build_tiny_llava` / :func:`build_tiny_qwen2_vl` / :func:`build_tiny_llava_next` /
  :func:`build_tiny_gemma3`: image-text-to-text models (2-layer vision and text towers, 32-px images) saved with
  their processor to a folder: ``load_mllm(entry, weights=folder)``. LLaVA-NeXT and Gemma 3 are the
  architectures of FOCUS's LLaVA-NeXT-8B and Gemma-3 / MedGemma models (Qwen3-VL: bench/gpu_check_interfaces.py
  --smoke builds a reduced one).
- :func:`build_tiny_open_clip` (a registered custom open_clip config + the bundled BPE tokenizer) and
  :func:`build_tiny_siglip` / :func:`build_tiny_hf_clip` (transformers dual encoders with a WordLevel tokenizer):
  ``load_dual_encoder(entry, weights=...)``.

Each builder returns the registry-style entry that describes the model (the loaders read only the entry and the
files), so a test, the benchmark and the demo configure the tiny model exactly as a real one.
``python -m retinabench.models.tiny OUT`` writes all of them under ``OUT`` (the demo's models).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from retinabench.atomic import write_text_atomic

WORDS = tuple(("yes no Yes No Yes. No. yes. no. yes, no, yesterday maybe I cannot tell the a an of is in this image "
         "eye retina fundus photograph photo healthy disease diabetic retinopathy glaucoma with without signs "
         "referable show shows does Does answer Answer : . , ? ! Based on respond only or").split())
SPECIAL = ("<pad>", "<unk>", "<s>", "</s>", "<image>", "<|user|>", "<|assistant|>", "<|system|>",
           "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# Roles and images as whitespace-separated tokens; the generation prompt ends with the assistant tag.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|> ' }}"
    "{% if m['content'] is string %}{{ m['content'] + ' ' }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}{{ image_placeholder + ' ' }}{% elif c['type'] == 'text' %}{{ c['text'] + ' ' }}"
    "{% endif %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


def tiny_tokenizer(image_placeholder: str = "<image>", words=WORDS, model: str = "wordlevel",
                   named: dict[str, str] | None = None):
    """A PreTrainedTokenizerFast over ``SPECIAL + words``. ``model="wordpiece"`` adds ``YE`` + ``##S`` so that
    ``YES`` encodes as two tokens (a multi-token variant). ``named``: model-specific special tokens by attribute
    name (Gemma 3's ``boi_token`` / ``eoi_token`` / ``image_token``), added to the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    named = dict(named or {})
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*SPECIAL, *named.values(), *words]))}
    if model == "wordpiece":
        for extra in ("YE", "##S"):
            vocab.setdefault(extra, len(vocab))
        tk = Tokenizer(models.WordPiece(vocab, unk_token="<unk>", max_input_chars_per_word=64))
        tk.decoder = decoders.WordPiece()
    else:
        tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>", padding_side="left", **named)
    # Registered as special tokens: otherwise a run of image tokens is not split into single tokens.
    tok.add_special_tokens({"additional_special_tokens": [*SPECIAL[4:], *named.values()]})
    tok.chat_template = CHAT_TEMPLATE.replace("image_placeholder", repr(image_placeholder))
    return tok


def _entry(name: str, **fields) -> dict:
    base = {"name": name, "domain": "none", "method": "random tiny model (tests)", "size_class": "tiny",
            "gated": False, "licence": "-", "params_m": 0.1}
    return base | fields


# --- multimodal LLMs -----------------------------------------------------------------------------------------------
def _tiny_llama(vocab: int, hidden: int = 32, layers: int = 2, **kw):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0,
                       bos_token_id=2, eos_token_id=3, **kw)


def filler_words(n: int) -> tuple[str, ...]:
    """``n`` extra vocabulary entries (``w0`` ...): a realistic vocabulary size for the full-softmax cost."""
    return tuple(f"w{i}" for i in range(n))


def build_tiny_llava(folder: str | Path, seed: int = 0, *, text_hidden: int = 32, text_layers: int = 2,
                     vision_hidden: int = 32, vision_layers: int = 2, image_size: int = 32, vocab: int = 0) -> dict:
    """A 2+2-layer LLaVA (CLIP vision tower, 32-px images, patch 8: 16 image tokens) saved with its processor.
    The keyword arguments scale it up (the benchmark's larger random config); ``vocab`` pads the WordLevel
    vocabulary with filler words to that size."""
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor)
    folder = Path(folder)
    tok = tiny_tokenizer("<image>", words=WORDS + filler_words(max(0, vocab - len(SPECIAL) - len(WORDS))))
    torch.manual_seed(seed)
    vision = CLIPVisionConfig(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                              num_hidden_layers=vision_layers, num_attention_heads=4, image_size=image_size,
                              patch_size=8, projection_dim=vision_hidden)
    cfg = LlavaConfig(  # type: ignore[call-arg]  # pad_token_id: accepted, not in the signature
        vision_config=vision, text_config=_tiny_llama(len(tok), text_hidden, text_layers),
        image_token_index=tok.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1, pad_token_id=0)
    model = LlavaForConditionalGeneration(cfg).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 3
    improc = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
                                image_mean=[0.5] * 3, image_std=[0.5] * 3)
    proc = LlavaProcessor(image_processor=improc, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, chat_template=tok.chat_template)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return _entry("tiny_llava", source="transformers", architecture="tiny LLaVA (random)", interfaces=["mllm"],
                  hf_config={"model_type": "llava"}, hf_full_class="LlavaForConditionalGeneration")


def build_tiny_qwen2_vl(folder: str | Path, seed: int = 0) -> dict:
    """A 2+2-layer Qwen2-VL (patch 14, merge 2, 28..56-px images) saved with its processor."""
    from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor,
                              Qwen2VLProcessor)
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    folder = Path(folder)
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    tok = tiny_tokenizer(placeholder)
    torch.manual_seed(seed)
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                      "<|vision_end|>")}
    # head_dim 16: the rotary half-dimension (8) is what mrope_section splits
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                rope_scaling={"type": "mrope", "mrope_section": [2, 2, 4]}, pad_token_id=0, bos_token_id=2,
                eos_token_id=3)
    vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    cfg = Qwen2VLConfig(  # type: ignore[call-arg]  # pad_token_id: accepted, not in the signature
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], pad_token_id=0)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 3
    improc = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2,
                                   temporal_patch_size=2)
    proc = Qwen2VLProcessor(image_processor=improc, tokenizer=tok, video_processor=Qwen2VLVideoProcessor(),
                            chat_template=tok.chat_template)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return _entry("tiny_qwen2_vl", source="transformers", architecture="tiny Qwen2-VL (random)",
                  interfaces=["mllm"], hf_config={"model_type": "qwen2_vl"},
                  hf_full_class="Qwen2VLForConditionalGeneration")


def build_tiny_llava_next(folder: str | Path, seed: int = 0) -> dict:
    """A 2+2-layer LLaVA-NeXT (any-resolution tiles over 32-px crops, grid pinpoints 32x32 / 32x64 / 64x32) saved
    with its processor: the architecture of FOCUS's LLaVA-NeXT-8B."""
    from transformers import (CLIPVisionConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,
                              LlavaNextImageProcessor, LlavaNextProcessor)
    folder = Path(folder)
    tok = tiny_tokenizer("<image>")
    torch.manual_seed(seed)
    pins = [[32, 32], [32, 64], [64, 32]]
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=32, patch_size=8, projection_dim=32)
    cfg = LlavaNextConfig(  # type: ignore[call-arg]  # pad_token_id: accepted, not in the signature
        vision_config=vision, text_config=_tiny_llama(len(tok)),
        image_token_index=tok.convert_tokens_to_ids("<image>"), image_grid_pinpoints=pins,
        vision_feature_select_strategy="default", vision_feature_layer=-1, pad_token_id=0)
    model = LlavaNextForConditionalGeneration(cfg).eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 3
    improc = LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                     image_grid_pinpoints=pins, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    proc = LlavaNextProcessor(image_processor=improc, tokenizer=tok, patch_size=8,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=tok.chat_template)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return _entry("tiny_llava_next", source="transformers", architecture="tiny LLaVA-NeXT (random)",
                  interfaces=["mllm"], hf_config={"model_type": "llava_next"},
                  hf_full_class="LlavaNextForConditionalGeneration")


def build_tiny_gemma3(folder: str | Path, seed: int = 0) -> dict:
    """A 2+2-layer Gemma 3 (SigLIP vision tower, 32-px images pooled to 4 soft tokens) saved with its processor:
    the architecture of FOCUS's Gemma-3 / MedGemma models. Its tokenizer carries Gemma's named image tokens."""
    from transformers import (Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor,
                              Gemma3Processor)
    folder = Path(folder)
    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tok = tiny_tokenizer("<start_of_image>", named=named)
    torch.manual_seed(seed)
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, sliding_window=16, max_position_embeddings=512, pad_token_id=0,
                bos_token_id=2, eos_token_id=3)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8)
    cfg = Gemma3Config(  # type: ignore[call-arg]  # pad_token_id: accepted, not in the signature
        text_config=text, vision_config=vision, mm_tokens_per_image=4,
        image_token_index=tok.convert_tokens_to_ids(named["image_token"]),
        boi_token_index=tok.convert_tokens_to_ids(named["boi_token"]),
        eoi_token_index=tok.convert_tokens_to_ids(named["eoi_token"]), pad_token_id=0)
    model = Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # Gemma 3 initialises its image projection to zero: images would not matter at all
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.2)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 3
    improc = Gemma3ImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                  do_pan_and_scan=False)
    proc = Gemma3Processor(image_processor=improc, tokenizer=tok, chat_template=tok.chat_template, image_seq_length=4)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return _entry("tiny_gemma3", source="transformers", architecture="tiny Gemma 3 (random)", interfaces=["mllm"],
                  hf_config={"model_type": "gemma3"}, hf_full_class="Gemma3ForConditionalGeneration")


# --- dual encoders -------------------------------------------------------------------------------------------------
TINY_OPEN_CLIP = "rb-tiny-clip"
_OPEN_CLIP_CFG = {"embed_dim": 16, "quick_gelu": True,
                  "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 16, "head_width": 16},
                  "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


def register_tiny_open_clip(folder: str | Path) -> str:
    """Register the tiny open_clip model config (idempotent); returns its architecture name."""
    import open_clip
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / f"{TINY_OPEN_CLIP}.json", json.dumps(_OPEN_CLIP_CFG))
    open_clip.add_model_config(folder)
    return TINY_OPEN_CLIP


def build_tiny_open_clip(folder: str | Path, seed: int = 0) -> dict:
    """A ~2M-parameter open_clip CLIP (bundled BPE tokenizer); weights saved as open_clip_model.safetensors."""
    import open_clip
    from safetensors.torch import save_file
    folder = Path(folder)
    arch = register_tiny_open_clip(folder / "model_configs")
    torch.manual_seed(seed)
    model = open_clip.create_model(arch, pretrained=None).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    return _entry("tiny_open_clip", source="open_clip", architecture=arch, interfaces=["features", "zeroshot"],
                  weights_file="open_clip_model.safetensors", keep_prefix="visual.", input_size=32,
                  normalization="clip", pooling="cls", embed_dim=32)


def _dual_tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = None
    tok.padding_side = "right"
    return tok


SPIECE_TEXT = ("a fundus photograph of diabetic retinopathy", "a retinal image of a healthy eye with no disease",
               "glaucoma referable macular edema optic disc cup", "an image showing signs of retinopathy")


def sentencepiece_tokenizer(folder: Path, vocab_size: int = 48):
    """A SigLIP tokenizer over a SentencePiece model trained here on a few prompt words (``spiece.model`` +
    ``tokenizer_config.json`` only, as google/siglip-* and MedSigLIP publish it: transformers needs the
    sentencepiece and protobuf packages to read it)."""
    import sentencepiece as spm
    from transformers import SiglipTokenizer
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "spiece_corpus.txt"
    write_text_atomic(corpus, "\n".join(SPIECE_TEXT * 20))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "spiece"), vocab_size=vocab_size,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   hard_vocab_limit=False, minloglevel=2, num_threads=1)
    for f in (corpus, folder / "spiece.vocab"):
        f.unlink()
    return SiglipTokenizer(vocab_file=str(folder / "spiece.model"), model_max_length=16)


def build_tiny_siglip(folder: str | Path, seed: int = 0, *, tokenizer: str = "wordlevel") -> dict:
    """A 1+1-layer transformers SigLIP (28-px images) + tokenizer + processor file, saved to ``folder``;
    ``tokenizer``: ``wordlevel`` (tokenizer.json) or ``sentencepiece`` (spiece.model, the published SigLIP form)."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel
    folder = Path(folder)
    tok = _dual_tokenizer() if tokenizer == "wordlevel" else sentencepiece_tokenizer(folder)
    torch.manual_seed(seed)
    cfg: dict[str, Any] = dict(
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        text_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=len(tok), max_position_embeddings=16, pad_token_id=0, bos_token_id=2,
                         eos_token_id=3))
    SiglipModel(SiglipConfig(**cfg)).eval().save_pretrained(folder)
    SiglipImageProcessor(size={"height": 28, "width": 28}, image_mean=[0.5] * 3,
                         image_std=[0.5] * 3).save_pretrained(folder)
    tok.save_pretrained(folder)
    return _entry("tiny_siglip", source="transformers", architecture="tiny SigLIP (random)",
                  interfaces=["features", "zeroshot"], hf_config={"model_type": "siglip", **cfg},
                  hf_class="SiglipVisionModel", hf_full_class="SiglipModel", hf_checkpoint_class="SiglipModel",
                  drop_keys=["text_model.*", "logit_scale", "logit_bias"], input_size=28, normalization="inception",
                  pooling="pooler", embed_dim=32)


def build_tiny_hf_clip(folder: str | Path, seed: int = 0) -> dict:
    """A 1+1-layer transformers CLIP (32-px images) + WordLevel tokenizer + processor file."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    folder = Path(folder)
    tok = _dual_tokenizer()
    torch.manual_seed(seed)
    cfg: dict[str, Any] = dict(
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=16),
        text_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=len(tok), max_position_embeddings=16, pad_token_id=0, bos_token_id=2,
                         eos_token_id=3),
        projection_dim=16)
    CLIPModel(CLIPConfig(**cfg)).eval().save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    tok.save_pretrained(folder)
    return _entry("tiny_hf_clip", source="transformers", architecture="tiny CLIP (random)",
                  interfaces=["features", "zeroshot"], hf_config={"model_type": "clip", **cfg},
                  hf_class="CLIPVisionModel", hf_full_class="CLIPModel", hf_checkpoint_class="CLIPModel",
                  drop_keys=["text_model.*", "text_projection.*", "visual_projection.*", "logit_scale"],
                  input_size=32, normalization="clip", pooling="pooler", embed_dim=32)


BUILDERS = {"tiny_llava": build_tiny_llava, "tiny_qwen2_vl": build_tiny_qwen2_vl,
            "tiny_llava_next": build_tiny_llava_next, "tiny_gemma3": build_tiny_gemma3,
            "tiny_open_clip": build_tiny_open_clip, "tiny_siglip": build_tiny_siglip,
            "tiny_hf_clip": build_tiny_hf_clip}


def build_all(out: str | Path) -> dict[str, dict]:
    """Every tiny model under ``out/<name>/``; returns name -> entry (``weights`` = that folder or file)."""
    out = Path(out)
    entries = {}
    for name, build in BUILDERS.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        entry = build(folder)
        entry["weights"] = str(folder / entry["weights_file"]) if entry["source"] == "open_clip" else str(folder)
        entries[name] = entry
    write_text_atomic(out / "entries.json", json.dumps(entries, indent=1))
    return entries


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m retinabench.models.tiny OUT_DIR", file=sys.stderr)
        return 2
    for name, e in build_all(argv[0]).items():
        print(f"{name}: {e['weights']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

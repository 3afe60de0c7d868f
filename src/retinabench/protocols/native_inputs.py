"""Model-native inputs of the prompt-based interfaces (``zeroshot.inputs`` / ``mllm.inputs``).

Two input pipelines, each a named option:

* ``cache`` (config/config.yaml's default): the dataset's image cache (``image_cache``: 224 px squash by default),
  the pixels every vision encoder of the frozen protocols sees; a dual encoder resizes it bicubically to its input
  size and normalises it (:func:`retinabench.features.extract.to_model_input`), an MLLM's processor gets the cached
  array;
* ``native`` (FOCUS, config/focus.yaml): the ORIGINAL file, decoded by the project's one decoder
  (:func:`retinabench.data.readers.decode_image`: 8-bit RGB, EXIF orientation applied) and handed as a PIL image to
  the model's own processor, which resizes / crops / tiles it as it defines (SigLIP: resize to its size; CLIP:
  shortest edge + centre crop; Qwen2-VL: smart resize between its min / max pixels, a dynamic patch grid; LLaVA-NeXT:
  anyres tiles). FOCUS: PIL open + RGB conversion, no EXIF transpose (retina_bench/core/data.py ``get_image``) passed to
  ``processor(images=...)`` (retina_bench/vlms/models.py ``HFCLIPModel`` / ``HFSiglipModel``; the MLLM wrappers of
  retina_bench/mllms/models.py).

:class:`OriginalImages` is the lazy sequence of decoded originals a :class:`~retinabench.protocols.interfaces.
TaskInput` carries in native mode (decoded batch by batch as the job reaches them: nothing is held whole, nothing is
written). What the processor made of an image is identified by :func:`inputs_key`: the sha256 of the processor's
configuration (a transformers image processor's ``to_dict()``, open_clip's preprocess config) and of the decoder's
source (:func:`decoder_version`); the job records it in its provenance, and any cache of processed inputs must be
keyed by it. Importing this module imports no torch.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

INPUT_MODES = ("cache", "native")


def decoder_version() -> str:
    """The decoder's identity: sha256 of retinabench.data.readers' source (any change to how a file is decoded
    changes it)."""
    from retinabench.data import readers
    return hashlib.sha256(Path(readers.__file__).read_bytes()).hexdigest()


def inputs_key(processor_config: dict) -> str:
    """sha256 of a processor's configuration and the decoder version: the key of what a processor makes of an
    original file (equal configurations give equal keys, whatever their key order)."""
    blob = json.dumps({"processor": processor_config, "decoder": decoder_version()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class OriginalImages:
    """The original files of ``image_ids`` (``paths``, aligned), decoded on access by
    :func:`~retinabench.data.readers.decode_image` to 8-bit RGB PIL images: ``images[k]`` one image,
    ``images[rows]`` (a slice or an integer array) a list of them."""

    def __init__(self, paths: Sequence[str | os.PathLike]):
        self.paths = [Path(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def _one(self, k: int):
        from retinabench.data.readers import decode_image
        return decode_image(self.paths[int(k)]).image

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            return self._one(int(key))
        if isinstance(key, slice):
            return [self._one(k) for k in range(*key.indices(len(self)))]
        return [self._one(k) for k in np.asarray(key, dtype=np.int64).reshape(-1)]


def original_images(manifest: pd.DataFrame, dataset: str, root: str | os.PathLike) -> tuple[list[str],
                                                                                           OriginalImages]:
    """The image ids of ``dataset``'s manifest rows and their original files under ``root`` (the manifest's
    ``path`` is relative to the dataset's raw folder), as the image cache indexes them; a missing file is an
    error naming it before any model runs."""
    rows = manifest[manifest["dataset"] == dataset] if "dataset" in manifest.columns else manifest
    rows = rows.drop_duplicates("image_id")
    if rows.empty:
        raise KeyError(f"native inputs: the manifest has no rows of dataset {dataset!r}")
    paths = [Path(root) / p for p in rows["path"]]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"native inputs: {len(missing)} original image(s) of dataset {dataset!r} are not under "
                                f"{root}, e.g. {missing[:3]}")
    return [str(i) for i in rows["image_id"]], OriginalImages(paths)


def check_images(mode: str, images: Any, where: str) -> None:
    """The images a task carries must be those of the job's input mode: original files for ``native``, a uint8
    array (the image cache) for ``cache``."""
    if mode not in INPUT_MODES:
        raise ValueError(f"{where}: inputs must be one of {INPUT_MODES}, got {mode!r}")
    native = isinstance(images, OriginalImages)
    if mode == "native" and not native:
        raise ValueError(f"{where}: inputs native needs the original images (OriginalImages, from the dataset's raw "
                         f"files); got {type(images).__name__} (the image cache?)")
    if mode == "cache" and native:
        raise ValueError(f"{where}: inputs cache needs the image cache (uint8 NHWC); got the original images")


def image_processor_config(processor) -> dict:
    """A transformers processor's image-processor configuration (``to_dict()``: size, crop, resample, min / max
    pixels, normalisation, its class)."""
    improc = getattr(processor, "image_processor", processor)
    return {"class": type(improc).__name__, **improc.to_dict()}


@dataclass(frozen=True)
class NativeProcessor:
    """A dual encoder's own image processor: ``fn`` maps a list of PIL images to pixel values [B, C, H, W];
    ``config`` describes it (:func:`inputs_key`)."""

    name: str
    config: dict
    fn: Callable

    @property
    def key(self) -> str:
        return inputs_key(self.config)

    def __call__(self, images):
        return self.fn(list(images))

    def record(self) -> dict:
        return {"mode": "native", "processor": self.name, "key": self.key, "decoder": decoder_version()}


def mllm_inputs_record(mode: str, processor) -> dict:
    """What an MLLM job records of its inputs: the mode and, for ``native``, its processor's class and
    :func:`inputs_key` (the processor itself resizes each original inside the prompt's processing)."""
    if mode != "native":
        return {"mode": mode}
    cfg = image_processor_config(processor)
    return {"mode": "native", "processor": cfg["class"], "key": inputs_key(cfg), "decoder": decoder_version()}


def _hf_image_processor(entry: dict, weights) -> NativeProcessor:
    import tempfile

    from transformers import AutoImageProcessor

    from retinabench.models.sources import weight_files
    files, _ = weight_files(entry, weights)
    if "preprocessor_config.json" not in files:
        raise ValueError(f"encoder {entry['name']!r}: inputs native needs its preprocessor_config.json among the "
                         f"pinned files (has {sorted(files)})")
    with tempfile.TemporaryDirectory(prefix="retinabench-proc-") as tmp:  # exactly the verified file
        (Path(tmp) / "preprocessor_config.json").symlink_to(Path(files["preprocessor_config.json"]).resolve())
        improc = AutoImageProcessor.from_pretrained(tmp, local_files_only=True)
    cfg = image_processor_config(improc)
    return NativeProcessor(type(improc).__name__, cfg,
                           lambda ims: improc(images=ims, return_tensors="pt")["pixel_values"])


def _open_clip_preprocess(entry: dict, module) -> NativeProcessor:
    import torch
    from open_clip.transform import PreprocessCfg, image_transform_v2

    from retinabench.models.preprocess import resolve_normalization
    mean, std = resolve_normalization(entry)  # the checkpoint's statistics (pretrained=None keeps the config's)
    cfg = dict(module.visual.preprocess_cfg, mean=tuple(mean), std=tuple(std))
    transform = image_transform_v2(PreprocessCfg(**cfg), is_train=False)
    return NativeProcessor("open_clip.image_transform_v2", {"class": "open_clip", **cfg},
                           lambda ims: torch.stack([transform(im) for im in ims]))


def dual_processor(entry: dict, dual, weights=None) -> NativeProcessor:
    """The dual encoder's own image processor: a transformers entry's ``AutoImageProcessor`` from its pinned
    ``preprocessor_config.json``; an open_clip entry's evaluation transform (``image_transform_v2`` of the model's
    preprocess config, the entry's normalisation). Another source has no processor here: an error."""
    source = entry.get("source")
    if source == "transformers":
        return _hf_image_processor(entry, weights)
    if source == "open_clip":
        return _open_clip_preprocess(entry, dual.module)
    raise ValueError(f"encoder {entry['name']!r}: inputs native knows no image processor for source {source!r} "
                     "(transformers, open_clip); run it with inputs: cache")

"""What the dual encoders with their own text tower share (RET-CLIP and FLAIR, :mod:`~retinabench.models._ret_clip`,
:mod:`~retinabench.models._flair`): the text tower's files, verified like weights, a BERT built by transformers
from a config, and the strict load of the whole published checkpoint.

An entry's ``text_tower`` says where the files its weights file lacks come from (the tokenizer's vocabulary, a
BERT config): ``hub_id`` (a second Hugging Face repo; revision and sha256 in the entry's lock record,
``text_tower`` part) or ``url`` (one file, downloaded by ``retinabench lock-encoders`` into the entry's weights
folder, ``text_tower/``). With local ``weights`` (a file or folder in the published layout) the text tower's files
are the ``text_tower/`` folder beside them; their sha256 is recorded, not checked, as for the weights.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from retinabench.hashing import sha256_file
from retinabench.models._checkpoints import StateDictAdapter, prepare_state_dict, read_state_dict
from retinabench.models.hub import hub_errors
from retinabench.models.strict import KeyReport, WeightsError, load_state_dict_strict, verify_sha256
from retinabench.registry.lockfile import LockError, is_glob, text_tower_dir, verified_record


def text_tower_files(entry: dict, weights: str | Path | None = None) -> tuple[dict[str, Path], dict]:
    """The text tower's files (name -> path), verified against the lock record, and their provenance."""
    tt = entry["text_tower"]
    what = f"encoder {entry['name']!r}"
    if weights is not None:
        w = Path(weights).expanduser()
        folder = (w if w.is_dir() else w.parent) / "text_tower"
        if not folder.is_dir():
            raise WeightsError(f"{what}: local weights {w} need the text tower's files ({tt['files']}) in {folder}")
        files = {f.name: f for f in sorted(folder.iterdir()) if f.is_file()}
        prov = {"origin": "local file", "files": {k: sha256_file(v) for k, v in files.items()}}
    else:
        try:
            record = (verified_record(entry) or {}).get("text_tower")
        except LockError as err:
            raise WeightsError(str(err)) from err
        if not record:
            raise WeightsError(f"{what}: its lock record has no text_tower part: run `retinabench lock-encoders "
                               f"{entry.get('variant_of') or entry['name']}`")
        if tt.get("hub_id"):
            from huggingface_hub import hf_hub_download
            sub = {"name": entry["name"], "hub_id": tt["hub_id"]}
            with hub_errors(sub, record.get("revision")):
                files = {f: Path(hf_hub_download(tt["hub_id"], f, revision=record["revision"]))
                         for f in record["files"]}
            prov = {"origin": "hub", "hub_id": tt["hub_id"], "revision": record["revision"]}
        else:
            files = {f: text_tower_dir(entry) / f for f in record["files"]}
            absent = [str(p) for p in files.values() if not p.is_file()]
            if absent:
                raise WeightsError(f"{what}: text tower file(s) {absent} not found (run `retinabench "
                                   f"lock-encoders {entry['name']}` to download {tt['url']})")
            prov = {"origin": "url", "url": tt["url"]}
        for fname, p in files.items():
            verify_sha256(p, record["files"][fname], f"{what} (text tower)")
        prov["files"] = dict(record["files"])
    lacking = [f for f in tt["files"] if not is_glob(f) and f not in files]
    if lacking:
        raise WeightsError(f"{what}: the text tower's files lack {lacking} (have {sorted(files)})")
    return files, prov


def bert(config: dict | Path, *, pooler: bool, what: str) -> nn.Module:
    """A transformers ``BertModel`` with random weights from a config (a dict or a ``config.json``) of
    ``model_type`` bert; ``pooler``: whether the checkpoint has BERT's pooler (FLAIR's AutoModel does, RET-CLIP's
    BERT does not)."""
    import json

    from transformers import BertConfig, BertModel
    cfg = json.loads(Path(config).read_text()) if isinstance(config, Path) else dict(config)
    if cfg.get("model_type", "bert") != "bert":
        raise WeightsError(f"{what}: the text tower's config is model_type {cfg.get('model_type')!r}, not bert")
    cfg.pop("model_type", None)
    return BertModel(BertConfig(**cfg), add_pooling_layer=pooler).eval()


def load_whole(model: nn.Module, entry: dict, files: dict[str, Path], *, prefix: str = "",
               adapt: StateDictAdapter | None = None) -> KeyReport:
    """The entry's weights file read whole (``state_dict_key`` applied), the text tower's ``drop_keys`` dropped and
    recorded, a ``prefix`` every key carries stripped (DataParallel's ``module.``), ``adapt`` applied (the image
    tower's position-embedding resampling at another input size), then loaded strictly into ``model``: a missing
    or unexpected key is an error naming it."""
    what = f"encoder {entry['name']!r}"
    fname = entry["weights_file"]
    if fname not in files:
        raise WeightsError(f"{what}: no {fname} among the files {sorted(files)}")
    raw = read_state_dict([files[fname]])
    spec = {"name": entry["name"], "state_dict_key": entry.get("state_dict_key"),
            "drop_keys": list(entry["text_tower"].get("drop_keys") or [])}
    sd, report = prepare_state_dict(raw, spec)
    if prefix:
        bare = [k for k in sd if not k.startswith(prefix)]
        if bare:
            raise WeightsError(f"{what}: checkpoint keys without the prefix {prefix!r}: {bare[:8]}")
        sd = {k[len(prefix):]: v for k, v in sd.items()}
        report.transforms.append(f"prefix {prefix!r} stripped")
    if adapt is not None:
        adapt(model, sd, entry, report)
    return load_state_dict_strict(model, sd, f"{what} (whole model, {fname})", report)


def l2(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)

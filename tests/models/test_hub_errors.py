"""Gated or missing hub models: every code path that downloads turns the hub's error into one message naming the
model (registry name and hub id) and what to do (licence page and token; the lock file). The hub's errors are the
real ones, raised by huggingface_hub's own status check from a simulated response."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from retinabench.models import WeightsError, build_encoder
from retinabench.registry.lockfile import LockError
from tests.models.conftest import REV, hub_entry

REPO = Path(__file__).resolve().parents[2]


def hub_error(code: str, status: int = 404) -> Exception:
    """The exception huggingface_hub raises for a hub answer with this X-Error-Code (GatedRepo: 403)."""
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub.utils import hf_raise_for_status
    url = "https://huggingface.co/org/model/resolve/" + REV + "/model.safetensors"
    response = httpx2.Response(status, headers={"X-Error-Code": code, "X-Error-Message": "from the hub"},
                               request=httpx2.Request("GET", url))
    with pytest.raises(Exception) as caught:
        hf_raise_for_status(response)
    return caught.value


def gated() -> Exception:
    from huggingface_hub.errors import GatedRepoError
    err = hub_error("GatedRepo", 403)
    assert isinstance(err, GatedRepoError)
    return err


def _raise(err):
    def call(*args, **kwargs):
        raise err
    return call


TIMM = dict(source="timm", architecture="vit_tiny_patch16_224", weights_file="model.safetensors", input_size=224,
            pooling="cls", embed_dim=192)
OPEN_CLIP = dict(source="open_clip", architecture="ViT-B-32", weights_file="open_clip_model.safetensors",
                 keep_prefix="visual.", input_size=224, pooling="cls", interfaces=["features", "zeroshot"])
HF = dict(source="transformers", architecture="siglip", input_size=224, pooling="pooler", normalization="inception",
          hf_config={"model_type": "siglip"}, hf_class="SiglipVisionModel", hf_full_class="SiglipModel",
          interfaces=["features", "zeroshot"])
MLLM = dict(source="transformers", architecture="gemma3", hf_full_class="Gemma3ForConditionalGeneration",
            interfaces=["mllm"])


def _entry(tmp_path, fake_hub, fields: dict, name="gated_model", repo="org/gated-model") -> dict:
    files = {}
    for fname in ([fields["weights_file"]] if "weights_file" in fields else ["config.json", "model.safetensors"]):
        (tmp_path / fname).write_bytes(b"not fetched")
        files[fname] = tmp_path / fname
    return hub_entry(fake_hub, name, repo, files, **fields)


def _loaders():
    from retinabench.models import load_dual_encoder, load_mllm, load_open_clip_model, load_transformers_model
    return {"timm features": (TIMM, build_encoder), "open_clip features": (OPEN_CLIP, build_encoder),
            "transformers features": (HF, build_encoder), "open_clip whole model": (OPEN_CLIP, load_open_clip_model),
            "transformers whole model": (HF, load_transformers_model), "dual encoder": (HF, load_dual_encoder),
            "open_clip dual encoder": (OPEN_CLIP, load_dual_encoder),
            "mllm": (MLLM, lambda e: load_mllm(e, device="cpu"))}


LOADERS = ["timm features", "open_clip features", "transformers features", "open_clip whole model",
           "transformers whole model", "dual encoder", "open_clip dual encoder", "mllm"]


@pytest.mark.parametrize("path", LOADERS)
def test_a_gated_model_names_the_model_its_licence_page_and_the_token(tmp_path, fake_hub, monkeypatch, path):
    import huggingface_hub
    fields, load = _loaders()[path]
    entry = _entry(tmp_path, fake_hub, fields)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _raise(gated()))
    with pytest.raises(WeightsError) as err:
        load(entry)
    msg = str(err.value)
    assert "encoder 'gated_model' (hub id 'org/gated-model') is a gated model" in msg
    assert "https://huggingface.co/org/gated-model" in msg and "HF_TOKEN" in msg
    assert "huggingface-cli login" in msg and "hf auth login" in msg
    assert type(err.value.__cause__).__name__ == "GatedRepoError"  # the hub's own error stays attached


@pytest.mark.parametrize("code, says", [("RepoNotFound", "the hub has no repository 'org/gated-model'"),
                                        ("RevisionNotFound", f"has no revision '{REV}'"),
                                        ("EntryNotFound", f"org/gated-model@{REV} lacks a file")])
@pytest.mark.parametrize("path", ["timm features", "transformers whole model", "mllm"])
def test_a_missing_repo_revision_or_file_names_the_model_and_the_lock_file(tmp_path, fake_hub, monkeypatch, path,
                                                                           code, says):
    import huggingface_hub
    fields, load = _loaders()[path]
    entry = _entry(tmp_path, fake_hub, fields)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _raise(hub_error(code)))
    with pytest.raises(WeightsError) as err:
        load(entry)
    msg = str(err.value)
    assert msg.startswith("encoder 'gated_model' (hub id 'org/gated-model')") and says in msg
    assert "config/encoders.lock.yaml" in msg


def test_not_cached_offline_says_so_and_other_errors_pass_unchanged(tmp_path, fake_hub, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError
    entry = _entry(tmp_path, fake_hub, TIMM)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _raise(LocalEntryNotFoundError("not in cache")))
    with pytest.raises(WeightsError, match=r"encoder 'gated_model' .*not in the local Hugging Face cache.*"
                                           r"HF_HUB_OFFLINE=1"):
        build_encoder(entry)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _raise(PermissionError("disk")))
    with pytest.raises(PermissionError, match="disk"):
        build_encoder(entry)


def test_open_clips_hub_tokenizer_download_is_handled_too(tmp_path, monkeypatch):
    """load_open_clip_model fetches a hub tokenizer through open_clip (SigLIP-style models)."""
    import open_clip
    from safetensors.torch import save_file

    from retinabench.hashing import sha256_file
    from retinabench.models import load_open_clip_model, tiny
    entry = tiny.build_tiny_open_clip(tmp_path)
    path = tmp_path / entry["weights_file"]
    save_file({k: v.contiguous() for k, v in open_clip.create_model(entry["architecture"]).state_dict().items()},
              str(path))
    entry |= {"weights_path": str(path), "sha256": sha256_file(path)}
    cfg = open_clip.get_model_config(entry["architecture"])
    cfg["text_cfg"]["hf_tokenizer_name"] = "org/tokenizer-repo"  # as SigLIP's configs name their tokenizer
    monkeypatch.setattr(open_clip, "get_model_config", lambda name: cfg)
    monkeypatch.setattr(open_clip, "get_tokenizer", _raise(gated()))
    with pytest.raises(WeightsError, match=r"encoder 'tiny_open_clip' \(hub id 'org/tokenizer-repo'\) is a gated "
                                           r"model: accept its licence at https://huggingface.co/org/tokenizer-repo"):
        load_open_clip_model(entry)


def test_lock_encoders_turns_gated_and_missing_repos_into_lock_errors(monkeypatch):
    import huggingface_hub

    from retinabench.models.lock import lock_entry
    entry = {"name": "gated_model", "source": "timm", "hub_id": "org/gated-model", "weights_file": "model.safetensors"}
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: SimpleNamespace(model_info=_raise(gated())))
    with pytest.raises(LockError, match=r"is a gated model: accept its licence at https://huggingface.co/org/"
                                        r"gated-model.*HF_TOKEN"):
        lock_entry(entry)
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: SimpleNamespace(model_info=_raise(
        hub_error("RepoNotFound"))))
    with pytest.raises(LockError, match="the hub has no repository 'org/gated-model'.*lock file"):
        lock_entry(entry)
    # model_info is public for a gated repo; its files are not: the hashing download is handled as well
    info = SimpleNamespace(sha=REV, siblings=[SimpleNamespace(rfilename="model.safetensors")])
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: SimpleNamespace(model_info=lambda repo: info))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _raise(gated()))
    with pytest.raises(LockError, match="'gated_model' \\(hub id 'org/gated-model'\\) is a gated model"):
        lock_entry(entry)


def test_check_encoder_prints_the_message(tmp_path, monkeypatch, capsys):
    import huggingface_hub
    import yaml

    from retinabench.cli import main
    from tests.models.conftest import lock_record
    monkeypatch.chdir(REPO)
    entry = {"source": "timm", "architecture": "vit_tiny_patch16_224", "domain": "natural", "method": "test",
             "input_size": 224, "normalization": "imagenet", "pooling": "cls", "size_class": "tiny",
             "embed_dim": 192, "params_m": 5.5, "hub_id": "org/gated-model", "weights_file": "model.safetensors"}
    (tmp_path / "encoders.yaml").write_text(yaml.safe_dump({"gated_model": entry}))
    (tmp_path / "model.safetensors").write_bytes(b"x")
    record = lock_record({"name": "gated_model", **entry}, {"model.safetensors": tmp_path / "model.safetensors"})
    (tmp_path / "encoders.lock.yaml").write_text(yaml.safe_dump({"version": 1, "encoders": {"gated_model": record}}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"registries": {
        "datasets": str(REPO / "config/datasets.yaml"), "tasks": str(REPO / "config/tasks.yaml"),
        "encoders": str(tmp_path / "encoders.yaml")}}))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _raise(gated()))
    assert main(["check-encoder", "gated_model", "--configfile", str(tmp_path / "config.yaml")]) == 1
    out = capsys.readouterr().out
    assert "https://huggingface.co/org/gated-model" in out and "HF_TOKEN" in out

"""`retinabench check-encoder`, `lock-encoders` and `encoders` (in-process: the same code the console script runs)."""
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from retinabench.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A config whose encoder registry (and lock) live in tmp_path; the weights folder too."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RETINABENCH_WEIGHTS", str(tmp_path / "weights"))
    enc = tmp_path / "encoders.yaml"

    def write(entries: dict) -> list[str]:
        enc.write_text(yaml.safe_dump(entries))
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({"registries": {"datasets": str(REPO / "config/datasets.yaml"),
                                                      "tasks": str(REPO / "config/tasks.yaml"),
                                                      "encoders": str(enc)}}))
        return ["--configfile", str(cfg)]
    return write


def _vit_tiny_file(path, drop=()):
    import timm
    from safetensors.torch import save_file
    torch.manual_seed(0)
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0)
    save_file({k: v.contiguous() for k, v in m.state_dict().items() if k not in drop}, str(path))


TINY = {"source": "timm", "architecture": "vit_tiny_patch16_224", "domain": "natural", "method": "test",
        "input_size": 224, "normalization": "imagenet", "pooling": "cls", "size_class": "tiny", "embed_dim": 192,
        "params_m": 5.5}


def test_check_encoder_reports_keys_sha_and_dimension(tmp_path, registry, capsys):
    cfg = registry({"tiny_hub": {**TINY, "hub_id": "org/tiny", "weights_file": "model.safetensors"}})
    good, bad = tmp_path / "good.safetensors", tmp_path / "bad.safetensors"
    _vit_tiny_file(good)
    _vit_tiny_file(bad, drop=("blocks.1.mlp.fc2.weight",))
    assert main(["check-encoder", "tiny_hub", "--weights", str(good), *cfg]) == 0
    out = capsys.readouterr().out
    assert "embedding dimension: 192 (declared 192)" in out and "missing keys (0)" in out and "OK" in out
    from retinabench.hashing import sha256_file
    assert sha256_file(good) in out
    assert main(["check-encoder", "tiny_hub", "--weights", str(bad), *cfg]) == 1
    out = capsys.readouterr().out
    assert "missing keys (1): ['blocks.1.mlp.fc2.weight']" in out and "FAILED" in out
    # without --weights: the pinned source, which is not locked yet
    assert main(["check-encoder", "tiny_hub", *cfg]) == 1
    assert "`retinabench lock-encoders tiny_hub`" in capsys.readouterr().out


def test_check_encoder_on_the_packaged_entry(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["check-encoder", "efficientnet_lite0_in1k"]) == 0
    out = capsys.readouterr().out
    assert "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db" in out
    assert "dropped keys (2): ['_fc.bias', '_fc.weight']" in out and "embedding dimension: 1280" in out


def test_lock_encoders_pins_hub_and_manual_files_and_loads_verify_against_the_lock(tmp_path, registry, capsys,
                                                                                    monkeypatch):
    import huggingface_hub
    hub_file = tmp_path / "model.safetensors"
    _vit_tiny_file(hub_file)
    rev = "b" * 40
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: SimpleNamespace(model_info=lambda repo: SimpleNamespace(
        sha=rev, siblings=[SimpleNamespace(rfilename="model.safetensors"), SimpleNamespace(rfilename="README.md")])))
    calls = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda repo, fname, revision=None: calls.append((repo, fname, revision)) or str(hub_file))
    cfg = registry({
        "tiny_hub": {**TINY, "hub_id": "org/tiny", "weights_file": "model.safetensors"},
        "tiny_manual": {**TINY, "weights_url": "https://example.org/tiny.pth", "download": "manual",
                        "weights_file": "tiny.safetensors"},
        "tiny_random": {**TINY, "init": "random"}})
    assert main(["encoders", *cfg]) == 0
    listing = capsys.readouterr().out
    assert "NOT LOCKED" in listing and "random init" in listing
    # the manual file is not there yet: lock-encoders says where to put it, and exits non-zero
    assert main(["lock-encoders", *cfg]) == 1
    err = capsys.readouterr().err
    assert "tiny_manual: NOT LOCKED" in err and str(tmp_path / "weights" / "tiny_manual" / "tiny.safetensors") in err
    manual = tmp_path / "weights" / "tiny_manual" / "tiny.safetensors"
    manual.parent.mkdir(parents=True)
    _vit_tiny_file(manual)
    assert main(["lock-encoders", *cfg]) == 0
    lock = yaml.safe_load((tmp_path / "encoders.lock.yaml").read_text())
    assert lock["encoders"]["tiny_hub"]["revision"] == rev
    assert set(lock["encoders"]) == {"tiny_hub", "tiny_manual"}
    capsys.readouterr()
    assert main(["encoders", *cfg]) == 0
    assert "NOT LOCKED" not in capsys.readouterr().out
    assert main(["check-encoder", "tiny_hub", *cfg]) == 0 and main(["check-encoder", "tiny_manual", *cfg]) == 0
    assert calls[-1] == ("org/tiny", "model.safetensors", rev)  # loads fetch the locked revision
    # editing the entry (another repo) makes its record stale: refused until relocked
    cfg = registry({"tiny_hub": {**TINY, "hub_id": "org/tiny-v2", "weights_file": "model.safetensors"}})
    capsys.readouterr()
    assert main(["check-encoder", "tiny_hub", *cfg]) == 1
    assert "is stale" in capsys.readouterr().out

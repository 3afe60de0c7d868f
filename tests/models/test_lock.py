"""The lock file's format and states, variants sharing their base record, and the trust_remote_code rule."""
import pytest
import yaml

from retinabench.registry.lockfile import (LockError, attach_locks, lock_state, pins_of, read_lock, unlocked,
                                           weights_origin, write_lock)
from retinabench.registry import RegistryError, load_registry

BASE = {"source": "timm", "architecture": "vit_tiny_patch16_224", "domain": "natural", "method": "x",
        "input_size": 224, "normalization": "imagenet", "pooling": "cls", "size_class": "tiny"}


def test_lock_states_and_variants(tmp_path):
    p = tmp_path / "encoders.yaml"
    p.write_text(yaml.safe_dump({"hub": {**BASE, "hub_id": "a/b", "weights_file": "m.safetensors",
                                         "variants": {"patch_mean": {"pooling": "patch_mean"}}},
                                 "rand": {**BASE, "init": "random"}}))
    reg = load_registry(p, "encoders")
    assert set(reg) == {"hub", "hub.patch_mean", "rand"} and reg["hub.patch_mean"]["variant_of"] == "hub"
    assert weights_origin(reg["rand"]) == "none" and lock_state(reg["rand"], None) == "not needed"
    record = {"pins": pins_of(reg["hub"]), "revision": "d" * 40, "files": {"m.safetensors": "e" * 64}}
    attach_locks(reg, {})
    assert unlocked(["hub.patch_mean", "rand"], reg) == [
        "encoder 'hub.patch_mean' is not locked (hub weights): run `retinabench lock-encoders hub`"]
    write_lock(tmp_path / "encoders.lock.yaml", {"hub": record})
    attach_locks(reg, read_lock(tmp_path / "encoders.lock.yaml"))
    assert reg["hub.patch_mean"]["lock"] == record  # the variant uses its base entry's record
    assert lock_state(reg["hub"], record) == "locked" and unlocked(list(reg), reg) == []
    assert lock_state(dict(reg["hub"], weights_file="other.bin"), record) == "STALE"


def test_malformed_lock_file_names_the_record(tmp_path):
    path = tmp_path / "encoders.lock.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "encoders": {"x": {"pins": {"origin": "hub"}, "revision": "a" * 40,
                                                                     "files": {"m.bin": "nope"}}}}))
    with pytest.raises(LockError, match=r"record 'x', file 'm.bin': not a sha256"):
        read_lock(path)
    path.write_text(yaml.safe_dump({"encoders": {}}))
    with pytest.raises(LockError, match="not an encoder lock file of version 1"):
        read_lock(path)
    assert read_lock(tmp_path / "absent.yaml") == {}


def test_trust_remote_code_needs_a_pinned_revision_and_a_reason(tmp_path):
    p = tmp_path / "encoders.yaml"
    entry = {**BASE, "source": "transformers", "hub_id": "a/b", "hf_config": {"model_type": "vit"},
             "trust_remote_code": True}
    p.write_text(yaml.safe_dump({"remote": entry}))
    with pytest.raises(RegistryError, match="entry 'remote'.*code_revision"):
        load_registry(p, "encoders")
    p.write_text(yaml.safe_dump({"remote": {**entry, "code_revision": "f" * 40,
                                            "trust_remote_code_reason": "custom pooling head"}}))
    assert load_registry(p, "encoders")["remote"]["trust_remote_code"] is True


def test_hub_entries_keep_their_pins_in_the_lock_not_the_registry(tmp_path):
    p = tmp_path / "encoders.yaml"
    p.write_text(yaml.safe_dump({"h": {**BASE, "hub_id": "a/b", "weights_file": "m.bin", "sha256": "0" * 64}}))
    with pytest.raises(RegistryError, match="entry 'h'"):
        load_registry(p, "encoders")

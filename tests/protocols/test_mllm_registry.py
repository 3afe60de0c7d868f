"""The registry's MLLM entries (FOCUS's six) and the lock mechanism for them, offline: each hf_config builds the
declared class on the meta device with the declared parameter count, its keys are the config.json spelling the
load-time check compares, and the lock resolves the optional tokenizer / processor / chat-template globs."""
import json

import pytest
import torch

from retinabench.models.lock import _hub_files
from retinabench.registry.lockfile import is_glob, lock_state, pins_of, requested_files
from retinabench.registry import load_registry

from tests.conftest import REPO

ENTRIES = {n: e for n, e in load_registry(REPO / "config/encoders.yaml", "encoders").items()
           if "mllm" in (e.get("interfaces") or [])}
FOCUS_MLLMS = {"google/gemma-3-27b-it", "google/medgemma-4b-it", "google/medgemma-1.5-4b-it",
               "llava-hf/llama3-llava-next-8b-hf", "Qwen/Qwen3-VL-8B-Instruct", "google/medgemma-27b-it"}


def test_focus_mllms_are_registered():
    assert {e["hub_id"] for e in ENTRIES.values()} == FOCUS_MLLMS
    for e in ENTRIES.values():
        assert e["studies"] == ["focus"] and e["source"] == "transformers" and e["size_class"] == "giant"


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_mllm_entry_builds_its_class_with_the_declared_size(name, tmp_path):
    import transformers
    from retinabench.models._transformers import _check_hf_config, hf_config
    entry = ENTRIES[name]
    config = hf_config(entry)
    cls = getattr(transformers, entry["hf_full_class"])
    with torch.device("meta"):
        model = cls(config)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) / 1e6
    assert abs(n - entry["params_m"]) <= 0.01 * entry["params_m"], n
    # the declared keys are spelled as config.json spells them: a saved config passes the load-time check
    config.save_pretrained(tmp_path)
    _check_hf_config(entry, transformers.AutoConfig.from_pretrained(tmp_path))
    wrong = json.loads(json.dumps(entry["hf_config"]))
    wrong["text_config"]["num_hidden_layers"] += 1
    from retinabench.models import WeightsError
    with pytest.raises(WeightsError, match="text_config.num_hidden_layers"):
        _check_hf_config(dict(entry, hf_config=wrong), transformers.AutoConfig.from_pretrained(tmp_path))


def test_lock_pins_mllm_processor_files_through_optional_globs(monkeypatch, tmp_path):
    entry = ENTRIES["gemma3_27b_it"]
    files = requested_files(entry)
    assert "config.json" in files and "model.safetensors" in files and any(is_glob(f) for f in files)
    assert pins_of(entry)["files"] == files and lock_state(entry, None) == "NOT LOCKED"
    repo = {"config.json", "generation_config.json", "preprocessor_config.json", "processor_config.json",
            "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
            "chat_template.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors", "README.md", "sub/tokenizer.json"}
    import huggingface_hub

    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                "b": "model-00002-of-00002.safetensors"}}))

    def fake_download(repo_id, filename, revision=None, **kw):
        assert filename == "model.safetensors.index.json"
        return str(index)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    got = _hub_files(entry, "a" * 40, repo)
    assert set(got) == repo - {"README.md", "sub/tokenizer.json"}  # every processor file, both shards, the index
    assert len(got) == len(set(got))
    # a plain (non-glob) name the repo lacks is still an error
    from retinabench.registry.lockfile import LockError
    with pytest.raises(LockError, match="has no file 'config.json'"):
        _hub_files(entry, "a" * 40, repo - {"config.json"})


# --- FOCUS's CLIP-like VLMs ----------------------------------------------------------------------------------------
ALL = load_registry(REPO / "config/encoders.yaml", "encoders")
# the names -> entries (CLIP ViT-L/14 as the issue names it, ViT-B/32 as FOCUS's code runs it)
FOCUS_VLMS = {"CLIP ViT-L/14": "clip_vitl14_openai", "CLIP ViT-B/32": "clip_vitb32_openai",
              "SigLIP2": "siglip2_base_patch16_224", "MedSigLIP": "medsiglip_448", "EyeCLIP": "eyeclip",
              "RET-CLIP": "ret_clip", "FLAIR": "flair"}
OWN_TEXT_TOWER = {"ret_clip", "flair"}  # BERT text towers of their own checkpoint layout (models/_ret_clip.py, _flair.py)


@pytest.mark.parametrize("paper, name", sorted(FOCUS_VLMS.items()))
def test_focus_vlms_serve_zero_shot_or_say_which_code_they_need(paper, name):
    from retinabench.registry.lockfile import needs_lock
    e = ALL[name]
    interfaces = e.get("interfaces") or ["features"]
    assert "features" in interfaces  # the image tower serves the frozen protocols (FOCUS's VLM linear probe)
    assert "zeroshot" in interfaces and "zeroshot_note" not in e
    if name in OWN_TEXT_TOWER:  # the text tower's files pinned too: a second hub repo or one URL
        assert e["text_tower"]["kind"] == name and pins_of(e)["text_tower"]["files"]
    else:
        assert e["source"] in ("open_clip", "transformers")
    # runnable once pinned: every one goes through lock-encoders, the transformers text towers with their
    # tokenizer files (open_clip's tokenizer is bundled with the package)
    assert needs_lock(e) and lock_state(e, None) == "NOT LOCKED"
    files = pins_of(e)["files"]
    assert files == requested_files(e) and files
    if e["source"] == "transformers" and "zeroshot" in interfaces:
        assert e["hf_full_class"] in ("CLIPModel", "SiglipModel") and any(f.startswith("tokenizer") for f in files)
    readme = (REPO / "docs" / "protocols.md").read_text()
    # its row in docs/protocols.md's interface table (columns: entry, model, loader, interfaces, notes)
    row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}` |")
               and ("| features |" in line or "| features, zeroshot |" in line))
    assert "zeroshot |" in row and "needs" not in row, row


def test_a_zero_shot_text_tower_outside_the_libraries_is_refused_with_its_note():
    from retinabench.models import WeightsError
    from retinabench.models import load_dual_encoder
    with pytest.raises(WeightsError, match="Chinese BERT"):
        load_dual_encoder(ALL["vilref"])
    # RET-CLIP's whole model loads here once its hand-downloaded checkpoint is placed and locked
    with pytest.raises(WeightsError, match=r"not locked .*lock-encoders ret_clip"):
        load_dual_encoder(ALL["ret_clip"])

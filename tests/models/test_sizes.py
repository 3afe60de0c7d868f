"""Size classes: every shipped entry's class follows its parameter count, and each class's feature batch keeps
its largest encoder far below one H100 (measured on a GPU by bench/gpu_check.py)."""
import json
from importlib import resources

from retinabench.registry.sizes import H100_GB, SIZE_CLASSES, feature_batch_size, feature_memory_gb, size_class_for
from tests.models.test_registry_entries import ENTRIES


def test_classes_match_the_schema_and_the_entries():
    schema = json.loads(resources.files("retinabench").joinpath("schemas_json/encoders.schema.json").read_text())
    assert list(SIZE_CLASSES) == schema["properties"]["size_class"]["enum"]
    for name, e in ENTRIES.items():
        assert e["size_class"] == size_class_for(e["params_m"]), (name, e["params_m"], e["size_class"])


def test_every_class_fits_one_h100_for_feature_extraction():
    # (params, tokens, width, mlp hidden) of the largest encoder of each class at its input size
    largest = {"tiny": (11.2, 197, 192, 768), "small": (23.5, 785, 384, 1536), "base": (86.6, 1370, 768, 3072),
               "large": (428.2, 730, 1152, 4304), "huge": (631.2, 261, 1280, 6832),
               "giant": (1135.0, 261, 1536, 8192)}
    for cls, (params, tokens, width, hidden) in largest.items():
        assert params <= max(e["params_m"] for e in ENTRIES.values() if e["size_class"] == cls) + 1e-6
        gb = feature_memory_gb(params, SIZE_CLASSES[cls]["feature_batch"], tokens, width, hidden)
        assert gb < 0.5 * H100_GB, (cls, gb)


def test_feature_batch_is_the_class_batch_unless_the_config_fixes_one():
    entry = ENTRIES["dinov2_vitg14"]
    assert feature_batch_size(entry, {"batch_size": "auto"}) == 32
    assert feature_batch_size(ENTRIES["vit_tiny_random"], {"batch_size": "auto"}) == 256
    assert feature_batch_size(entry, {"batch_size": 8}) == 8

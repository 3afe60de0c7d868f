import numpy as np
import pandas as pd
import pytest
from PIL import Image

from retinabench.data.image_cache import build_image_cache, open_image_cache


def write_images(root):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (80, 200), dtype=np.uint8), "L").save(root / "oct.png")
    Image.fromarray(rng.integers(0, 255, (120, 120, 3), dtype=np.uint8), "RGB").save(root / "cfp.jpg")
    return pd.DataFrame({"image_id": ["a", "b"], "path": ["oct.png", "cfp.jpg"]})


def test_cache_shapes_grayscale_and_index(tmp_path):
    manifest = write_images(tmp_path)
    n = build_image_cache(manifest, tmp_path, tmp_path / "c.npy", tmp_path / "c.parquet", size=32, progress=False)
    arr, index = open_image_cache(tmp_path / "c.npy", tmp_path / "c.parquet")
    assert n == 2 and arr.shape == (2, 32, 32, 3) and arr.dtype == np.uint8
    assert list(index["image_id"]) == ["a", "b"] and list(index["row"]) == [0, 1]
    assert np.array_equal(arr[0, ..., 0], arr[0, ..., 2])  # grayscale replicated to 3 channels
    expected = np.asarray(Image.open(tmp_path / "cfp.jpg").convert("RGB").resize((32, 32), Image.Resampling.BICUBIC))
    assert np.array_equal(arr[1], expected)


def test_center_crop_keeps_the_middle(tmp_path):
    img = np.zeros((40, 120), dtype=np.uint8)
    img[:, 40:80] = 255  # bright middle third
    Image.fromarray(img, "L").save(tmp_path / "wide.png")
    m = pd.DataFrame({"image_id": ["w"], "path": ["wide.png"]})
    build_image_cache(m, tmp_path, tmp_path / "c.npy", tmp_path / "c.parquet", size=40, resize="center_crop",
                      progress=False)
    arr, _ = open_image_cache(tmp_path / "c.npy", tmp_path / "c.parquet")
    assert arr[0].mean() > 200


def test_unreadable_image_names_the_file(tmp_path):
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    m = pd.DataFrame({"image_id": ["x"], "path": ["broken.jpg"]})
    with pytest.raises(OSError, match="broken.jpg"):
        build_image_cache(m, tmp_path, tmp_path / "c.npy", tmp_path / "c.parquet", progress=False)
    with pytest.raises(ValueError, match="unknown resize mode"):
        build_image_cache(m, tmp_path, tmp_path / "c.npy", tmp_path / "c.parquet", resize="stretch")

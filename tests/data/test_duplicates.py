"""Exact and near duplicates: pigeonhole search equals brute force, clusters, the perceptual hash, across datasets."""
import io
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
from PIL import Image, ImageEnhance

from retinabench.data.duplicates import (DEFAULT_MAX_DISTANCE, cross_dataset_duplicates, duplicate_summary,
                                         find_duplicates, hash_matrix, near_pairs)
from retinabench.data.image_checks import PHASH_BYTES, check_images, perceptual_hash


def random_hashes(n, seed=0, planted=((0, 1, 3), (2, 3, 8), (4, 5, 9), (6, 7, 0), (8, 9, 16), (10, 11, 20))):
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 256, size=(n, PHASH_BYTES), dtype=np.uint8)
    for a, b, bits in planted:  # b = a with `bits` bits flipped
        flat = np.unpackbits(h[a])
        flip = rng.choice(flat.size, bits, replace=False)
        flat[flip] ^= 1
        h[b] = np.packbits(flat)
    return h


def brute(h, d):
    out = set()
    for i, j in combinations(range(len(h)), 2):
        dist = int(np.bitwise_count(h[i] ^ h[j]).sum())
        if dist <= d:
            out.add((i, j, dist))
    return out


@pytest.mark.parametrize("max_distance", [0, 4, 8, 15, 20, 40])
def test_pigeonhole_search_finds_exactly_the_brute_force_pairs(max_distance):
    h = random_hashes(300)
    h[20] = h[21] = h[22]  # identical hashes (e.g. blank images)
    i, j, d = near_pairs(h, max_distance)
    assert set(zip(i.tolist(), j.tolist(), d.tolist())) == brute(h, max_distance)


def test_clusters_kinds_nearest_and_stable_ids():
    h = random_hashes(12)
    hexes = [bytes(r).hex() for r in h]
    images = pd.DataFrame({"image_id": [f"im{k:02d}" for k in range(12)],
                           "patient_id": ["A", "B", "C", "C", "D", "E", "F", "G", "H", "I", "J", "K"],
                           "sha256": [f"s{k}" for k in range(12)], "phash": hexes})
    images.loc[11, "sha256"] = "s10"  # im10 / im11 byte-identical (their phashes differ by 20 bits: still exact)
    d = find_duplicates(images, max_distance=DEFAULT_MAX_DISTANCE)
    clusters = d.groupby("cluster_id")["image_id"].apply(sorted).to_dict()
    assert clusters == {"dup:im00": ["im00", "im01"], "dup:im02": ["im02", "im03"], "dup:im06": ["im06", "im07"],
                        "dup:im10": ["im10", "im11"]}  # 9 and 16 bits apart: not near
    row = d.set_index("image_id")
    assert row.loc["im00", "kind"] == "near" and row.loc["im00", "distance"] == 3
    assert row.loc["im01", "nearest"] == "im00"
    assert row.loc["im10", "kind"] == "exact" and row.loc["im10", "distance"] == 0
    assert row.loc["im02", "n_patients"] == 1 and row.loc["im00", "n_patients"] == 2
    s = duplicate_summary(d)
    assert s == {"clusters": 4, "images": 8, "exact_images": 2, "near_images": 6, "exact_clusters": 1,
                 "clusters_spanning_patients": 3, "largest_cluster": 2}
    # cluster ids do not depend on other images: drop an unrelated one
    d2 = find_duplicates(images.drop(index=5), max_distance=DEFAULT_MAX_DISTANCE)
    assert set(d2["cluster_id"]) == set(d["cluster_id"])


def fundus_like(seed, size=256):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size] / size
    img = np.zeros((size, size, 3))
    disc = ((xx - rng.uniform(.3, .7)) ** 2 + (yy - rng.uniform(.3, .7)) ** 2) < 0.01
    field = ((xx - .5) ** 2 + (yy - .5) ** 2) < 0.2
    for _k in range(25):  # vessels
        x0, y0, ang = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0, np.pi)
        dist = np.abs((xx - x0) * np.sin(ang) - (yy - y0) * np.cos(ang))
        img[dist < 0.004] += [0.3, 0.05, 0.0]
    img[field] += [0.6, 0.3, 0.1]
    img[disc] = [1.0, 0.9, 0.6]
    img += rng.normal(0, 0.02, img.shape)
    return Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8))


def test_perceptual_hash_keeps_reencoded_copies_and_separates_other_images():
    """The threshold's premise (docs/data-integrity.md): JPEG re-encoding and resizing stay within 8 of 256 bits,
    different images do not."""
    base = [fundus_like(s) for s in range(6)]
    h = [hash_matrix([perceptual_hash(im)])[0] for im in base]
    for im, hb in zip(base, h):
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=60)
        for copy in (Image.open(io.BytesIO(buf.getvalue())), im.resize((128, 128)),
                     ImageEnhance.Brightness(im).enhance(1.05)):
            assert np.bitwise_count(hash_matrix([perceptual_hash(copy)])[0] ^ hb).sum() <= DEFAULT_MAX_DISTANCE
    for a, b in combinations(h, 2):
        assert np.bitwise_count(a ^ b).sum() > 3 * DEFAULT_MAX_DISTANCE


def test_cross_dataset_pairs_carry_both_splits():
    rng = np.random.default_rng(0)
    ha = [bytes(rng.integers(0, 256, PHASH_BYTES, dtype=np.uint8)).hex() for _ in range(4)]
    hb = [bytes(rng.integers(0, 256, PHASH_BYTES, dtype=np.uint8)).hex() for _ in range(3)]
    flipped = bytearray(bytes.fromhex(ha[1]))
    flipped[0] ^= 0b111  # 3 bits
    hb[0], hb[1] = ha[0], flipped.hex()
    a = pd.DataFrame({"image_id": ["a0", "a1", "a2", "a3"], "sha256": ["x", "y", "z", "w"], "phash": ha,
                      "split": ["train", "train", "val", "test"]})
    b = pd.DataFrame({"image_id": ["b0", "b1", "b2"], "sha256": ["x", "q", "r"], "phash": hb,
                      "split": ["test", "test", "train"]})
    pairs = cross_dataset_duplicates({"A": a, "B": b})
    assert pairs[["image_a", "image_b", "kind", "distance"]].values.tolist() == [["a0", "b0", "exact", 0],
                                                                               ["a1", "b1", "near", 3]]
    assert set(pairs["split_a"]) == {"train"} and set(pairs["split_b"]) == {"test"}
    assert cross_dataset_duplicates({"A": a}).empty


@pytest.mark.slow
@pytest.mark.shared
def test_tvhl_duplicate_counts(tvhl_root, tvhl_manifest, tmp_path):
    """tvhl: 60 byte-identical groups (121 images, 29 spanning patient ids) plus 10 near-duplicate pairs within
    8 bits — 4 photographs re-saved under another patient's id (0-2 bits), one pair of different, nearly black
    photographs (6 bits) and 5 repeat photographs of one eye (0-8 bits)."""
    manifest, _ = tvhl_manifest
    checks, stats = check_images(manifest, tvhl_root, cache_path=tmp_path / "cache.parquet", threads=2)
    assert stats == {"decoded": 2600, "cached": 0, "corrupt": 0}
    images = manifest[["image_id", "patient_id", "sha256"]].merge(checks[["image_id", "phash"]], on="image_id")
    d = find_duplicates(images)
    s = duplicate_summary(d)
    assert s["exact_clusters"] == 60 and s["exact_images"] == 121
    assert s["clusters"] == 70 and s["near_images"] == 20 and s["clusters_spanning_patients"] == 34
    exact = d[d["kind"] == "exact"].groupby("cluster_id")["n_patients"].first()
    assert (exact > 1).sum() == 29
    near = d[(d["kind"] == "near") & (d["n_patients"] > 1)]
    assert set(near["image_id"]) >= {"cfp_0005_OI_f_1", "cfp_0478_OI_f_1", "cfp_0002_OD_f_1", "cfp_0473_OD_f_1"}

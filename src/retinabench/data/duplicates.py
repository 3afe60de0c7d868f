"""Exact and near-duplicate images, within a dataset and across the datasets a config selects.

*Exact* duplicates share the file's sha256. *Near* duplicates are different files whose decoded images have
perceptual hashes within :data:`DEFAULT_MAX_DISTANCE` bits of each other: the DCT hash of ``imagehash.phash``
with ``hash_size=16`` (256 bits: the sign of each of the 16×16 lowest DCT frequencies of the 64×64 grayscale
image relative to their median).

Why 256 bits and a threshold of 8 (measured on ../shared/data/tvhl, 1,548 fundus + 1,113 OCT images; the numbers
are in docs/data-integrity.md): the usual 64-bit phash cannot tell fundus photographs apart — 194 pairs of
*different* fundus images of different patients are within 4 of 64 bits (dark, low-contrast photographs all hash
alike). At 256 bits, re-encodings of one image (JPEG quality 60, half and quarter size) stay within 6 bits on
fundus and 8 on OCT, the same photograph filed under two patient ids is within 2 bits, and only one pair of
visibly different images (two nearly black photographs) is within 8 bits, against 25 pairs within 12 and 72
within 16. So 8 keeps re-saved and resized copies together without chaining unrelated images into large
clusters; brightness/contrast edits (up to 18 bits) and crops (>50 bits) are not caught — no global hash does
both. ``duplicates.max_distance`` in the config changes it.

Search: exact by sha256; near by the pigeonhole principle (two 256-bit hashes within d bits agree exactly on at
least one of d + 1 disjoint chunks), so candidate pairs come from equal 16-bit (d < 16) or 8-bit (d < 32) chunks
and only those are compared bit by bit — no all-pairs matrix, whatever the dataset size.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from retinabench.data.image_checks import HASH_VERSION, PHASH_BYTES, PHASH_SIZE, perceptual_hash  # noqa: F401

DEFAULT_MAX_DISTANCE = 8
DUPLICATE_COLUMNS = ["cluster_id", "image_id", "patient_id", "sha256", "kind", "distance", "nearest", "n_images",
                     "n_patients"]
CROSS_COLUMNS = ["dataset_a", "image_a", "split_a", "dataset_b", "image_b", "split_b", "kind", "distance"]


def hash_matrix(hex_hashes) -> np.ndarray:
    """``[N, 32]`` uint8 matrix of hex perceptual hashes."""
    values = list(hex_hashes)
    bad = [h for h in values if not isinstance(h, str) or len(h) != 2 * PHASH_BYTES]
    if bad:
        raise ValueError(f"perceptual hashes must be {2 * PHASH_BYTES} hex characters, got e.g. {bad[0]!r}")
    if not values:
        return np.zeros((0, PHASH_BYTES), dtype=np.uint8)
    return np.frombuffer(bytes.fromhex("".join(values)), dtype=np.uint8).reshape(len(values), PHASH_BYTES)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise Hamming distance of two ``[M, 32]`` uint8 matrices."""
    return np.bitwise_count(np.bitwise_xor(a, b)).sum(axis=1).astype(np.int64)


def near_pairs(hashes: np.ndarray, max_distance: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs ``i < j`` of rows of ``hashes`` within ``max_distance`` bits: arrays ``(i, j, distance)``."""
    n = len(hashes)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    if n < 2 or max_distance < 0:
        return empty
    # Identical hashes first (e.g. many blank images): one representative each, pairs expanded at the end.
    uniq, inverse = np.unique(hashes, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    if max_distance < 16:
        chunks = uniq.view(">u2")
    elif max_distance < 32:
        chunks = uniq
    else:
        chunks = None
    cand: set[tuple[int, int]] = set()
    if chunks is None:  # no pigeonhole chunking possible: all pairs of distinct hashes
        cand = set(combinations(range(len(uniq)), 2))
    else:
        for c in range(chunks.shape[1]):
            col = chunks[:, c]
            order = np.argsort(col, kind="stable")
            sorted_col = col[order]
            starts = np.flatnonzero(np.r_[True, sorted_col[1:] != sorted_col[:-1]])
            ends = np.r_[starts[1:], len(order)]
            for s, e in zip(starts, ends):
                if e - s > 1:
                    cand.update(combinations(sorted(order[s:e].tolist()), 2))
    ui = np.fromiter((p[0] for p in cand), np.int64, len(cand))
    uj = np.fromiter((p[1] for p in cand), np.int64, len(cand))
    d = hamming(uniq[ui], uniq[uj]) if len(cand) else np.zeros(0, np.int64)
    keep = d <= max_distance
    ui, uj, d = ui[keep], uj[keep], d[keep]
    # Expand representatives back to rows: pairs between members of two hash classes, and within one class.
    members = pd.Series(np.arange(n)).groupby(inverse).apply(list).to_dict()
    out_i, out_j, out_d = [], [], []
    for a, b, dist in zip(ui.tolist(), uj.tolist(), d.tolist()):
        for x in members[a]:
            for y in members[b]:
                out_i.append(min(x, y))
                out_j.append(max(x, y))
                out_d.append(dist)
    for rows in members.values():
        for x, y in combinations(rows, 2):
            out_i.append(x)
            out_j.append(y)
            out_d.append(0)
    if not out_i:
        return empty
    return np.array(out_i, np.int64), np.array(out_j, np.int64), np.array(out_d, np.int64)


def _components(n: int, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    graph = coo_matrix((np.ones(len(i), dtype=np.int8), (i, j)), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def find_duplicates(images: pd.DataFrame, *, max_distance: int = DEFAULT_MAX_DISTANCE) -> pd.DataFrame:
    """Duplicate clusters of one dataset's images (``image_id, patient_id, sha256, phash``).

    A cluster is a connected component of "same sha256" and "phash within ``max_distance``" links with at least
    two images. One row per member: ``kind`` is ``exact`` when another member has the same bytes, else ``near``;
    ``distance`` / ``nearest``: the closest other member (0 for an exact twin). ``cluster_id`` is
    ``dup:<smallest image id of the cluster>``, so it does not change when unrelated images come or go.
    """
    df = images.sort_values("image_id", kind="stable").reset_index(drop=True)
    n = len(df)
    if n == 0:
        return pd.DataFrame(columns=DUPLICATE_COLUMNS)
    sha_code = pd.factorize(df["sha256"])[0]
    # Exact links: each image to the first image of its sha256 group.
    first = pd.Series(np.arange(n)).groupby(sha_code).transform("min").to_numpy()
    ex = first != np.arange(n)
    ei, ej = first[ex], np.arange(n)[ex]
    has_hash = df["phash"].notna().to_numpy()
    idx = np.flatnonzero(has_hash)
    ni, nj, nd = near_pairs(hash_matrix(df.loc[has_hash, "phash"]), max_distance) if len(idx) > 1 else \
        (np.zeros(0, np.int64),) * 3
    ni, nj = idx[ni], idx[nj]
    comp = _components(n, np.r_[ei, ni], np.r_[ej, nj])
    size = np.bincount(comp)
    in_cluster = size[comp] > 1
    if not in_cluster.any():
        return pd.DataFrame(columns=DUPLICATE_COLUMNS)
    # Nearest other member (rows are in image_id order, so a smaller row is a smaller id): an exact twin
    # (distance 0) first, else the nearest near link; ties go to the smaller image id.
    best_d = np.full(n, np.iinfo(np.int64).max)
    best_j = np.full(n, -1)
    exact = np.zeros(n, dtype=bool)
    for members in pd.Series(np.arange(n)).groupby(sha_code).groups.values():
        m = sorted(members)
        if len(m) > 1:
            for x in m:
                best_d[x], best_j[x], exact[x] = 0, (m[0] if x != m[0] else m[1]), True
    for a, b, dist in zip(ni.tolist(), nj.tolist(), nd.tolist()):
        for x, y in ((a, b), (b, a)):
            if dist < best_d[x] or (dist == best_d[x] and y < best_j[x]):
                best_d[x], best_j[x] = dist, y
    out = df.loc[in_cluster, ["image_id", "patient_id", "sha256"]].copy()
    rows = np.flatnonzero(in_cluster)
    comp_min = df.groupby(comp)["image_id"].transform("min")
    out["cluster_id"] = "dup:" + comp_min[in_cluster].to_numpy()
    out["kind"] = np.where(exact[rows], "exact", "near")
    out["distance"] = best_d[rows]
    out["nearest"] = df["image_id"].to_numpy()[best_j[rows]]
    out["n_images"] = size[comp[rows]]
    pid = df["patient_id"].astype("string").fillna("image:" + df["image_id"])
    out["n_patients"] = pid.groupby(comp).transform("nunique").to_numpy()[rows]
    return out[DUPLICATE_COLUMNS].sort_values(["cluster_id", "image_id"]).reset_index(drop=True)


def duplicate_summary(dups: pd.DataFrame) -> dict:
    """Counts for logs and provenance: clusters, images in them, exact/near, clusters spanning patients."""
    if dups.empty:
        return {"clusters": 0, "images": 0, "exact_images": 0, "near_images": 0, "clusters_spanning_patients": 0,
                "exact_clusters": 0, "largest_cluster": 0}
    per = dups.groupby("cluster_id").agg(n=("image_id", "size"), p=("n_patients", "first"),
                                         exact=("kind", lambda k: (k == "exact").all()))
    return {"clusters": int(len(per)), "images": int(len(dups)),
            "exact_images": int((dups["kind"] == "exact").sum()), "near_images": int((dups["kind"] == "near").sum()),
            "exact_clusters": int(per["exact"].sum()), "clusters_spanning_patients": int((per["p"] > 1).sum()),
            "largest_cluster": int(per["n"].max())}


def cross_dataset_duplicates(tables: dict[str, pd.DataFrame], *,
                             max_distance: int = DEFAULT_MAX_DISTANCE) -> pd.DataFrame:
    """Pairs of images of two *different* datasets that are exact or near duplicates.

    ``tables``: dataset -> ``image_id, sha256, phash, split`` (the dataset's split assignment). Rows have
    ``dataset_a`` before ``dataset_b`` in the order of ``tables`` (the config's order), so "test images of B
    that duplicate training images of A" is ``split_a == "train" and split_b == "test"``."""
    order = list(tables)
    frames = [t.assign(dataset=d, _rank=k) for k, (d, t) in enumerate(tables.items())]
    if len(frames) < 2:
        return pd.DataFrame(columns=CROSS_COLUMNS)
    allimg = pd.concat(frames, ignore_index=True)
    pairs = []
    by_sha = allimg.groupby("sha256")
    for _, grp in by_sha:
        if grp["dataset"].nunique() < 2:
            continue
        for a, b in combinations(grp.index, 2):
            if allimg.at[a, "dataset"] != allimg.at[b, "dataset"]:
                pairs.append((a, b, 0, "exact"))
    exact_keys = {(min(a, b), max(a, b)) for a, b, _, _ in pairs}
    has = allimg["phash"].notna().to_numpy()
    idx = np.flatnonzero(has)
    if len(idx) > 1:
        i, j, d = near_pairs(hash_matrix(allimg.loc[has, "phash"]), max_distance)
        for a, b, dist in zip(idx[i].tolist(), idx[j].tolist(), d.tolist()):
            if allimg.at[a, "dataset"] != allimg.at[b, "dataset"] and (a, b) not in exact_keys:
                pairs.append((a, b, dist, "near"))
    rows = []
    for a, b, dist, kind in pairs:
        ra, rb = allimg.loc[a], allimg.loc[b]
        if ra["_rank"] > rb["_rank"]:
            ra, rb = rb, ra
        rows.append({"dataset_a": ra["dataset"], "image_a": ra["image_id"], "split_a": ra.get("split"),
                     "dataset_b": rb["dataset"], "image_b": rb["image_id"], "split_b": rb.get("split"),
                     "kind": kind, "distance": int(dist)})
    out = pd.DataFrame(rows, columns=CROSS_COLUMNS)
    if len(out):
        rank = {d: k for k, d in enumerate(order)}
        out = out.assign(_a=out["dataset_a"].map(rank), _b=out["dataset_b"].map(rank)).sort_values(
            ["_a", "_b", "image_a", "image_b"]).drop(columns=["_a", "_b"]).reset_index(drop=True)
    return out

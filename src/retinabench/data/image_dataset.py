"""torch Dataset / samplers over the uint8 image cache for training with augmentation.

Reproducibility without hidden state: the training order is an endless stream of seeded permutations of the
training images (pass ``p`` uses permutation ``randperm(n, seed=mix(seed, p))``), and the batch of optimisation
step ``s`` is stream positions ``[s*B, (s+1)*B)``. Each sample's augmentation draws its random numbers from its
own generator seeded by ``mix(seed, position)`` (``protocols.augment.draw_params``). Everything a step sees is
therefore a pure function of ``(seed, s)``: a run resumed at step ``s`` (after a kill) sees exactly the batches an
uninterrupted run would, whatever the number of DataLoader workers and whichever worker loads which sample.

The cache ``.npy`` is opened lazily in each process (memory-mapped): pickling a memmap to a worker would copy
the whole array.
"""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix_seed(*parts: int | np.ndarray) -> np.ndarray:
    """splitmix64 over the given integers (vectorised over array parts): independent-looking 63-bit seeds."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        z = np.zeros(np.broadcast(*[np.asarray(p) for p in parts]).shape, dtype=np.uint64)
        for p in parts:
            z = z ^ np.asarray(p).astype(np.uint64)
            z = z + np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
    return (z & _MASK64) >> np.uint64(1)  # 63 bits: a valid torch.manual_seed / Generator seed


class CachedImageDataset(Dataset):
    """Items are ``(uint8 CHW image, label, sample_seed)``; keys are ``(i, sample_seed)``, ``i`` indexing ``rows``.

    ``transform(img, sample_seed)`` (e.g. ``protocols.augment.Augment``) runs when given and ``sample_seed >= 0``
    (evaluation passes -1); the seed is returned too, for augmentation on the training device instead.
    """

    def __init__(self, array_path: str | os.PathLike, rows: np.ndarray, labels: np.ndarray, transform=None):
        self.array_path = str(array_path)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        if len(self.rows) != len(self.labels):
            raise ValueError(f"CachedImageDataset: {len(self.rows)} rows but {len(self.labels)} labels")
        self.transform = transform
        self._images: np.ndarray | None = None

    @property
    def images(self) -> np.ndarray:
        if self._images is None:
            self._images = np.load(self.array_path, mmap_mode="r")
            if self._images.ndim != 4 or self._images.shape[-1] != 3 or self._images.dtype != np.uint8:
                raise ValueError(f"{self.array_path}: not an image cache (uint8 [N, S, S, 3]); got "
                                 f"{self._images.dtype} {self._images.shape}")
            if len(self.rows) and self.rows.max() >= self._images.shape[0]:
                raise IndexError(f"{self.array_path}: row {self.rows.max()} requested, cache has "
                                 f"{self._images.shape[0]} images")
        return self._images

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_images"] = None  # reopened (memory-mapped) in the worker
        return state

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key):
        i, sample_seed = key
        img = torch.from_numpy(np.array(self.images[self.rows[i]])).permute(2, 0, 1).contiguous()
        if self.transform is not None and sample_seed >= 0:
            if get_worker_info() is None:
                # In the main process: small per-image ops with several intra-op threads are ~10x slower than
                # with one on a loaded machine (thread hand-off dominates), so run them single-threaded.
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                try:
                    img = self.transform(img, int(sample_seed))
                finally:
                    torch.set_num_threads(threads)
            else:
                img = self.transform(img, int(sample_seed))
        return img, int(self.labels[i]), int(sample_seed)


class StreamBatchSampler(Sampler):
    """Batches of optimisation steps ``start_step .. end_step - 1`` as lists of ``(i, sample_seed)``."""

    def __init__(self, n: int, batch_size: int, seed: int, start_step: int, end_step: int):
        if n < 1:
            raise ValueError("StreamBatchSampler: no training samples")
        self.n, self.batch_size, self.seed = int(n), int(batch_size), int(seed)
        self.start_step, self.end_step = int(start_step), int(end_step)
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, p: int) -> np.ndarray:
        if p not in self._perms:
            if len(self._perms) > 4:  # only the current pass or two are ever needed
                self._perms.clear()
            g = torch.Generator().manual_seed(int(mix_seed(self.seed, p, 0x5EED)))
            self._perms[p] = torch.randperm(self.n, generator=g).numpy()
        return self._perms[p]

    def batch(self, step: int) -> list[tuple[int, int]]:
        pos = np.arange(step * self.batch_size, (step + 1) * self.batch_size, dtype=np.int64)
        passes, within = pos // self.n, pos % self.n
        idx = np.empty(len(pos), dtype=np.int64)
        for p in np.unique(passes):
            m = passes == p
            idx[m] = self._perm(int(p))[within[m]]
        seeds = mix_seed(self.seed, pos, 0xA06)
        return list(zip(idx.tolist(), seeds.astype(np.int64).tolist()))

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for step in range(self.start_step, self.end_step):
            yield self.batch(step)

    def __len__(self) -> int:
        return max(0, self.end_step - self.start_step)


class SequentialBatchSampler(Sampler):
    """Evaluation batches in order, untransformed."""

    def __init__(self, n: int, batch_size: int):
        self.n, self.batch_size = int(n), int(batch_size)

    def __iter__(self):
        for start in range(0, self.n, self.batch_size):
            yield [(i, -1) for i in range(start, min(self.n, start + self.batch_size))]

    def __len__(self) -> int:
        return (self.n + self.batch_size - 1) // self.batch_size


def worker_init(worker_id: int) -> None:
    """One compute thread per worker (the main process owns the rest). The augmentation does not use global
    RNGs, but numpy/python ones are seeded from torch's per-worker seed (derived from the DataLoader's seeded
    generator) so that any transform added later stays reproducible."""
    import random
    torch.set_num_threads(1)
    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)

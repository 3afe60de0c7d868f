"""Peak memory of one measured phase, on CUDA and on CPU.

CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` — the most tensor memory the caching
allocator handed out during the phase, including what was alive at the reset (the model's weights).

CPU: tensor allocations go through malloc, so the honest measure is the process's resident set. The kernel keeps
its high-water mark (``VmHWM``); writing ``5`` to ``/proc/self/clear_refs`` resets it to the current RSS (Linux >=
4.0), which gives an exact peak without sampling. The figure reported is ``VmHWM - baseline``, the baseline being
the RSS before the model was built (after imports and the input images), so it counts the model's resident
weights, activations, gradients, optimizer state and whatever oneDNN / the allocator keep resident during the
phase, but not the interpreter, the libraries or the images. ``malloc_trim`` before each measurement hands freed
heap pages back, so one phase's leftovers do not hide the next one's growth. Where ``clear_refs`` cannot be
written (not Linux, a locked-down container) the fallback is ``ru_maxrss - baseline`` of the process (kind
``rss_maxrss_delta``), which can also include an earlier peak (e.g. loading the weights); the kind is recorded.
Python's ``tracemalloc`` is no use here: torch's buffers are not Python allocations.
"""
from __future__ import annotations

import ctypes
import gc
import re
import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def rss_mb() -> float:
    """Current resident set size (MiB)."""
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 2**20)


def trim_heap() -> None:
    """Collect garbage and return freed malloc memory to the system (glibc ``malloc_trim``; a no-op elsewhere)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def baseline_rss_mb() -> float:
    """The RSS a CPU peak is measured against: taken after :func:`trim_heap`, as :meth:`PeakMemory.start` trims too
    (a baseline read before trimming would count freed-but-resident memory against the phase)."""
    trim_heap()
    return rss_mb()


def reset_rss_peak() -> bool:
    """Reset the kernel's RSS high-water mark to the current RSS; False where that is not possible."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


class PeakMemory:
    """``start()`` right before the measured phase (the model built), ``peak_mb()`` after it.

    ``baseline_mb`` (CPU): :func:`baseline_rss_mb` before the model was built; the CPU peak is reported relative to
    it.
    """

    def __init__(self, device: torch.device, baseline_mb: float = 0.0):
        self.device, self.baseline_mb = device, float(baseline_mb)
        self.kind: str | None = None
        self.at_start_mb = 0.0

    def start(self) -> PeakMemory:
        trim_heap()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.kind = "cuda_max_memory_allocated"
            self.at_start_mb = torch.cuda.memory_allocated(self.device) / 2**20
        else:
            self.kind = "rss_hwm_delta" if reset_rss_peak() else "rss_maxrss_delta"
            self.at_start_mb = rss_mb() - self.baseline_mb
        return self

    def peak_mb(self) -> float:
        if self.kind is None:
            raise RuntimeError("PeakMemory.peak_mb() before start()")
        if self.kind == "cuda_max_memory_allocated":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.kind == "rss_hwm_delta":
            hwm = _status_kib("VmHWM")
            assert hwm is not None  # the kind is rss_hwm_delta only where /proc/self/status has VmHWM
            return hwm / 1024 - self.baseline_mb
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - self.baseline_mb

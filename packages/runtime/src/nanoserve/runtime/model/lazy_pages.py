"""Zeroed storage that costs memory only as it is written: what the K/V and state pools are
made of on a CPU."""

from __future__ import annotations

import contextlib
import math
import mmap

import torch


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros. On a CPU, pages of an anonymous map, which the OS hands out zeroed on first
    touch: a 1 GiB pool costs nothing until its slots are written, and only the slots ever
    written are resident (torch.zeros writes every byte at once, seconds for a large pool)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = math.prod(shape)
    # In 4 KiB pages (MADV_NOHUGEPAGE, for hosts whose transparent huge pages are "always"): a
    # slot's first write then faults in 4 KiB, where a huge page is 2 MiB at once, and a VM that
    # reports free huge blocks to its host faults each back in slowly, in front of a step
    # (RESULTS.md, 2026-12-04: a 1.5B's first forward at boot, with and without huge pages).
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    pages = mmap.mmap(-1, max(1, numel * dtype.itemsize), flags=flags)
    with contextlib.suppress(AttributeError, OSError):  # a hint; absent off Linux
        pages.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(pages, dtype=dtype, count=numel).view(shape)

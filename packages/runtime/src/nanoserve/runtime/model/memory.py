"""Free memory on a device: what the pool plan and the warm-up budget are measured against."""

from __future__ import annotations

import ctypes
import sys

import torch


def free_bytes(device: torch.device | str) -> int:
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return host_available_bytes()


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); elsewhere a conservative 1 GiB."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 30


def keep_freed_memory() -> bool:
    """Stop glibc handing each step's large temporaries back to the OS.

    By default glibc serves allocations over 128 KiB with mmap and frees them with munmap (and
    trims the heap top), so every decode step faults its gather and score buffers in afresh, a
    wide step's largest cost (RESULTS.md has the figures). One call per process; returns whether the settings took (False off glibc)."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    settings = (
        (m_mmap_threshold, 32 << 20),
        (m_trim_threshold, (1 << 31) - 1),
        (m_top_pad, 256 << 20),
    )
    return all(libc.mallopt(option, value) == 1 for option, value in settings)

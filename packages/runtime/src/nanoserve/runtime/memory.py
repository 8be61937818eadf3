"""Free memory on a device: what the pool plan and the warm-up budget are measured against."""

from __future__ import annotations

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

"""Devices named once: `cuda` resolved to an index, and CUDA calls made under that device.

torch's stream, current-stream and memory calls act on the *current* CUDA device, not on the
tensor they are about; an engine on `cuda:1` must enter its device before any of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def resolve_device(device: torch.device | str) -> torch.device:
    """`cuda` -> `cuda:<current>` (0 where CUDA is absent, e.g. a fake-CUDA trace on a CPU)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return torch.device("cuda", index)
    return device


@contextlib.contextmanager
def on_device(device: torch.device) -> Iterator[None]:
    """Make `device` current for the CUDA calls inside (a no-op off CUDA)."""
    if device.type == "cuda" and torch.cuda.is_available():
        with torch.cuda.device(device):
            yield
    else:
        yield

"""read_bytes (kernels/csrc/memory_ops.cpp), the roofline's read pass: it reads every whole
64-byte line once, on any thread count, and refuses what it cannot read as bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels

WRAP = (1 << 64) - 1


@pytest.fixture(autouse=True, scope="module")
def kernels() -> None:
    load_cpu_kernels()


def line_sum(buffer: torch.Tensor) -> int:
    """The 64-bit sum of the whole lines' words, as written (numpy's uint64 wraps the same)."""
    whole = buffer.numel() // 64 * 64
    return int(buffer[:whole].numpy().view(np.uint64).sum(dtype=np.uint64))


@settings(max_examples=25, deadline=None)
@given(size=st.integers(0, 3 * 4096 * 64 + 200), seed=st.integers(0, 2**16))
def test_the_sum_of_every_whole_line(size: int, seed: int) -> None:
    buffer = torch.randint(
        0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )
    assert kernel_ops.read_bytes(buffer) & WRAP == line_sum(buffer)


def test_a_partial_last_line_is_not_read() -> None:
    buffer = torch.zeros(64 * 3 + 63, dtype=torch.uint8)
    buffer[-63:] = 255
    assert kernel_ops.read_bytes(buffer) == 0
    buffer[64:72] = torch.tensor([1, 0, 0, 0, 0, 0, 0, 0], dtype=torch.uint8)
    assert kernel_ops.read_bytes(buffer) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_any_thread_count_reads_the_same(threads: int) -> None:
    buffer = torch.randint(0, 256, (1 << 22,), dtype=torch.uint8)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert kernel_ops.read_bytes(buffer) & WRAP == line_sum(buffer)
    finally:
        torch.set_num_threads(before)


def test_refuses_what_is_not_contiguous_bytes() -> None:
    with pytest.raises(RuntimeError, match="contiguous uint8"):
        kernel_ops.read_bytes(torch.zeros(128, dtype=torch.float32))
    with pytest.raises(RuntimeError, match="contiguous uint8"):
        kernel_ops.read_bytes(torch.zeros(256, dtype=torch.uint8)[::2])

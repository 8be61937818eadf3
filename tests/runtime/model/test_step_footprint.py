"""The footprint formula against the allocator: a decode step's measured peak on this CPU.

glibc's mallinfo2 reports the bytes malloc has handed out (heap and mmapped chunks); torch's
CPU allocator is malloc. Sampled after every aten op of one step, its high-water mark over the
step's start is the step's peak (what lives only inside one kernel is not seen, and is small).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nanoserve.core import DecodeBuffers, SlotTable, StepFootprint, padding_plan, plan_kv_pool
from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.memory import keep_freed_memory

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="mallinfo2 is glibc's")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


class PeakBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        self._mallinfo = libc.mallinfo2
        self.base = self._in_use()
        self.peak = 0

    def _in_use(self) -> int:
        info = self._mallinfo()
        return int(info.uordblks + info.hblkhd)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self._in_use() - self.base)
        return out


@pytest.mark.parametrize(
    ("dtype", "batch_invariant"),
    [(torch.float32, True), (torch.float32, False), (torch.bfloat16, True)],
)
def test_measured_peaks_sit_just_under_the_formula(
    embedded_checkpoint: Checkpoint, dtype: torch.dtype, batch_invariant: bool
) -> None:
    """One layer of the embedded model's geometry (attention's peak is one layer's), random
    weights: the formula bounds the measured peak from above, within 20%, where attention
    dominates the step."""
    import dataclasses

    keep_freed_memory()
    config = dataclasses.replace(embedded_checkpoint.config, num_layers=1)
    model = LlamaModel.empty(
        config, dtype=dtype, batch_invariant=batch_invariant, max_positions=1024
    )
    pool_plan = plan_kv_pool(
        num_layers=1, num_kv_heads=3, head_dim=64, dtype=dtype, block_size=16, budget_bytes=1 << 24
    )
    pool = KVPool(pool_plan)
    table = SlotTable(32, 1024, pool_plan.sink_slot)
    buffers = DecodeBuffers.allocate(32, pool_plan.sink_slot)
    footprint = StepFootprint(
        9, 3, 64, config.vocab_size, dtype.itemsize, model.accum_dtype.itemsize
    )
    ratios = []
    with torch.inference_mode():
        for rows, width in ((4, 512), (8, 1024), (32, 1024)):
            plan = buffers.load(padding_plan(rows, width, table=table))
            model.forward(plan, pool.empty_rows())  # first touches: the pool, arenas, MKL's buffers
            for _ in range(2):  # the first run under a dispatch mode sets up ~25 MB of its own
                with PeakBytes() as peak:
                    model.forward(plan, pool.empty_rows())
            ratios.append(peak.peak / footprint.peak_bytes(rows, width))
    assert all(0.8 <= r <= 1.0 for r in ratios), ratios

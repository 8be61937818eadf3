"""The recorded step traced as CUDA would run it, on a machine without CUDA.

On a CPU every tensor is a host tensor, so a host zero or a device-less factory inside the step
is invisible to a real run. Here the whole step lives on `meta` (weights, K/V pool, slot table,
persistent buffers, a hybrid's state pool, logits buffer), standing in for the accelerator, and the capture guard
treats anything on the host as the foreign device it would be on a GPU: a host tensor, a
host<->device copy or a sync in the step fails by name. Meta tensors have shapes and no data, so
a 30-layer model's whole warm list traces in seconds and needs no weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from nanoserve.core import DecodeBuffers, Shape, SlotTable, padding_plan, plan_kv_pool
from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.runtime.decode.capture_guard import capture_guard
from nanoserve.runtime.decode.recordings import DecodeRecordings, FrozenCallBackend
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.state_pool import StatePool

TRACE_DEVICE = torch.device("meta")


@dataclass(frozen=True, slots=True)
class StepTrace:
    shapes: tuple[Shape, ...]  # traced, every one clean
    ops: int  # aten ops the guard saw, over all shapes


def trace_recorded_steps(
    config: ModelConfig,
    shapes: Iterable[Shape],
    *,
    dtype: torch.dtype = torch.float32,
    quantize: str | None = None,
    batch_invariant: bool = True,
    max_batch: int,
    max_model_len: int,
    block_size: int = 16,
) -> StepTrace:
    """Run the recorded decode step of every shape on meta under the capture guard.

    Raises the guard's named error (HostSyncError, ForeignDeviceError, DynamicShapeError) at
    the first op a CUDA graph could not hold."""
    model = LlamaModel.empty(
        config,
        dtype=dtype,
        device=TRACE_DEVICE,
        quantize=quantize,
        batch_invariant=batch_invariant,
        max_positions=max_model_len,
    )
    widest_kv = max((h * d for h, d in config.kv_layer_shapes), default=config.kv_size)
    pool_plan = plan_kv_pool(
        num_layers=len(config.kv_layers),
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dtype=model.kv_dtype,
        block_size=block_size,
        budget_bytes=max_batch * max_model_len * config.num_layers * widest_kv * 2 * 4,
        layer_shapes=config.kv_layer_shapes,
    )
    # A hybrid's recurrent state on the device too: its padded rows read and write the sink.
    states = StatePool(StatePoolPlan(max_batch, config.state_shapes), TRACE_DEVICE)
    pool = KVPool(pool_plan, TRACE_DEVICE, states)
    table = SlotTable(max_batch, max_model_len, pool_plan.sink_slot, TRACE_DEVICE)
    sink_state = pool.sink_state_slot
    buffers = DecodeBuffers.allocate(max_batch, pool_plan.sink_slot, TRACE_DEVICE, sink_state)
    recordings = DecodeRecordings(
        model.forward,
        table,
        buffers,
        backend=FrozenCallBackend(),
        footprint=model.step_footprint(),
        budget_bytes=lambda: 1 << 62,
    )
    traced: list[Shape] = []
    ops = 0
    with torch.inference_mode():
        for shape in shapes:
            warm = padding_plan(shape.rows, shape.width, table=table, sink_state_slot=sink_state)
            plan = buffers.load(warm)
            with capture_guard(TRACE_DEVICE) as guard:
                recordings.step(plan, pool.empty_rows())
            ops += guard.num_ops
            traced.append(shape)
    return StepTrace(tuple(traced), ops)

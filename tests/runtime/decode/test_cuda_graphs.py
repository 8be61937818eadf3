"""The CUDA backend: torch.cuda.CUDAGraph recordings in one shared pool. Needs a GPU
(`nox -s gpu`); without CUDA every test here skips itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nanoserve.core import DecodeBuffers, warm_shapes
from nanoserve.core.capture_gates import AddressesMovedError
from nanoserve.runtime.decode.recordings import CudaGraphBackend
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from tests.runtime.capture_helpers import (
    buckets_of,
    recordings_of,
    run_joining_workload,
    tiny_engine,
    warm,
)

pytestmark = pytest.mark.gpu


def cuda_engine(model_dir: Path, **config: object) -> Engine:
    return tiny_engine(model_dir, **{"device": "cuda", **config})


def test_cuda_recordings_equal_the_same_shapes_run_eagerly(tiny_llama_dir: Path) -> None:
    """Same bucket shapes, same kernels: recorded and persistent-eager tokens are bit-identical."""
    persistent = run_joining_workload(cuda_engine(tiny_llama_dir, decode_mode="persistent"))
    engine = cuda_engine(tiny_llama_dir, decode_mode="recorded")
    assert isinstance(recordings_of(engine).backend, CudaGraphBackend)
    assert run_joining_workload(engine) == persistent
    stats = recordings_of(engine).stats()
    assert stats.backend == "cuda-graph" and stats.replays > 0


def test_cuda_recordings_share_one_pool(tiny_llama_dir: Path) -> None:
    """Pool bytes are the recordings' memory alone, and one pool serves them all.

    The K/V pool is made far bigger than every recording of the tiny model together, so a
    baseline taken before the pool was allocated shows up as pool bytes above it. The largest
    shape is recorded first and sizes the shared pool; the other 15 reuse its memory and add
    only their outputs, where separate pools would each add at least a segment of their own.
    """
    engine = cuda_engine(
        tiny_llama_dir,
        decode_mode="recorded",
        max_model_len=64,
        width_multiple=16,
        kv_budget_bytes=64 << 20,
    )
    recordings = recordings_of(engine)
    assert recordings is not None
    shapes = warm_shapes(buckets_of(engine))
    warm(engine, shapes[:1])
    first = recordings.stats().pool_bytes
    report = warm(engine, shapes[1:])
    pool = recordings.stats().pool_bytes
    assert report.num_recorded == len(shapes) - 1
    assert len(recordings.by_shape) == len(shapes) == 16
    assert 0 < first <= pool
    assert pool < engine.pool_plan.total_bytes, "pool bytes count the K/V pool"
    assert pool <= 2 * first, f"16 recordings took {pool} B, the first alone {first} B"


def test_cuda_warm_engine_makes_no_cold_recording(tiny_llama_dir: Path) -> None:
    config = {"decode_mode": "recorded", "max_model_len": 64, "width_multiple": 16, "max_batch": 4}
    lazy = run_joining_workload(cuda_engine(tiny_llama_dir, **config))
    engine = cuda_engine(tiny_llama_dir, **config)
    warm(engine, warm_shapes(buckets_of(engine)))
    assert run_joining_workload(engine) == lazy
    assert recordings_of(engine).num_cold == 0


def test_cuda_moved_buffer_refuses_replay(tiny_llama_dir: Path) -> None:
    engine = cuda_engine(tiny_llama_dir, decode_mode="recorded")
    engine.add_request(
        "a", [5, 17, 3], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    )
    engine.step()
    engine.step()  # records
    recordings = recordings_of(engine)
    recordings.buffers = DecodeBuffers.allocate(
        recordings.buffers.max_batch, engine.pool_plan.sink_slot, "cuda"
    )
    with pytest.raises(AddressesMovedError):
        engine.step()
    torch.cuda.synchronize()


def test_cuda_staging_is_rewritten_only_after_its_copy_landed() -> None:
    """The pinned staging feeds an asynchronous copy: an event recorded after the copy, and
    waited on before the staging is rewritten, keeps the next step (or the next chunk of this
    one) from overwriting values the device has not read yet. With the stream busy, a one-chunk
    load returns with its copy still queued; a load of several chunks waits between them."""
    from nanoserve.core import BlockTable, DecodeSeq, Shape
    from nanoserve.runtime.decode.decode_inputs import DecodeInputs

    def table_of(*blocks: int) -> BlockTable:
        table = BlockTable(4)
        table.blocks.extend(blocks)
        return table

    inputs = DecodeInputs(2, 16, 99, torch.device("cuda"), capacity=4)
    assert inputs.copied is not None
    torch.cuda._sleep(1_000_000_000)  # the stream busy (~0.5 s) ahead of the copy
    inputs.load([DecodeSeq(1, 41, 2, table_of(0, 1, 2))], Shape(1, 16))  # 3 entries: 1 chunk
    assert not inputs.copied.query(), "the event must be recorded behind the copy"
    torch.cuda._sleep(1_000_000_000)
    # 8 new entries (positions 3..10): 2 chunks, the second rewriting the staging the first
    # was copied out of, behind a busy stream.
    plan = inputs.load([DecodeSeq(1, 42, 10, table_of(0, 1, 2))], Shape(1, 16))
    torch.cuda.synchronize()
    assert inputs.num_copies == 3
    assert plan.input_ids.tolist() == [42] and plan.positions.tolist() == [10]
    assert plan.slot_rect[0, :11].tolist() == list(range(11))

"""DecodeInputs: a step planned on the host, moved in one copy; the transfers of a decode step
counted op by op."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from nanoserve.core import BlockTable, DecodeSeq, Shape, warm_shapes
from nanoserve.runtime.decode.decode_inputs import DecodeInputs
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from tests.runtime.capture_helpers import buckets_of, recordings_of, tiny_engine, warm

SINK = 99


def table_of(*blocks: int) -> BlockTable:
    table = BlockTable(4)
    table.blocks.extend(blocks)
    return table


def test_load_writes_the_vectors_and_only_new_table_entries() -> None:
    inputs = DecodeInputs(4, 16, SINK, torch.device("cpu"), capacity=9)
    a, b = table_of(2, 5), table_of(7)
    plan = inputs.load([DecodeSeq(10, 41, 5, a), DecodeSeq(11, 42, 2, b)], Shape(4, 8))
    assert plan.seq_ids == (10, 11) and plan.pad_rows == 2 and plan.shape == (4, 8)
    assert plan.input_ids.tolist() == [41, 42, 0, 0]
    assert plan.positions.tolist() == [5, 2, 0, 0]
    assert plan.write_slots.tolist() == [21, 30, SINK, SINK]  # block 5 offset 1; block 7 offset 2
    assert plan.context_lens.tolist() == [6, 3, 0, 0]
    assert plan.slot_rect[0, :6].tolist() == [8, 9, 10, 11, 20, 21]
    assert plan.slot_rect[1, :3].tolist() == [28, 29, 30]
    assert plan.input_ids.data_ptr() == inputs.buffers.input_ids.data_ptr()
    assert plan.slot_rect.data_ptr() == inputs.table.address
    assert inputs.num_copies == 1
    # Next step: one new entry per row, same single copy.
    inputs.table.tensor[0, :6] = -1  # a stale copy of row 0 would show
    plan = inputs.load([DecodeSeq(10, 43, 6, a), DecodeSeq(11, 44, 3, b)], Shape(2, 8))
    assert plan.slot_rect[0, :7].tolist() == [-1] * 6 + [22]
    assert plan.slot_rect[1, :4].tolist() == [28, 29, 30, 31]
    assert inputs.num_copies == 2


def test_a_new_owner_rewrites_its_row_and_overflow_takes_more_copies() -> None:
    inputs = DecodeInputs(2, 16, SINK, torch.device("cpu"), capacity=4)
    long = table_of(0, 1, 2)
    plan = inputs.load([DecodeSeq(1, 5, 9, long)], Shape(1, 16))  # 10 entries: 3 copies
    assert plan.slot_rect[0, :10].tolist() == list(range(10))
    assert inputs.num_copies == 3
    plan = inputs.load([DecodeSeq(2, 5, 1, table_of(3))], Shape(1, 16))  # row 0, new owner
    assert plan.slot_rect[0, :2].tolist() == [12, 13] and inputs.table.owner(0) == 2


class TransferCount(TorchDispatchMode):
    """What one step would move between host and device on CUDA, seen on a CPU: copies into
    the device staging (host->device), tensors made from Python data (each one a host->device
    copy if made on a device), and reads of device values on the host."""

    def __init__(self, inputs: DecodeInputs) -> None:
        super().__init__()
        self.device_storage = inputs.storage_pointers()[1]
        self.to_device = 0
        self.from_python = 0
        self.scalar_reads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:
            self.to_device += args[0].untyped_storage().data_ptr() == self.device_storage
        elif func is torch.ops.aten.lift_fresh.default:
            self.from_python += 1
        elif torch.Tag.data_dependent_output in func.tags:
            self.scalar_reads += 1
        return func(*args, **kwargs)


class HostReads(TorchFunctionMode):
    """`.tolist()` and friends: on a CPU they never reach the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        names = ("tolist", "item", "__bool__", "__int__", "__float__", "numpy")
        self.reads += getattr(func, "__name__", "") in names
        return func(*args, **(kwargs or {}))


def count_decode_steps(engine: Engine, steps: int) -> list[tuple[int, int, int, int]]:
    inputs = engine.runner.inputs
    assert inputs is not None
    counts = []
    for _ in range(steps):
        out_before = engine.num_steps
        with HostReads() as host, TransferCount(inputs) as moved:
            engine.step()
        assert engine.num_steps == out_before + 1
        counts.append((moved.to_device, moved.from_python, moved.scalar_reads, host.reads))
    return counts


def test_a_decode_step_makes_one_copy_each_way(tiny_llama_dir: Path) -> None:
    """(host->device copies, tensors from Python data, scalar reads, host reads) per step:
    one plan copy in, the sampled ids out, nothing else — at 3 rows as at 1."""
    engine = tiny_engine(
        tiny_llama_dir, decode_mode="recorded", max_model_len=64, width_multiple=16
    )
    warm(engine, warm_shapes(buckets_of(engine)))
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", [5 + i, 17, 3, 99], greedy)
    engine.step()  # the prefill (eager; planned with tensors of its own)
    assert count_decode_steps(engine, 4) == [(1, 1, 0, 1)] * 4
    assert recordings_of(engine).num_replays == 4


def test_sampling_rows_add_one_parameter_copy(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(
        tiny_llama_dir, decode_mode="recorded", max_model_len=64, width_multiple=16
    )
    warm(engine, warm_shapes(buckets_of(engine)))
    engine.add_request("g", [5, 17, 3], SamplingParams(max_tokens=8, temperature=0))
    engine.add_request(
        "s", [6, 17, 3], SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=1)
    )
    engine.step()
    # + the sampler's [5, rows] knobs: one more tensor from Python data, one more copy on CUDA.
    assert count_decode_steps(engine, 3) == [(1, 2, 0, 1)] * 3

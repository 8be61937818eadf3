"""Recorded decode steps: each planted mistake trips the gate meant for it."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from nanoserve.core import DecodeBuffers, DecodePlan, lazy_captures, warm_shapes
from nanoserve.core.capture_gates import (
    AddressesMovedError,
    MappingNotWindowError,
    PadNotInertError,
    PlanAddressingError,
    PoolBudgetExceededError,
    ReplayRowsError,
)
from nanoserve.runtime.decode.recordings import (
    FrozenCallBackend,
    RecordingArgumentsError,
    UnrecordedShapeError,
)
from nanoserve.runtime.decode.warmup import warm_batch
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step.scheduler import SchedulerOutput
from nanoserve.runtime.model.kv_pool import CacheRows
from tests.runtime.capture_helpers import buckets_of, recordings_of, tiny_engine, warm


def decode_ready(engine: Engine, prompts: list[list[int]]) -> SchedulerOutput:
    """Prefill the prompts, then schedule (without running) the first decode-only step."""
    for i, ids in enumerate(prompts):
        engine.add_request(
            f"g{i}", ids, SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
        )
    engine.step()
    out = engine.scheduler.schedule()
    assert out.is_decode_only
    return out


@pytest.fixture
def engine(tiny_llama_dir: Path) -> Engine:
    return tiny_engine(tiny_llama_dir, decode_mode="recorded")


@pytest.fixture
def plan_and_cache(engine: Engine) -> tuple[DecodePlan, CacheRows]:
    out = decode_ready(engine, [[5, 17, 3], [9, 9, 9, 9, 9], [4, 4]])  # 3 rows: bucket 4
    plan = engine.runner.plan_decode_step(out)
    return plan, engine.pool.view(plan.seq_ids)


def test_record_then_replay_gives_the_recorded_logits(engine: Engine, plan_and_cache) -> None:
    plan, cache = plan_and_cache
    recordings = recordings_of(engine)
    recorded = recordings.record(plan, cache, cold=True)
    replayed = recordings.replay(plan)
    assert torch.equal(recorded, replayed)
    assert (recordings.num_recorded, recordings.num_cold, recordings.num_replays) == (1, 1, 1)


def test_a_rectangle_copied_instead_of_windowed_is_refused(engine: Engine, plan_and_cache) -> None:
    plan, cache = plan_and_cache
    copied = replace(plan, slot_rect=plan.slot_rect.clone())
    with pytest.raises(MappingNotWindowError, match="not a window"):
        recordings_of(engine).record(copied, cache, cold=True)


def test_a_padded_row_aimed_at_a_real_slot_is_refused(engine: Engine, plan_and_cache) -> None:
    plan, cache = plan_and_cache
    assert plan.pad_rows > 0
    writes = plan.write_slots.clone()
    writes[-1] = 0  # a real slot
    with pytest.raises(PadNotInertError, match="padded row"):
        recordings_of(engine).record(replace(plan, write_slots=writes), cache, cold=True)


def test_a_write_slot_disagreeing_with_the_rectangle_is_refused(
    engine: Engine, plan_and_cache
) -> None:
    plan, cache = plan_and_cache
    writes = plan.write_slots.clone()
    writes[0] = int(plan.slot_rect[0, 0])  # a slot of this sequence, but not its new position
    with pytest.raises(PlanAddressingError):
        recordings_of(engine).record(replace(plan, write_slots=writes), cache, cold=True)


def test_a_buffer_reallocated_after_recording_is_refused(engine: Engine, plan_and_cache) -> None:
    plan, cache = plan_and_cache
    recordings = recordings_of(engine)
    recordings.record(plan, cache, cold=True)
    recordings.buffers = DecodeBuffers.allocate(recordings.buffers.max_batch, plan.sink_slot)
    with pytest.raises(AddressesMovedError, match="input_ids was at"):
        recordings.replay(plan)


def test_a_replay_over_another_row_set_is_refused(engine: Engine, plan_and_cache) -> None:
    plan, cache = plan_and_cache
    recordings = recordings_of(engine)
    recordings.record(plan, cache, cold=True)
    other = replace(plan, seq_ids=tuple(r + 100 for r in plan.seq_ids))
    with pytest.raises(ReplayRowsError, match="froze rows"):
        recordings.replay(other)
    assert not recordings.can_replay(other)


def test_replay_refuses_an_unrecorded_shape_and_foreign_arguments(
    engine: Engine, plan_and_cache
) -> None:
    plan, cache = plan_and_cache
    recordings = recordings_of(engine)
    with pytest.raises(UnrecordedShapeError):
        recordings.replay(plan)
    recordings.record(plan, cache, cold=True)
    with pytest.raises(RecordingArgumentsError, match="input_ids"):
        recordings.replay(replace(plan, input_ids=plan.input_ids.clone()))


def test_a_budget_too_small_refuses_the_recording(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, warm_budget_bytes=16, decode_mode="recorded")
    out = decode_ready(engine, [[5, 17, 3]])
    plan = engine.runner.plan_decode_step(out)
    with pytest.raises(PoolBudgetExceededError, match="budget leaves 16"):
        recordings_of(engine).record(plan, engine.pool.view(plan.seq_ids), cold=True)


def test_frozen_call_replays_on_the_recorded_objects_alone() -> None:
    """A graph's semantics: storage is live, but an argument that was a copy stays stale."""
    backend = FrozenCallBackend()
    live = torch.tensor([1.0, 2.0])
    seen: list[torch.Tensor] = []

    def step(x: torch.Tensor, _: object) -> torch.Tensor:
        seen.append(x)
        return x * 10

    _, handle = backend.record(step, (live, None), contextlib.nullcontext)  # type: ignore[arg-type]
    live.copy_(torch.tensor([3.0, 4.0]))
    assert torch.equal(backend.replay(handle), torch.tensor([30.0, 40.0]))  # live storage
    stale = live.clone()
    _, handle = backend.record(step, (stale, None), contextlib.nullcontext)  # type: ignore[arg-type]
    live.copy_(torch.tensor([5.0, 6.0]))
    assert torch.equal(backend.replay(handle), torch.tensor([30.0, 40.0]))  # the copy froze
    assert all(x is live or x is stale for x in seen)


def test_a_stale_frozen_argument_gives_wrong_tokens(tiny_llama_dir: Path) -> None:
    """What the window gates exist for: a recording frozen on a copy of its rectangle keeps
    reading the addresses of the step it was made on, so later replays attend to the wrong
    K/V — on a CPU exactly as a CUDA graph would."""
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    engines = [
        tiny_engine(tiny_llama_dir, width_multiple=64, decode_mode="recorded") for _ in range(2)
    ]
    for engine in engines:
        engine.add_request("x", [5, 17, 3, 99, 250], params)
        engine.step()  # prefill
        engine.step()  # the first decode step: recorded through the gates
    good, bad = engines
    recordings = recordings_of(bad)
    ((shape, recording),) = recordings.by_shape.items()
    stale = replace(recording.plan, slot_rect=recording.plan.slot_rect.clone())
    # Only the frozen call holds the copy: every replay check sees the real window and passes.
    recordings.by_shape[shape] = replace(
        recording, handle=(recordings.step, (stale, recording.cache))
    )
    expected = [t for d in good.run_until_done() for t in d.token_ids]
    got = [t for d in bad.run_until_done() for t in d.token_ids]
    assert len(got) == len(expected) == 28
    assert got != expected


def test_lazy_recordings_follow_lazy_captures(tiny_llama_dir: Path) -> None:
    """The build log's host table: 2 rows off a 16-token prompt at width multiple 32."""
    for generated, expected in ((8, 1), (32, 2), (64, 3), (128, 5)):
        assert lazy_captures(16, generated, 32) == expected
        engine = tiny_engine(tiny_llama_dir, width_multiple=32, max_batch=2, decode_mode="recorded")
        params = SamplingParams(max_tokens=generated, temperature=0, ignore_eos=True)
        for i in range(2):
            engine.add_request(f"l{i}", [10 + i] * 16, params)
        engine.run_until_done()
        assert recordings_of(engine).num_cold == expected


def test_every_recording_writes_the_one_logits_buffer(tiny_llama_dir: Path) -> None:
    """Logits memory does not grow with the number of recordings: each replay's logits are a
    slice of the one static [max_batch, vocab] buffer."""
    engine = tiny_engine(
        tiny_llama_dir, decode_mode="recorded", max_model_len=64, width_multiple=16
    )
    shapes = warm_shapes(buckets_of(engine))
    warm(engine, shapes)
    recordings = recordings_of(engine)
    buffer = recordings.logits
    assert tuple(buffer.shape) == (8, engine.model.config.vocab_size)
    for shape in shapes:
        logits = recordings.replay(warm_batch(recordings_of(engine), engine.pool, shape).plan)
        assert logits.data_ptr() == buffer.data_ptr() and logits.shape[0] == shape.rows
    assert recordings.stats().logits_buffer_bytes == buffer.numel() * 4
    assert recordings.addresses()["logits"] == buffer.data_ptr()

"""The warm-up: the warm list recorded over all-padding batches, touching nothing real."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.core import DecodePlan, Shape, SlotTable, lazy_captures, warm_shapes
from nanoserve.core.capture_gates import PadNotInertError
from nanoserve.core.errors import GeometryError
from nanoserve.core.warm_gates import (
    ColdCaptureError,
    TableMovedError,
    WarmBudgetError,
    WarmRowsNotEmptyError,
    WarmTouchedPoolError,
    WarmWriteNotSinkError,
    check_no_cold_captures,
    check_warm_budget,
    check_warm_rows_empty,
    check_warm_touches_nothing,
    check_warm_writes_sink,
)
from nanoserve.core.warm_list import RecordingCost, fit_recording_cost, warm_estimate
from nanoserve.runtime.decode.recordings import FrozenCallBackend, Guard, StepFn
from nanoserve.runtime.decode.warmup import WarmEstimate, WarmupCancelled, warm_batch
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.kv_pool import CacheRows, EmptySelectionError
from nanoserve.runtime.model.llama import LlamaModel
from tests.runtime.capture_helpers import (
    buckets_of,
    recordings_of,
    run_joining_workload,
    tiny_engine,
    warm,
)

WARM: dict[str, Any] = {"max_model_len": 64, "width_multiple": 16, "max_batch": 4}


def warmed(model_dir: Path, **config: object) -> Engine:
    engine = tiny_engine(model_dir, **{**WARM, "decode_mode": "recorded", **config})
    warm(engine, warm_shapes(buckets_of(engine)))
    return engine


def test_warm_batch_is_all_padding_on_the_real_storage(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    recordings = recordings_of(engine)
    batch = warm_batch(recordings, engine.pool, Shape(4, 32))
    plan = batch.plan
    assert plan.seq_ids == () and plan.pad_rows == 4 and batch.cache.seq_ids == ()
    assert plan.write_slots.tolist() == [engine.pool_plan.sink_slot] * 4
    assert plan.context_lens.tolist() == [0, 0, 0, 0]
    assert plan.slot_rect.data_ptr() == recordings.table.address
    assert plan.input_ids.data_ptr() == recordings.buffers.input_ids.data_ptr()


def test_an_empty_selection_is_legal_only_where_a_warm_batch_reaches(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    with pytest.raises(EmptySelectionError):
        engine.pool.view(())  # a scheduled view over no rows
    with pytest.raises(GeometryError, match="pad_rows > 0"):
        recordings_of(engine).table.read((), 0, 16)
    assert engine.pool.empty_rows().seq_ids == ()


def test_warm_list_is_recorded_biggest_first(tiny_llama_dir: Path) -> None:
    engine = warmed(tiny_llama_dir)
    report = engine.warm_report
    assert report is not None
    # rows 1, 2, 4 x widths 16, 32, 48, 64
    assert report.num_recorded == 12
    assert report.shapes[0] == Shape(4, 64) and report.shapes[-1] == Shape(1, 16)
    assert len(report.seconds) == 12 and report.total_seconds >= sum(report.seconds) * 0.99
    recordings = recordings_of(engine)
    assert recordings.num_cold == 0 and all(r.seq_ids == () for r in recordings.by_shape.values())


def test_pool_is_resident_after_warmup(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    assert not engine.pool.resident
    warm(engine, (Shape(1, 16),))
    assert engine.pool.resident


def test_warmed_tokens_equal_unwarmed_and_eager(tiny_llama_dir: Path) -> None:
    eager = run_joining_workload(tiny_engine(tiny_llama_dir, **WARM))
    lazy = run_joining_workload(tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded"))
    engine = warmed(tiny_llama_dir)
    warmed_tokens = run_joining_workload(engine)
    assert warmed_tokens == lazy == eager
    recordings = recordings_of(engine)
    check_no_cold_captures(recordings.num_cold)  # no recording in front of a client
    assert recordings.num_replays > 0 and recordings.num_recorded == 12


def test_a_warmed_run_across_many_widths_records_nothing(tiny_llama_dir: Path) -> None:
    config = {"width_multiple": 8, "max_batch": 2, "max_model_len": 160}
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    counts = {}
    for warmed_first in (False, True):
        engine = tiny_engine(tiny_llama_dir, **config, decode_mode="recorded")
        if warmed_first:
            warm(engine, warm_shapes(buckets_of(engine)))
        before = recordings_of(engine).num_recorded
        for i in range(2):
            engine.add_request(f"w{i}", [20 + i] * 16, params)
        engine.run_until_done()
        recordings = recordings_of(engine)
        counts[warmed_first] = (recordings.num_cold, recordings.num_recorded - before)
    assert counts[False] == (lazy_captures(16, 128, 8),) * 2 == (16, 16)
    assert counts[True] == (0, 0)


def test_warmup_touches_no_real_slot_with_live_kv_resident(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    engine.add_request("live", [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], params)
    engine.step()
    engine.step()  # live K/V resident, the sequence still running
    before = engine.pool.snapshot()
    warm(engine, warm_shapes(buckets_of(engine)))  # gated inside: would raise
    after = engine.pool.pools()
    n = engine.pool_plan.num_slots
    assert all(torch.equal(a[:n], b[:n]) for a, b in zip(before, after, strict=True))
    # The sink took the warm rows' throwaway K/V.
    assert any(not torch.equal(a[n:], b[n:]) for a, b in zip(before, after, strict=True))
    tokens = [t for d in engine.run_until_done() for t in d.token_ids]
    reference = tiny_engine(tiny_llama_dir, **WARM)
    reference.add_request("live", [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], params)
    assert tokens[-3:] == [t for d in reference.run_until_done() for t in d.token_ids][-3:]


def test_warm_gates_fail_on_a_warm_batch_built_wrong(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    plan = warm_batch(recordings_of(engine), engine.pool, Shape(2, 16)).plan
    with pytest.raises(WarmRowsNotEmptyError):
        check_warm_rows_empty(replace(plan, seq_ids=(7,), pad_rows=1))
    aimed = plan.write_slots.clone()
    aimed[0] = 3  # a real slot
    with pytest.raises(WarmWriteNotSinkError):
        check_warm_writes_sink(replace(plan, write_slots=aimed))
    # Rows not empty trips the capture gate's sink clause too.
    with pytest.raises(PadNotInertError):
        recordings_of(engine).record(
            replace(plan, seq_ids=(7,), pad_rows=1), engine.pool.empty_rows(), cold=False
        )
    with pytest.raises(ColdCaptureError):
        check_no_cold_captures(1)


def test_a_moved_table_fails_the_warm_up(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    recordings = recordings_of(engine)
    moved: SlotTable = recordings.table.to("cpu")
    original = recordings.table

    class MovingTable:
        """The table as the warm-up sees it: it moves once the list has been recorded."""

        def __getattr__(self, name: str) -> object:
            if name == "address":
                return moved.address if recordings.num_recorded else original.address
            return getattr(original, name)

    recordings.table = MovingTable()  # type: ignore[assignment]
    with pytest.raises(TableMovedError):
        warm(engine, (Shape(1, 16),))


def test_touched_pool_is_named(tiny_llama_dir: Path) -> None:
    before = [torch.zeros(5, 1, 2)]
    after = [torch.zeros(5, 1, 2)]
    after[0][2, 0, 1] = 1.0
    with pytest.raises(WarmTouchedPoolError, match="real slot 2"):
        check_warm_touches_nothing(before, after, 4)


def test_budget_trims_the_widest_shapes(tiny_llama_dir: Path) -> None:
    """The memory budget holds a step's real peak (StepFootprint), at the list's widest rows."""
    probe = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    budget = probe.runner.footprint.peak_bytes(4, 40)  # fits width 40 at 4 rows, not 41
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded", warm_budget_bytes=budget)
    plan = engine.plan_warm()
    assert plan.width_ceiling == 40 and plan.budget_bytes == budget and plan.max_width == 40
    assert all(s.width <= 32 for s in plan.shapes)  # widths 16, 32 of 16, 32, 48, 64
    assert len(plan.shapes) + len(plan.skipped) == 12 and len(plan.skipped) == 6
    # A budget caps the widest shape; it does not otherwise shorten the list.
    assert {s.rows for s in plan.shapes} == {1, 2, 4}
    assert {why for _, why in plan.skipped} == {
        "wider than the budget's width ceiling of 40 tokens"
    }
    # The warm-up's budget gate holds the plan to it, and names a list that breaks it.
    check_warm_budget(plan.shapes, engine.runner.footprint, budget)
    needed = engine.runner.footprint.peak_bytes(4, 64)
    with pytest.raises(
        WarmBudgetError,
        match=rf"^shape Shape\(rows=4, width=64\) needs {needed} bytes at its peak; the budget is {budget}$",
    ):
        warm(engine, warm_shapes(buckets_of(engine)))
    assert recordings_of(engine).num_recorded == 0


# --- pricing, the time budget, and cancelling ----------------------------------------------------


def test_the_warm_up_is_priced_before_it_is_paid(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    shapes = warm_shapes(buckets_of(engine))
    said: list[WarmEstimate] = []
    report = warm(engine, shapes, announce=lambda _, estimate: said.append(estimate))
    # Announced once, after the two probes and before anything else was recorded.
    (estimate,) = said
    assert [s for s, _ in estimate.probes] == [Shape(4, 64), Shape(1, 16)]
    # The default time budget (30 s on a CPU) keeps the whole list of this tiny model.
    assert estimate.shapes == shapes and estimate.skipped == () and estimate.time_ceiling == 64
    assert estimate.cost == fit_recording_cost(
        Shape(1, 16), estimate.probes[1][1], Shape(4, 64), estimate.probes[0][1]
    )
    # The estimate: the pool and the probes as measured, the other ten as predicted.
    assert (
        report.estimate.seconds
        == estimate.seconds
        == estimate.pool_seconds + warm_estimate(shapes, estimate.cost, dict(estimate.probes))
    )
    assert report.total_seconds >= sum(report.seconds) > 0
    # The probes are recordings of the list, not made twice.
    assert report.shapes == shapes and recordings_of(engine).num_recorded == 12
    assert (
        dict(zip(report.shapes, report.seconds, strict=True))[Shape(4, 64)]
        == (estimate.probes[0][1])
    )
    body: dict[str, Any] = report.as_dict()
    assert body["estimated_seconds"] == round(estimate.seconds, 4)
    assert body["probes"][0]["shape"] == [4, 64] and body["budget_seconds"] == 30.0


def test_a_tiny_time_budget_trims_every_width_and_drops_the_probes(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded", warm_seconds=1e-6)
    shapes = warm_shapes(buckets_of(engine))
    report = warm(engine, shapes)
    assert report.shapes == () and report.estimate.time_ceiling == 0
    assert report.skipped == tuple((s, "over the time budget of 1e-06 s") for s in shapes)
    assert report.num_over_time == 12
    # The two probes were recorded, then discarded: nothing outside the list is kept.
    assert recordings_of(engine).num_recorded == 2 and recordings_of(engine).by_shape == {}
    # What was paid is still the estimate: the pool and both probes.
    estimate = report.estimate
    assert estimate.seconds == estimate.pool_seconds + sum(t for _, t in estimate.probes)


class PacedBackend(FrozenCallBackend):
    """A frozen call that advances a clock by 1/64 s + 1/4096 s per position: a cost line the
    test knows exactly (dyadic numbers, so every sum below is exact)."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def record(
        self, fn: StepFn, args: tuple[DecodePlan, CacheRows], guard: Guard
    ) -> tuple[torch.Tensor, Any]:
        rows, width = args[0].shape
        self.now += 1 / 64 + rows * width / 4096
        return super().record(fn, args, guard)


def test_a_time_budget_trims_the_widest_shapes_first(tiny_llama_dir: Path) -> None:
    checkpoint = load_checkpoint(tiny_llama_dir)
    model = LlamaModel.from_tensors(checkpoint.config, checkpoint.tensors(), max_positions=256)
    config = EngineConfig(
        **WARM, decode_mode="recorded", block_size=4, kv_budget_bytes=1 << 22, warm_seconds=0.3
    )
    paced = PacedBackend()
    engine = Engine.from_config(model, checkpoint.tokenizer, config, backend=paced)
    shapes = warm_shapes(buckets_of(engine))
    memory_skipped = ((Shape(8, 64), "wider than the budget's width ceiling of 0 tokens"),)
    # Per width w, rows 1 + 2 + 4 cost 3/64 + 7w/4096 s: widths up to 32 cost 0.17578125 s, up
    # to 48 0.3046875 s, each plus the 4x64 probe's 0.078125 s, spent before the trim drops it.
    report = warm(engine, shapes, skipped=memory_skipped, clock=paced.clock)
    estimate = report.estimate
    assert estimate.probes == ((Shape(4, 64), 0.078125), (Shape(1, 16), 0.01953125))
    assert estimate.cost == RecordingCost(1 / 64, 1 / 4096)
    assert estimate.time_ceiling == 32 and report.max_width == 32
    assert report.shapes == warm_shapes(buckets_of(engine), max_width=32)
    over = tuple((s, "over the time budget of 0.3 s") for s in shapes if s.width > 32)
    assert report.skipped == (*memory_skipped, *over) and report.num_over_time == 6
    # Every rows bucket stays below the ceiling; the dropped 4x64 probe leaves no recording.
    assert {s.rows for s in report.shapes} == {1, 2, 4}
    assert set(recordings_of(engine).by_shape) == set(report.shapes)
    # On an exact line the estimate is the actual: the dropped probe, then six shapes.
    assert estimate.seconds == report.total_seconds == 0.078125 + 0.17578125
    assert estimate.pool_seconds == 0.0 and report.as_dict()["time_ceiling"] == 32


def test_a_set_event_stops_the_warm_up_between_recordings(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    shapes = warm_shapes(buckets_of(engine))
    cancel = threading.Event()
    # A shutdown arriving while the estimate is said: the probes are done, nothing more is.
    with pytest.raises(WarmupCancelled, match=r"^boot stopped after 2 of 12 warm recordings$"):
        warm(engine, shapes, cancel=cancel, announce=lambda *_: cancel.set())
    assert recordings_of(engine).num_recorded == 2 and engine.warm_report is None
    # Set before the start: not even the pool is made resident.
    fresh = tiny_engine(tiny_llama_dir, **WARM, decode_mode="recorded")
    with pytest.raises(WarmupCancelled, match=r"^boot stopped before the warm-up$"):
        warm(fresh, shapes, cancel=cancel)
    assert recordings_of(fresh).num_recorded == 0 and not fresh.pool.resident

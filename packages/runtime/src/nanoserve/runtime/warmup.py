"""The warm-up: the warm list priced, trimmed to a time budget, and recorded over all-padding
batches before the server accepts.

A warm batch is a step whose rows are all padding: no sequences, every write aimed at the sink,
every context length 0, the rectangle a window on the real slot table, and its addressing in
the real buffers. A recording made over it freezes the empty row set, so it can be wrong about
no sequence; it reads live storage, so it computes real steps. Phases: price (record the largest
and the smallest shape, fit a cost line) → trim to the time budget → announce → record the rest
(capture gates, vacuously) → warm gates → report. A cancel event is checked between recordings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nanoserve.core import DecodePlan, Shape, warmup_plan
from nanoserve.core.errors import GeometryError, NanoserveError
from nanoserve.core.warm_gates import (
    check_all_warm,
    check_table_stable,
    check_warm_graphs_unbound,
    check_warm_rows_empty,
    check_warm_touches_nothing,
    check_warm_writes_sink,
)
from nanoserve.core.warm_list import (
    RecordingCost,
    fit_recording_cost,
    seconds_ceiling,
    warm_estimate,
)
from nanoserve.runtime.kv_pool import CacheRows
from nanoserve.runtime.runner import ModelRunner

TIME_REASON = "over the time budget of {:g} s"
Clock = Callable[[], float]  # seconds; time.perf_counter, or a test's own


class WarmupCancelled(NanoserveError):
    """The boot was asked to stop (a shutdown during the warm-up): a clean stop, not a failure."""


def check_cancelled(cancel: threading.Event | None, where: str) -> None:
    if cancel is not None and cancel.is_set():
        raise WarmupCancelled(f"boot stopped {where}")


@dataclass(frozen=True, slots=True)
class WarmBatch:
    plan: DecodePlan  # rows=(), vectors are views on the persistent buffers
    cache: CacheRows  # the empty selection: the rows this plan addresses, none


@dataclass(frozen=True, slots=True)
class WarmEstimate:
    """The price of the list, known before the rest is paid: said, then kept in the report."""

    shapes: tuple[Shape, ...]  # what will be recorded, biggest first
    skipped: tuple[tuple[Shape, str], ...]  # what the time budget trimmed
    probes: tuple[tuple[Shape, float], ...]  # (shape, measured seconds): largest, then smallest
    cost: RecordingCost
    pool_seconds: float  # making the K/V pool resident, before the probes
    seconds: float  # the pool and the probes as measured, plus the rest as predicted
    budget_seconds: float | None
    time_ceiling: int | None  # the widest width within the budget; None: no time budget


@dataclass(frozen=True, slots=True)
class WarmupReport:
    shapes: tuple[Shape, ...]  # recorded, biggest first
    seconds: tuple[float, ...]  # per shape, measured
    total_seconds: float  # the whole warm-up as measured: pool, probes, every recording
    pool_bytes: int  # the shared recording pool (CUDA); 0 for frozen calls
    skipped: tuple[tuple[Shape, str], ...] = ()  # trimmed by memory, then by time
    width_ceiling: int | None = None  # the memory budget's
    budget_bytes: int | None = None
    backend: str = ""
    extra: dict[str, object] = field(default_factory=dict)
    estimated_seconds: float | None = None  # said before the work; compare total_seconds
    budget_seconds: float | None = None
    time_ceiling: int | None = None
    cost: RecordingCost | None = None
    probes: tuple[tuple[Shape, float], ...] = ()
    pool_seconds: float = 0.0
    max_rows: int | None = None  # the trim limits the list was taken under
    max_width: int | None = None

    @property
    def num_recorded(self) -> int:
        return len(self.shapes)

    @property
    def num_over_time(self) -> int:
        prefix = TIME_REASON.split("{")[0]
        return sum(why.startswith(prefix) for _, why in self.skipped)

    def as_dict(self) -> dict[str, object]:
        cost = self.cost
        return {
            "backend": self.backend,
            "shapes": [[s.rows, s.width] for s in self.shapes],
            "num_shapes": self.num_recorded,
            "max_rows": self.max_rows,
            "max_width": self.max_width,
            "seconds": round(self.total_seconds, 4),
            "estimated_seconds": _round(self.estimated_seconds),
            "budget_seconds": self.budget_seconds,
            "time_ceiling": self.time_ceiling,
            "cost": None
            if cost is None
            else {
                "fixed_seconds": cost.fixed_seconds,
                "seconds_per_position": cost.seconds_per_position,
            },
            "pool_seconds": round(self.pool_seconds, 4),
            "probes": [
                {"shape": [s.rows, s.width], "seconds": round(t, 4)} for s, t in self.probes
            ],
            "seconds_per_shape": [round(s, 4) for s in self.seconds],
            "pool_bytes": self.pool_bytes,
            "width_ceiling": self.width_ceiling,
            "budget_bytes": self.budget_bytes,
            "skipped": [{"shape": [s.rows, s.width], "why": why} for s, why in self.skipped],
            **self.extra,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def warmup_batch(runner: ModelRunner, shape: Shape) -> WarmBatch:
    """The warm plan for shape, written into the runner's real buffers, over no rows."""
    if runner.table is None or runner.buffers is None:
        raise GeometryError("a warm batch needs persistent inputs (persist_inputs=True)")
    plan = warmup_plan(shape.rows, shape.width, table=runner.table)
    plan = runner.buffers.load(plan)  # made-up tokens: id 0 at position 0, masked anyway
    return WarmBatch(plan, runner.pool.warm())


def record_warm(runner: ModelRunner, shape: Shape, clock: Clock = time.perf_counter) -> float:
    """Record shape over a warm batch (gated); returns the seconds the recording took."""
    assert runner.graphs is not None
    batch = warmup_batch(runner, shape)
    check_warm_rows_empty(batch.plan)
    check_warm_writes_sink(batch.plan)
    started = clock()
    with torch.inference_mode():
        runner.graphs.record(batch.plan, batch.cache, cold=False)
    return clock() - started


def make_resident(
    runner: ModelRunner, first: Shape | None = None, clock: Clock = time.perf_counter
) -> float:
    """Allocate every layer's K/V pool now (the first write would), and run one unrecorded
    step of `first` under the capture guard, so that the first probe times a recording rather
    than first-call costs: the pool's allocation (~2 s for 1 GiB here), the allocator's and
    the BLAS library's first touches, the guard's own set-up (together ~1.4 s of a 1.6 s
    first probe here, against 0.2 s for the same shape after). Returns seconds."""
    started = clock()
    for layer in range(runner.pool.plan.num_layers):
        runner.pool.layer(layer)
    graphs = runner.graphs
    if first is not None and graphs is not None:
        batch = warmup_batch(runner, first)
        with torch.inference_mode(), graphs.guard():
            graphs.step(batch.plan, batch.cache)
    return clock() - started


def price_warm(
    runner: ModelRunner,
    shapes: tuple[Shape, ...],
    *,
    budget_seconds: float | None = None,
    cancel: threading.Event | None = None,
    clock: Clock = time.perf_counter,
) -> WarmEstimate:
    """Make the pool resident, record the largest shape (first: a shared pool is sized by it)
    and the smallest, fit the cost line through them, and trim the list's widest shapes until
    the warm-up's estimate fits the budget. Everything already paid (the pool, both probes)
    counts against it. The probes are recordings of the list; one the trim removes is
    discarded."""
    if not shapes:
        return WarmEstimate((), (), (), RecordingCost(0.0, 0.0), 0.0, 0.0, budget_seconds, None)
    check_cancelled(cancel, "before the warm-up")
    pool_seconds = make_resident(runner, shapes[-1], clock)
    paid: dict[Shape, float] = {}
    for shape in dict.fromkeys((shapes[0], shapes[-1])):
        check_cancelled(cancel, f"while pricing the warm list, before recording {shape}")
        paid[shape] = record_warm(runner, shape, clock)
    cost = fit_recording_cost(shapes[-1], paid[shapes[-1]], shapes[0], paid[shapes[0]])
    kept, skipped, ceiling = shapes, (), None
    if budget_seconds is not None:
        ceiling = seconds_ceiling(shapes, cost, budget_seconds - pool_seconds, paid)
        kept = tuple(s for s in shapes if s.width <= ceiling)
        reason = TIME_REASON.format(budget_seconds)
        skipped = tuple((s, reason) for s in shapes if s.width > ceiling)
    assert runner.graphs is not None
    for shape in paid:
        if shape not in kept:
            runner.graphs.discard(shape)
    return WarmEstimate(
        shapes=kept,
        skipped=skipped,
        probes=tuple(paid.items()),
        cost=cost,
        pool_seconds=pool_seconds,
        seconds=pool_seconds + warm_estimate(kept, cost, paid),
        budget_seconds=budget_seconds,
        time_ceiling=ceiling,
    )


def warm_decode(
    runner: ModelRunner,
    shapes: tuple[Shape, ...],
    *,
    skipped: tuple[tuple[Shape, str], ...] = (),
    budget_seconds: float | None = None,
    cancel: threading.Event | None = None,
    announce: Callable[[WarmEstimate], None] | None = None,
    clock: Clock = time.perf_counter,
) -> WarmupReport:
    """Price shapes, trim them to budget_seconds (None: keep all), announce the estimate, record
    the rest. A set `cancel` raises WarmupCancelled at the next recording boundary."""
    graphs = runner.graphs
    if graphs is None or runner.table is None:
        raise GeometryError("warm_decode needs capture_decode=True")
    table_address = runner.table.address
    before = runner.pool.snapshot()
    started = clock()
    estimate = price_warm(runner, shapes, budget_seconds=budget_seconds, cancel=cancel, clock=clock)
    if announce is not None:
        announce(estimate)
    seconds = {s: t for s, t in estimate.probes if s in estimate.shapes}
    for shape in estimate.shapes:
        if shape not in seconds:
            check_cancelled(
                cancel, f"after {len(seconds)} of {len(estimate.shapes)} warm recordings"
            )
            seconds[shape] = record_warm(runner, shape, clock)
    total = clock() - started
    # Only layers resident before the warm-up can hold real K/V; compare those.
    after = runner.pool.pools()[: len(before)]
    check_warm_touches_nothing(before, after, runner.pool.plan.num_slots)
    check_table_stable(table_address, runner.table.address)
    check_warm_graphs_unbound({s: graphs.recordings[s].rows for s in estimate.shapes})
    check_all_warm(estimate.shapes, graphs.recordings)
    graphs.warmed = True  # from now on a shape outside the list runs eagerly
    return WarmupReport(
        shapes=estimate.shapes,
        seconds=tuple(seconds[s] for s in estimate.shapes),
        total_seconds=total,
        pool_bytes=graphs.backend.pool_bytes(),
        skipped=(*skipped, *estimate.skipped),
        backend=graphs.backend.name,
        estimated_seconds=estimate.seconds,
        budget_seconds=budget_seconds,
        time_ceiling=estimate.time_ceiling,
        cost=estimate.cost,
        probes=estimate.probes,
        pool_seconds=estimate.pool_seconds,
    )

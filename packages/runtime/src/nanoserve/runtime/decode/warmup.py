"""The warm-up: the warm list planned, priced, trimmed to a time budget, and recorded over
all-padding batches before the server accepts.

It reads as plan → price → record → gates → report:

- plan (`plan_warm`): the bucket shapes up to the scheduler's row limit, no wider than the
  deployment's context limit nor the memory budget's width ceiling (`WarmPlan`);
- price (`price_warm`): make the pool resident, record the largest and the smallest shape, fit a
  cost line through them, and trim the widest shapes until the estimate fits the time budget;
  the estimate is announced before the rest is paid;
- record (`record_shape`): each remaining shape over a warm batch, whose rows are all padding —
  no sequences, every write aimed at the sink, every context length 0, the rectangle a window on
  the real slot table, its addressing in the real buffers. A recording made over it freezes the
  empty row set, so it can be wrong about no sequence; it reads live storage, so it computes
  real steps;
- gates: the list within the memory budget (before), then the pool's real slots unchanged, the
  table unmoved, every recording unbound, every listed shape recorded (after). From then on
  `DecodeRecordings` records nothing (`check_no_cold_captures` guards its record);
- report (`WarmupReport`): the plan, the estimate and what was measured.

A cancel event is checked between recordings. At shutdown `DecodeRecordings.destroy` frees the
recordings (`Engine.destroy`, called by the server's lifespan).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nanoserve.core import BucketSet, DecodePlan, Shape, StepFootprint, padding_plan, warm_shapes
from nanoserve.core.errors import NanoserveError
from nanoserve.core.warm_gates import (
    check_all_warm,
    check_table_stable,
    check_warm_budget,
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
from nanoserve.runtime.decode.recordings import DecodeRecordings
from nanoserve.runtime.model.kv_pool import CacheRows, KVPool

TIME_REASON = "over the time budget of {:g} s"
MEMORY_REASON = "wider than the budget's width ceiling of {} tokens"
Clock = Callable[[], float]  # seconds; time.perf_counter, or a test's own


class WarmupCancelled(NanoserveError):
    """The boot was asked to stop (a shutdown during the warm-up): a clean stop, not a failure."""


def check_cancelled(cancel: threading.Event | None, where: str) -> None:
    if cancel is not None and cancel.is_set():
        raise WarmupCancelled(f"boot stopped {where}")


@dataclass(frozen=True, slots=True)
class WarmPlan:
    """What the warm-up will record, and why the list is as long as it is."""

    shapes: tuple[Shape, ...]  # biggest first, before the time budget's trim
    skipped: tuple[tuple[Shape, str], ...]  # wider than the memory budget's width ceiling
    max_rows: int  # min(the warm row limit, the scheduler's)
    max_width: int  # min(the deployment's context limit, the memory budget's width ceiling)
    budget_bytes: int  # what one recorded step may hold at its peak
    width_ceiling: int  # the widest width whose step fits budget_bytes at max_rows


def plan_warm(
    buckets: BucketSet,
    footprint: StepFootprint,
    *,
    max_rows: int,
    max_width: int,
    budget_bytes: int,
) -> WarmPlan:
    """The bucket shapes of at most max_rows rows and max_width positions, less those whose
    step would not fit budget_bytes."""
    ceiling = footprint.width_ceiling(budget_bytes, max_rows)
    width = min(max_width, ceiling)
    wanted = warm_shapes(buckets, max_rows=max_rows, max_width=max_width)
    shapes = warm_shapes(buckets, max_rows=max_rows, max_width=width)
    kept = set(shapes)
    skipped = tuple((s, MEMORY_REASON.format(ceiling)) for s in wanted if s not in kept)
    return WarmPlan(shapes, skipped, max_rows, width, budget_bytes, ceiling)


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
    """The plan, its price as said before the work, and what the work measured."""

    plan: WarmPlan
    estimate: WarmEstimate
    seconds: tuple[float, ...]  # per recorded shape, measured, in the order of `shapes`
    total_seconds: float  # the whole warm-up as measured: pool, probes, every recording
    pool_bytes: int  # the shared recording pool (CUDA); 0 for frozen calls
    backend: str

    @property
    def shapes(self) -> tuple[Shape, ...]:
        """Recorded, biggest first."""
        return self.estimate.shapes

    @property
    def skipped(self) -> tuple[tuple[Shape, str], ...]:
        """Trimmed by memory, then by time."""
        return (*self.plan.skipped, *self.estimate.skipped)

    @property
    def max_width(self) -> int:
        """The widest width recorded under: the plan's, less what the time budget trimmed."""
        ceiling = self.estimate.time_ceiling
        return self.plan.max_width if ceiling is None else min(self.plan.max_width, ceiling)

    @property
    def num_recorded(self) -> int:
        return len(self.shapes)

    @property
    def num_over_time(self) -> int:
        return len(self.estimate.skipped)

    def as_dict(self) -> dict[str, object]:
        plan, estimate, cost = self.plan, self.estimate, self.estimate.cost
        return {
            "backend": self.backend,
            "shapes": [[s.rows, s.width] for s in self.shapes],
            "num_shapes": self.num_recorded,
            "max_rows": plan.max_rows,
            "max_width": self.max_width,
            "width_ceiling": plan.width_ceiling,
            "budget_bytes": plan.budget_bytes,
            "seconds": round(self.total_seconds, 4),
            "estimated_seconds": round(estimate.seconds, 4),
            "budget_seconds": estimate.budget_seconds,
            "time_ceiling": estimate.time_ceiling,
            "cost": {
                "fixed_seconds": cost.fixed_seconds,
                "seconds_per_position": cost.seconds_per_position,
            },
            "pool_seconds": round(estimate.pool_seconds, 4),
            "probes": [
                {"shape": [s.rows, s.width], "seconds": round(t, 4)} for s, t in estimate.probes
            ],
            "seconds_per_shape": [round(t, 4) for t in self.seconds],
            "pool_bytes": self.pool_bytes,
            "skipped": [{"shape": [s.rows, s.width], "why": why} for s, why in self.skipped],
        }


def warm_batch(recordings: DecodeRecordings, pool: KVPool, shape: Shape) -> WarmBatch:
    """The all-padding plan for shape, written into the recordings' real buffers, over no rows."""
    plan = padding_plan(
        shape.rows, shape.width, table=recordings.table, sink_state_slot=pool.sink_state_slot
    )
    plan = recordings.buffers.load(plan)  # made-up tokens: id 0 at position 0, masked anyway
    return WarmBatch(plan, pool.empty_rows())


def record_shape(
    recordings: DecodeRecordings, pool: KVPool, shape: Shape, clock: Clock = time.perf_counter
) -> float:
    """Record shape over a warm batch (gated); returns the seconds the recording took."""
    batch = warm_batch(recordings, pool, shape)
    check_warm_rows_empty(batch.plan)
    check_warm_writes_sink(batch.plan)
    started = clock()
    with torch.inference_mode():
        recordings.record(batch.plan, batch.cache, cold=False)
    return clock() - started


def make_resident(
    recordings: DecodeRecordings,
    pool: KVPool,
    first: Shape | None = None,
    clock: Clock = time.perf_counter,
) -> float:
    """Allocate every layer's K/V pool now and touch its pages, and run one unrecorded
    step of `first` under the capture guard, so that the first probe times a recording rather
    than first-call costs: the pool's allocation, the allocator's and the BLAS library's first
    touches, the guard's own set-up (most of a first probe's time, which would price every
    shape far too dear). Returns seconds."""
    started = clock()
    pool.touch()
    if first is not None:
        batch = warm_batch(recordings, pool, first)
        with torch.inference_mode(), recordings.guard():
            recordings.step(batch.plan, batch.cache)
    return clock() - started


def price_warm(
    recordings: DecodeRecordings,
    pool: KVPool,
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
    pool_seconds = make_resident(recordings, pool, shapes[-1], clock)
    paid: dict[Shape, float] = {}
    for shape in dict.fromkeys((shapes[0], shapes[-1])):
        check_cancelled(cancel, f"while pricing the warm list, before recording {shape}")
        paid[shape] = record_shape(recordings, pool, shape, clock)
    cost = fit_recording_cost(shapes[-1], paid[shapes[-1]], shapes[0], paid[shapes[0]])
    kept, ceiling = shapes, None
    skipped: tuple[tuple[Shape, str], ...] = ()
    if budget_seconds is not None:
        ceiling = seconds_ceiling(shapes, cost, budget_seconds - pool_seconds, paid)
        kept = tuple(s for s in shapes if s.width <= ceiling)
        reason = TIME_REASON.format(budget_seconds)
        skipped = tuple((s, reason) for s in shapes if s.width > ceiling)
    for shape in paid:
        if shape not in kept:
            recordings.discard(shape)
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


def record_warm_list(
    recordings: DecodeRecordings,
    pool: KVPool,
    plan: WarmPlan,
    *,
    budget_seconds: float | None = None,
    cancel: threading.Event | None = None,
    announce: Callable[[WarmPlan, WarmEstimate], None] | None = None,
    clock: Clock = time.perf_counter,
) -> WarmupReport:
    """Price the plan's shapes, trim them to budget_seconds (None: keep all), announce the
    estimate, record the rest, pass the gates. A set `cancel` raises WarmupCancelled at the
    next recording boundary."""
    check_warm_budget(plan.shapes, recordings.footprint, plan.budget_bytes)
    table_address = recordings.table.address
    before = pool.snapshot()
    started = clock()
    estimate = price_warm(
        recordings, pool, plan.shapes, budget_seconds=budget_seconds, cancel=cancel, clock=clock
    )
    if announce is not None:
        announce(plan, estimate)
    seconds = {s: t for s, t in estimate.probes if s in estimate.shapes}
    for shape in estimate.shapes:
        if shape not in seconds:
            check_cancelled(
                cancel, f"after {len(seconds)} of {len(estimate.shapes)} warm recordings"
            )
            seconds[shape] = record_shape(recordings, pool, shape, clock)
    total = clock() - started
    # Gates. Only layers resident before the warm-up can hold real K/V; compare those.
    check_warm_touches_nothing(before, pool.pools()[: len(before)], pool.plan.num_slots)
    check_table_stable(table_address, recordings.table.address)
    check_warm_graphs_unbound({s: recordings.by_shape[s].seq_ids for s in estimate.shapes})
    check_all_warm(estimate.shapes, recordings.by_shape)
    recordings.warmed = True  # from now on a shape outside the list runs eagerly
    return WarmupReport(
        plan=plan,
        estimate=estimate,
        seconds=tuple(seconds[s] for s in estimate.shapes),
        total_seconds=total,
        pool_bytes=recordings.backend.pool_bytes(),
        backend=recordings.backend.name,
    )

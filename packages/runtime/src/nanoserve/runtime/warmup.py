"""The warm-up: the warm list recorded over all-padding batches before the server accepts.

A warm batch is a step whose rows are all padding: no sequences, every write aimed at the sink,
every context length 0, the rectangle a window on the real slot table, and its addressing in
the real buffers. A recording made over it freezes the empty row set, so it can be wrong about
no sequence; it reads live storage, so it computes real steps. Phases: build warm batches →
record (capture gates, vacuously) → warm gates → report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from nanoserve.core import DecodePlan, Shape, warmup_plan
from nanoserve.core.errors import GeometryError
from nanoserve.core.warm_gates import (
    check_all_warm,
    check_table_stable,
    check_warm_graphs_unbound,
    check_warm_rows_empty,
    check_warm_touches_nothing,
    check_warm_writes_sink,
)
from nanoserve.runtime.kv_pool import CacheRows
from nanoserve.runtime.runner import ModelRunner


@dataclass(frozen=True, slots=True)
class WarmBatch:
    plan: DecodePlan  # rows=(), vectors are views on the persistent buffers
    cache: CacheRows  # the empty selection: the rows this plan addresses, none


@dataclass(frozen=True, slots=True)
class WarmupReport:
    shapes: tuple[Shape, ...]  # recorded, in order (biggest first)
    seconds: tuple[float, ...]  # per shape
    total_seconds: float
    pool_bytes: int  # the shared recording pool (CUDA); 0 for frozen calls
    skipped: tuple[tuple[Shape, str], ...] = ()
    width_ceiling: int | None = None
    budget_bytes: int | None = None
    backend: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def num_recorded(self) -> int:
        return len(self.shapes)

    def as_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "shapes": [[s.rows, s.width] for s in self.shapes],
            "num_shapes": self.num_recorded,
            "seconds": round(self.total_seconds, 4),
            "seconds_per_shape": [round(s, 4) for s in self.seconds],
            "pool_bytes": self.pool_bytes,
            "width_ceiling": self.width_ceiling,
            "budget_bytes": self.budget_bytes,
            "skipped": [{"shape": [s.rows, s.width], "why": why} for s, why in self.skipped],
            **self.extra,
        }


def warmup_batch(runner: ModelRunner, shape: Shape) -> WarmBatch:
    """The warm plan for shape, written into the runner's real buffers, over no rows."""
    if runner.table is None or runner.buffers is None:
        raise GeometryError("a warm batch needs persistent inputs (persist_inputs=True)")
    plan = warmup_plan(shape.rows, shape.width, table=runner.table)
    plan = runner.buffers.load(plan)  # made-up tokens: id 0 at position 0, masked anyway
    return WarmBatch(plan, runner.pool.warm())


def warm_decode(
    runner: ModelRunner, shapes: tuple[Shape, ...], *, skipped: tuple[tuple[Shape, str], ...] = ()
) -> WarmupReport:
    graphs = runner.graphs
    if graphs is None or runner.table is None:
        raise GeometryError("warm_decode needs capture_decode=True")
    table_address = runner.table.address
    before = runner.pool.snapshot()
    recorded: list[Shape] = []
    seconds: list[float] = []
    started = time.perf_counter()
    for shape in shapes:
        batch = warmup_batch(runner, shape)
        check_warm_rows_empty(batch.plan)
        check_warm_writes_sink(batch.plan)
        t0 = time.perf_counter()
        with torch.inference_mode():
            graphs.record(batch.plan, batch.cache, cold=False)
        seconds.append(time.perf_counter() - t0)
        recorded.append(shape)
    total = time.perf_counter() - started
    # Only layers resident before the warm-up can hold real K/V; compare those.
    after = runner.pool.pools()[: len(before)]
    check_warm_touches_nothing(before, after, runner.pool.plan.num_slots)
    check_table_stable(table_address, runner.table.address)
    check_warm_graphs_unbound({s: graphs.recordings[s].rows for s in recorded})
    check_all_warm(shapes, graphs.recordings)
    return WarmupReport(
        shapes=tuple(recorded),
        seconds=tuple(seconds),
        total_seconds=total,
        pool_bytes=graphs.backend.pool_bytes(),
        skipped=skipped,
        backend=graphs.backend.name,
    )

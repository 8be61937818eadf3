"""Recorded decode steps: one recording per bucket shape, gated before it is made and replayed.

A recording keeps its argument objects forever and replays on them alone. On CUDA that is a
`torch.cuda.CUDAGraph` (all recordings share one memory pool, recorded on a side stream); on a
CPU it is a frozen call: the step bound to the exact plan it was recorded with. The frozen call
is no faster, but it has a graph's semantics, so a stale frozen argument gives wrong tokens on
a CPU exactly as it would on a GPU — which is what lets CI test every gate.

Every recording runs under the capture guard (host syncs, foreign devices and value-dependent
shapes are refused by name), computes logits for every row of its shape, padding included (so
an eager step of the same shape runs the same kernels on the same row count: cuBLAS may choose
another kernel per row count), and writes them into one static `[max_rows, vocab]` buffer:
recordings share it instead of each holding an output of its own. Once a warm-up has run, a
shape outside the warm list runs eagerly and is counted; nothing is recorded in front of a
client. Before any warm-up (a lazy engine) each shape is recorded once, over the empty row
selection, so it serves any later batch of that shape.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

from nanoserve.core import DecodePlan, Shape, SlotTable
from nanoserve.core.capture_gates import (
    check_addresses_stable,
    check_mapping_is_window,
    check_pad_inert,
    check_plan_addressing,
    check_pool_budget,
    check_replay_rows,
    check_window_intact,
)
from nanoserve.core.decode_buffers import BUFFER_NAMES, DecodeBuffers
from nanoserve.core.errors import GateError
from nanoserve.core.step_footprint import StepFootprint
from nanoserve.core.warm_gates import check_no_cold_captures
from nanoserve.runtime.decode.capture_guard import capture_guard
from nanoserve.runtime.model.device import on_device
from nanoserve.runtime.model.kv_pool import CacheRows

StepFn = Callable[[DecodePlan, CacheRows], torch.Tensor]
Guard = Callable[[], AbstractContextManager[object]]


class UnrecordedShapeError(GateError):
    """replay was asked for a shape that has no recording."""


class RecordingArgumentsError(GateError):
    """replay was handed arguments that are not the recorded objects' storage."""


class Backend(Protocol):
    name: str

    def record(
        self, fn: StepFn, args: tuple[DecodePlan, CacheRows], guard: Guard
    ) -> tuple[torch.Tensor, Any]: ...

    def replay(self, handle: Any) -> torch.Tensor: ...

    def pool_bytes(self) -> int: ...

    def release(self) -> None:
        """Return what the dropped recordings held (their shared pool) to the device."""


class FrozenCallBackend:
    """The step bound at record time to the exact plan object, and replayed on it alone."""

    name = "frozen-call"

    def record(
        self, fn: StepFn, args: tuple[DecodePlan, CacheRows], guard: Guard
    ) -> tuple[torch.Tensor, Any]:
        with guard():
            output = fn(*args)
        return output, (fn, args)

    def replay(self, handle: Any) -> torch.Tensor:
        fn, args = handle
        return fn(*args)

    def pool_bytes(self) -> int:
        return 0

    def release(self) -> None:
        pass


class CudaGraphBackend:
    """torch.cuda.CUDAGraph recordings sharing one memory pool, recorded on a side stream.

    Every call runs under the engine's device (stream and memory calls act on the current one).
    The pool's size is what the captures themselves reserved: measured around each capture,
    after the eager pass that allocates lazy state (the K/V pool, cuBLAS workspaces), so it
    counts the recordings' memory and nothing else."""

    name = "cuda-graph"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        with on_device(device):
            self._pool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream(device)
        self._pool_bytes = 0

    def record(
        self, fn: StepFn, args: tuple[DecodePlan, CacheRows], guard: Guard
    ) -> tuple[torch.Tensor, Any]:
        with on_device(self.device):
            stream = self._stream
            stream.wait_stream(torch.cuda.current_stream(self.device))
            # An eager pass first, so lazy allocations happen outside the pool. It runs the
            # ops the capture runs, on the same arguments, and the capture is guarded: a
            # guard here would refuse nothing more, and cost a dispatch per op of every
            # layer, per recording.
            with torch.cuda.stream(stream):
                fn(*args)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            torch.cuda.synchronize(self.device)
            # Capture begins with empty_cache(); release the eager pass's cached temporaries
            # first, or their release would cancel the pool's growth in the difference.
            torch.cuda.empty_cache()
            before = torch.cuda.memory_reserved(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=stream), guard():
                output = fn(*args)
            torch.cuda.synchronize(self.device)
            self._pool_bytes += max(0, torch.cuda.memory_reserved(self.device) - before)
            graph.replay()
        return output, (graph, output)

    def replay(self, handle: Any) -> torch.Tensor:
        graph, output = handle
        graph.replay()
        return output

    def pool_bytes(self) -> int:
        return self._pool_bytes

    def release(self) -> None:
        with on_device(self.device):
            torch.cuda.synchronize(self.device)  # no replay still reads the pool
            torch.cuda.empty_cache()
        self._pool_bytes = 0


def default_backend(device: torch.device) -> Backend:
    if device.type == "cuda" and torch.cuda.is_available():
        return CudaGraphBackend(device)
    return FrozenCallBackend()


@dataclass(frozen=True, slots=True)
class RecordingStats:
    """The recordings' counters, as /health and /metrics report them."""

    backend: str
    recordings: int  # made, including discarded probes
    cold_recordings: int  # made while requests were in flight (0 on a warmed engine)
    replays: int
    eager_fallback_steps: int  # decode steps of a shape outside the warm list
    shapes: int  # recordings held now
    logits_buffer_bytes: int
    needed_bytes: int  # what the recordings held now need at their peaks, summed
    pool_bytes: int  # the recordings' shared pool (CUDA), discarded probes' memory included
    pool_sharing_ratio: float  # needed_bytes / pool_bytes

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Recording:
    shape: Shape
    seq_ids: tuple[int, ...]  # the row set it froze; () is unbound (a warm recording)
    plan: DecodePlan  # the argument objects it holds, with `cache`
    cache: CacheRows
    addresses: dict[str, int]
    handle: Any
    seconds: float
    cold: bool  # made while requests were in flight
    needed_bytes: int


class DecodeRecordings:
    """The recordings of one engine, their shared logits buffer, and the counters /metrics
    reports."""

    def __init__(
        self,
        step: StepFn,
        table: SlotTable,
        buffers: DecodeBuffers,
        *,
        backend: Backend,
        footprint: StepFootprint,
        budget_bytes: Callable[[], int],
    ) -> None:
        self._model_step = step
        self.table = table
        self.buffers = buffers
        self.backend = backend
        self.footprint = footprint
        self.device = table.device
        self._budget_bytes = budget_bytes
        # Made before any recording, so it lives outside the recordings' pool; each recording
        # writes its rows here, and a step's logits are read before the next step writes.
        self.logits = torch.zeros(
            (buffers.max_batch, footprint.vocab_size), dtype=torch.float32, device=self.device
        )  # [max_rows, vocab]
        self.by_shape: dict[Shape, Recording] = {}
        self._baseline = self.addresses()
        self.warmed = False  # set by the warm-up: from then on nothing is recorded
        self.num_recorded = 0
        self.num_cold = 0
        self.num_replays = 0
        self.num_eager_fallback = 0

    def addresses(self) -> dict[str, int]:
        return {
            **self.buffers.addresses(),
            "slot_table": self.table.address,
            "logits": self.logits.data_ptr(),
        }

    def step(self, plan: DecodePlan, cache: CacheRows) -> torch.Tensor:
        """The recorded step: the model's forward, its logits copied into the shared buffer."""
        out = self._model_step(plan, cache)  # [rows, vocab]
        rows = self.logits[: out.shape[0]]
        rows.copy_(out)
        return rows

    def guard(self) -> AbstractContextManager[object]:
        return capture_guard(self.device)

    def can_replay(self, plan: DecodePlan) -> bool:
        recording = self.by_shape.get(Shape(*plan.shape))
        return recording is not None and (
            not recording.seq_ids or recording.seq_ids == plan.seq_ids
        )

    @torch.inference_mode()
    def record(self, plan: DecodePlan, cache: CacheRows, *, cold: bool) -> torch.Tensor:
        """Gate, then record plan's step over cache; returns the logits of the recording run."""
        if self.warmed:
            # A warmed engine records nothing in front of a client (run() falls back to eager).
            check_no_cold_captures(int(cold))
        shape = Shape(*plan.shape)
        needed = self.footprint.peak_bytes(shape.rows, shape.width)
        check_pad_inert(plan)
        check_mapping_is_window(plan, self.table)
        check_window_intact(plan, self.table)
        check_plan_addressing(plan)
        check_addresses_stable(self._baseline, self.addresses())
        # Recordings share one pool: what earlier ones reserved is there for this one too.
        check_pool_budget(needed, self._budget_bytes() + self.backend.pool_bytes())
        started = time.perf_counter()
        output, handle = self.backend.record(self.step, (plan, cache), self.guard)
        seconds = time.perf_counter() - started
        self.by_shape[shape] = Recording(
            shape, cache.seq_ids, plan, cache, self.addresses(), handle, seconds, cold, needed
        )
        self.num_recorded += 1
        self.num_cold += int(cold)
        return output

    @torch.inference_mode()
    def replay(self, plan: DecodePlan) -> torch.Tensor:
        shape = Shape(*plan.shape)
        recording = self.by_shape.get(shape)
        if recording is None:
            raise UnrecordedShapeError(
                f"no recording of {shape}; recorded: {sorted(self.by_shape, reverse=True)[:4]}"
            )
        check_replay_rows(recording.seq_ids, plan)
        check_addresses_stable(recording.addresses, self.addresses())
        _check_same_arguments(recording.plan, plan)
        self.num_replays += 1
        return self.backend.replay(recording.handle)

    def discard(self, shape: Shape) -> None:
        """Forget shape's recording (a warm-up probe the time budget then trimmed away). On
        CUDA its memory stays in the shared pool, for the others, and in pool_bytes."""
        self.by_shape.pop(shape, None)

    def destroy(self) -> None:
        """Free every recording and the pool they shared (a clean shutdown); the counters stay
        for the last scrape. A later decode step runs eagerly."""
        self.by_shape.clear()
        self.backend.release()
        self.warmed = True  # nothing is recorded after a destroy

    def run(self, plan: DecodePlan, cache: CacheRows) -> torch.Tensor:
        """Logits of plan's rows ([num_rows, vocab], padded rows included).

        Replay the shape's recording. Without one: a warmed engine runs the step eagerly (a
        shape outside its warm list: counted, never recorded in front of a client); a lazy
        engine records it once, over the empty selection, so it is bound to no row set."""
        if self.can_replay(plan):
            return self.replay(plan)
        if self.warmed:
            self.num_eager_fallback += 1
            return self._model_step(plan, cache)
        return self.record(plan, cache.pool.empty_rows(), cold=True)

    def stats(self) -> RecordingStats:
        pool = self.backend.pool_bytes()
        needed = sum(r.needed_bytes for r in self.by_shape.values())
        return RecordingStats(
            backend=self.backend.name,
            recordings=self.num_recorded,
            cold_recordings=self.num_cold,
            replays=self.num_replays,
            eager_fallback_steps=self.num_eager_fallback,
            shapes=len(self.by_shape),
            logits_buffer_bytes=self.logits.numel() * self.logits.element_size(),
            needed_bytes=needed,
            pool_bytes=pool,
            pool_sharing_ratio=needed / pool if pool else 0.0,
        )


def _check_same_arguments(recorded: DecodePlan, plan: DecodePlan) -> None:
    """The replayed step reads the recorded objects: plan must be views on the same storage."""
    for name in (*BUFFER_NAMES, "slot_rect"):
        old, new = getattr(recorded, name), getattr(plan, name)
        if (old.data_ptr(), old.shape, old.stride()) != (new.data_ptr(), new.shape, new.stride()):
            raise RecordingArgumentsError(
                f"{name}: the recording holds {tuple(old.shape)} at {old.data_ptr():#x};"
                f" this step's is {tuple(new.shape)} at {new.data_ptr():#x}"
            )

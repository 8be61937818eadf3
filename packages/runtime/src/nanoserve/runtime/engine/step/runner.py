"""ModelRunner: turns a scheduled step into a plan, checks it, and runs it.

A step in which every row feeds one token is a decode step: it is planned with plan_decode
and, as the switches allow, padded to its bucket, loaded into persistent buffers, and replayed
from a recording. Any other step (prompt chunks, with decode rows as chunks of one) runs
eagerly through a PrefillPlan.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from nanoserve.core import (
    BucketSet,
    DecodePlan,
    DecodeSeq,
    PrefillPlan,
    bucket_decode,
    plan_decode,
    plan_prefill,
)
from nanoserve.core.state_slots import check_state_rows
from nanoserve.runtime.decode.decode_inputs import DecodeInputs
from nanoserve.runtime.decode.recordings import Backend, DecodeRecordings, StepFn, default_backend
from nanoserve.runtime.decode.warmup import (
    Clock,
    WarmEstimate,
    WarmPlan,
    WarmupReport,
    plan_warm,
    record_warm_list,
)
from nanoserve.runtime.engine.config.engine_config import EngineConfigError, ResolvedConfig
from nanoserve.runtime.engine.step.scheduler import SchedulerOutput
from nanoserve.runtime.model.kv_pool import CacheRows, KVPool
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.memory import free_bytes
from nanoserve.runtime.model.served_model import ServedModel


class Executed(NamedTuple):
    """What a step computed: the sampling rows' logits, and each pooling row's kept hidden
    states (by seq_id; none for a chunk that keeps no row)."""

    logits: torch.Tensor  # [rows that sample, vocab] float32
    hidden: dict[int, torch.Tensor]  # seq_id -> [kept rows, hidden]


class ModelRunner:
    def __init__(
        self,
        model: ServedModel,
        pool: KVPool,
        config: ResolvedConfig,
        backend: Backend | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.config = config
        self.sink_slot = pool.plan.sink_slot
        self.sink_state_slot = pool.sink_state_slot
        self.footprint = model.step_footprint()
        device = pool.device
        mode = config.decode_mode
        self.buckets: BucketSet | None = None
        self.inputs: DecodeInputs | None = None
        self.recordings: DecodeRecordings | None = None
        if mode.buckets:
            self.buckets = BucketSet(config.max_batch, config.max_model_len, config.width_multiple)
        if mode.persistent:
            self.inputs = DecodeInputs(
                config.max_batch,
                config.max_model_len,
                self.sink_slot,
                device,
                sink_state_slot=self.sink_state_slot,
            )
        if mode.recorded:
            assert self.inputs is not None
            assert isinstance(model, LlamaModel), "only a decoder records decode steps"
            self.recordings = DecodeRecordings(
                _decode_step(model),
                self.inputs.table,
                self.inputs.buffers,
                backend=backend or default_backend(device),
                footprint=self.footprint,
                budget_bytes=self.warm_budget_bytes,
            )

    def warm_budget_bytes(self) -> int:
        """What one recorded step may use at its peak (the one definition: the recording gate
        and the warm list's width ceiling both read it): the configured budget, else the memory
        measured free less what the K/V pool will still take when it becomes resident."""
        if self.config.warm_budget_bytes is not None:
            return self.config.warm_budget_bytes
        pending = self.pool.plan.total_bytes - self.pool.resident_bytes
        return max(0, free_bytes(self.pool.device) - pending)

    def plan_warm(self) -> WarmPlan:
        """The warm list the config and memory allow (decode_mode="recorded")."""
        if self.recordings is None or self.buckets is None:
            raise EngineConfigError("a warm-up needs decode_mode='recorded'")
        return plan_warm(
            self.buckets,
            self.recordings.footprint,
            max_rows=min(self.config.warm_max_rows, self.config.max_batch),
            max_width=self.config.warm_max_width,
            budget_bytes=self.warm_budget_bytes(),
        )

    def warm(
        self,
        plan: WarmPlan,
        *,
        cancel: threading.Event | None = None,
        announce: Callable[[WarmPlan, WarmEstimate], None] | None = None,
        clock: Clock = time.perf_counter,
    ) -> WarmupReport:
        """Record plan within the config's time budget (the warm-up)."""
        if self.recordings is None:
            raise EngineConfigError("a warm-up needs decode_mode='recorded'")
        return record_warm_list(
            self.recordings,
            self.pool,
            plan,
            budget_seconds=self.config.warm_seconds,
            cancel=cancel,
            announce=announce,
            clock=clock,
        )

    def execute(self, out: SchedulerOutput) -> Executed:
        """Logits [rows that sample, vocab], in the order of out.scheduled (a verify row gives
        one per position: its last token's, then each draft token's), and the hidden states
        each pooling row keeps."""
        chunks = [item.chunk for item in out.scheduled]
        check_state_rows(
            [c.seq_id for c in chunks], [c.state_slot for c in chunks], self.sink_state_slot
        )
        if out.is_decode_only:
            return Executed(self._decode(out), {})
        plan = plan_prefill(
            chunks,
            sink_slot=self.sink_slot,
            sink_state_slot=self.sink_state_slot,
            device=self.pool.device,
        )
        cache = self.pool.view(plan.seq_ids)
        if any(item.pool is not None for item in out.scheduled):
            return self._pooling(out, plan, cache)
        return Executed(self._prefill(out, plan, cache), {})

    def _prefill(self, out: SchedulerOutput, plan: PrefillPlan, cache: CacheRows) -> torch.Tensor:
        if any(item.draft for item in out.scheduled):
            starts = plan.query_starts
            rows = [
                row
                for i, item in enumerate(out.scheduled)
                if item.samples
                for row in range(starts[i + 1] - 1 - len(item.draft), starts[i + 1])
            ]
            index = torch.tensor(rows, dtype=torch.int64, device=self.pool.device)
            return self.model.forward(plan, cache, logit_rows=index)  # [rows, vocab]
        logits = self.model.forward(plan, cache)  # [chunks, vocab]
        sampling = [i for i, item in enumerate(out.scheduled) if item.samples]
        return logits if len(sampling) == len(out.scheduled) else logits[sampling]

    def _pooling(self, out: SchedulerOutput, plan: PrefillPlan, cache: CacheRows) -> Executed:
        """A step with pooling rows: the final-normed hidden states of the sampling rows' last
        tokens (then through the output projection) and of the rows each pooling row keeps."""
        starts = plan.query_starts
        rows = [starts[i + 1] - 1 for i, item in enumerate(out.scheduled) if item.samples]
        sampling = len(rows)
        spans: dict[int, tuple[int, int]] = {}
        for i, item in enumerate(out.scheduled):
            if item.pool is not None and item.pool.count:
                spans[item.seq_id] = (len(rows), len(rows) + item.pool.count)
                rows.extend(range(starts[i] + item.pool.start, starts[i] + item.pool.stop))
        if not rows:  # pooling chunks that keep nothing yet: their K/V is all they write
            self.model.hidden(plan, cache)
            vocab = self.model.config.vocab_size
            return Executed(torch.empty(0, vocab, device=self.pool.device), {})
        index = torch.tensor(rows, dtype=torch.int64, device=self.pool.device)
        hidden = self.model.hidden(plan, cache, logit_rows=index)  # [rows, hidden]
        vocab = self.model.config.vocab_size
        logits = (  # an encoder's steps sample nothing (and it has no LM head)
            self.model.logits(hidden[:sampling])
            if sampling
            else torch.empty(0, vocab, device=self.pool.device)
        )
        return Executed(logits, {seq_id: hidden[a:b] for seq_id, (a, b) in spans.items()})

    def plan_decode_step(self, out: SchedulerOutput) -> DecodePlan:
        seqs = [
            DecodeSeq(c.seq_id, c.token_ids[0], c.start_pos, c.block_table, c.state_slot)
            for c in (item.chunk for item in out.scheduled)
        ]
        if self.inputs is not None and self.buckets is not None:
            # Planned on the host, moved in one copy (persistent inputs).
            width = max(s.position for s in seqs) + 1
            return self.inputs.load(seqs, self.buckets.bucket_of(len(seqs), width))
        plan = plan_decode(
            seqs,
            sink_slot=self.sink_slot,
            sink_state_slot=self.sink_state_slot,
            device=self.pool.device,
        )
        if self.buckets is not None:
            plan = bucket_decode(plan, self.buckets)
        return plan

    def _decode(self, out: SchedulerOutput) -> torch.Tensor:
        plan = self.plan_decode_step(out)
        real = len(plan.seq_ids)
        cache = self.pool.view(plan.seq_ids)
        if self.recordings is not None:
            logits = self.recordings.run(plan, cache)
        else:
            logits = self.model.forward(plan, cache)
        return logits[:real]

    def release(self, seq_id: int) -> None:
        """A sequence finished or was preempted: its table rows must be rewritten from 0."""
        if self.inputs is not None:
            self.inputs.table.release(seq_id)


def _decode_step(model: LlamaModel) -> StepFn:
    def step(plan: DecodePlan, cache: CacheRows) -> torch.Tensor:
        return model.forward(plan, cache)

    return step

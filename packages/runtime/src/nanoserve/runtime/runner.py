"""ModelRunner: turns a scheduled step into a plan, checks it, and runs it.

A step in which every row feeds one token is a decode step: it is planned with plan_decode
and, as the switches allow, padded to its bucket, loaded into persistent buffers, and replayed
from a recording. Any other step (prompt chunks, with decode rows as chunks of one) runs
eagerly through a PrefillPlan.
"""

from __future__ import annotations

import torch

from nanoserve.core import (
    BucketSet,
    DecodeBuffers,
    DecodePlan,
    DecodeSeq,
    PrefillChunk,
    SlotTable,
    bucket_decode,
    plan_decode,
    plan_prefill,
)
from nanoserve.core.step_footprint import StepFootprint
from nanoserve.runtime.decode_inputs import DecodeInputs
from nanoserve.runtime.engine_config import EngineConfig
from nanoserve.runtime.graphs import Backend, DecodeGraphs, StepFn, default_backend
from nanoserve.runtime.kv_pool import CacheRows, KVPool
from nanoserve.runtime.memory import free_bytes
from nanoserve.runtime.model import LlamaModel
from nanoserve.runtime.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        pool: KVPool,
        config: EngineConfig,
        backend: Backend | None = None,
    ) -> None:
        assert config.max_model_len is not None, "resolve the config first"
        self.model = model
        self.pool = pool
        self.config = config
        self.sink_slot = pool.plan.sink_slot
        cfg = model.config
        self.footprint = StepFootprint(
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            vocab_size=cfg.vocab_size,
            pool_bytes=pool.plan.dtype.itemsize,
            accum_bytes=model.accum_dtype.itemsize,
        )
        device = pool.device
        self.buckets = (
            BucketSet(config.max_batch, config.max_model_len, config.width_multiple)
            if config.bucket_decode
            else None
        )
        self.table: SlotTable | None = None
        self.buffers: DecodeBuffers | None = None
        self.graphs: DecodeGraphs | None = None
        self.inputs: DecodeInputs | None = None
        if config.persist_inputs:
            self.inputs = DecodeInputs(
                config.max_batch, config.max_model_len, self.sink_slot, device
            )
            self.table = self.inputs.table
            self.buffers = self.inputs.buffers
        if config.capture_decode:
            assert self.table is not None and self.buffers is not None
            self.graphs = DecodeGraphs(
                _decode_step(model),
                self.table,
                self.buffers,
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

    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Logits [rows that sample, vocab], in the order of out.scheduled."""
        if out.is_decode_only:
            return self._decode(out)
        chunks = []
        for item in out.scheduled:
            seq = item.seq
            start = seq.num_computed
            tokens = seq.token_ids()[start : start + item.num_new]
            chunks.append(PrefillChunk(seq.seq_id, tuple(tokens), start, seq.block_table))
        plan = plan_prefill(chunks, sink_slot=self.sink_slot, device=self.pool.device)
        logits = self.model.forward(plan, self.pool.view(plan.rows))  # [chunks, vocab]
        sampling = [i for i, item in enumerate(out.scheduled) if item.samples]
        return logits if len(sampling) == len(chunks) else logits[sampling]

    def plan_decode_step(self, out: SchedulerOutput) -> DecodePlan:
        seqs = [
            DecodeSeq(s.seq.seq_id, s.seq.token_ids()[-1], s.seq.num_computed, s.seq.block_table)
            for s in out.scheduled
        ]
        if self.inputs is not None and self.buckets is not None:
            # Planned on the host, moved in one copy (persistent inputs).
            width = max(s.position for s in seqs) + 1
            return self.inputs.load(seqs, self.buckets.bucket_of(len(seqs), width))
        plan = plan_decode(
            seqs, sink_slot=self.sink_slot, table=self.table, device=self.pool.device
        )
        if self.buckets is not None:
            plan = bucket_decode(plan, self.buckets, self.table)
        if self.buffers is not None:
            plan = self.buffers.load(plan)
        return plan

    def _decode(self, out: SchedulerOutput) -> torch.Tensor:
        plan = self.plan_decode_step(out)
        real = len(plan.rows)
        cache = self.pool.view(plan.rows)
        if self.graphs is not None:
            logits = self.graphs.run(plan, cache)
        else:
            logits = self.model.forward(plan, cache)
        return logits[:real]

    def release(self, seq_id: int) -> None:
        """A sequence finished or was preempted: its table rows must be rewritten from 0."""
        if self.table is not None:
            self.table.release(seq_id)


def _decode_step(model: LlamaModel) -> StepFn:
    def step(plan: DecodePlan, cache: CacheRows) -> torch.Tensor:
        return model.forward(plan, cache)

    return step

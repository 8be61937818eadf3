"""Scheduler: which sequences run this step, and how many of their tokens.

Running sequences go first, oldest first: each computes its uncomputed tokens (one, for a
decoding sequence; a chunk, for a prompt) within the step's token budget. Waiting sequences
are admitted while rows, budget and blocks last. When the pool runs dry mid-decode, the most
recently admitted sequence is preempted: its blocks are freed and it is recomputed later.

Every decoding sequence waits for the prompt tokens its step carries, so with a
`PrefillBudget` those are bounded by how many sequences decode and how many prompt tokens wait
(core/prefill_budget.py): a mixed step stays within a ratio of the decode step alone unless a
backlog of prompts needs more (then within a burst bound); a step with nothing decoding takes
the whole token budget unless a burst of prompts is more than it holds.

A hybrid model's prefix cache keeps recurrent states at block boundaries (checkpoints): its
prompt chunks stop where a state is to be saved, a hit's plan names the checkpoint to restore
(`restores`), and `commit` names the states to save (core/state_checkpoints.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from nanoserve.core import PrefillBudget, PrefillChunk
from nanoserve.core.errors import GeometryError, NanoserveError
from nanoserve.core.pooling import ChunkRows, kept_rows
from nanoserve.core.state_slots import StateSlots, check_state_conservation
from nanoserve.runtime.engine.step.block_manager import BlockManager
from nanoserve.runtime.engine.step.sequence import Sequence, Status


class QueueFullError(NanoserveError):
    """The waiting queue is at its bound: try again later (the API answers 429)."""


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """One row of a step, as data: what the runner computes, and no live sequence."""

    chunk: PrefillChunk  # seq_id, the tokens computed this step (a decode: the last sampled
    # one), the position of the first (the sequence's computed count), and its block table
    samples: bool  # the chunk reaches the sequence's last token: its logits give the next one
    # Proposed tokens fed after the last one, each to be verified (speculation); the chunk
    # holds them, and every one of its positions gives logits.
    draft: tuple[int, ...] = ()
    # A pooling row: which of the chunk's rows its pooling reads (it never samples)
    pool: ChunkRows | None = None

    @property
    def seq_id(self) -> int:
        return self.chunk.seq_id

    @property
    def num_new(self) -> int:
        return len(self.chunk.token_ids)


def schedule_seq(seq: Sequence, num_new: int) -> ScheduledSeq:
    """seq's next num_new tokens, copied alone (never its whole token list)."""
    start = seq.num_computed
    tokens = seq.tokens(start, start + num_new)
    chunk = PrefillChunk(seq.seq_id, tokens, start, seq.block_table, _state_slot(seq))
    if seq.pooling is not None:
        rows = kept_rows(seq.pooling.method, start, num_new, seq.num_tokens)
        return ScheduledSeq(chunk, samples=False, pool=rows)
    return ScheduledSeq(chunk, start + num_new == seq.num_tokens)


def schedule_draft(seq: Sequence, draft: tuple[int, ...]) -> ScheduledSeq:
    """seq's last token, then the draft after it: a verify row."""
    start = seq.num_computed
    tokens = (*seq.tokens(start, start + 1), *draft)
    chunk = PrefillChunk(seq.seq_id, tokens, start, seq.block_table, _state_slot(seq))
    return ScheduledSeq(chunk, True, draft)


def _state_slot(seq: Sequence) -> int:
    assert seq.state_slot is not None, f"sequence {seq.seq_id} runs without a state slot"
    return seq.state_slot


# (the step's decoding sequences, the tokens the step may still take) -> drafts by seq_id
Drafter = Callable[[list[Sequence], int], Mapping[int, tuple[int, ...]]]


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledSeq, ...]  # running order: decodes and chunks together
    preempted: tuple[int, ...]  # seq ids sent back to waiting this step
    # (checkpoint slot, sequence's slot): states to copy before the step runs (prefix hits)
    restores: tuple[tuple[int, int], ...] = ()

    @property
    def is_decode_only(self) -> bool:
        """Every row feeds exactly one token: the shape the bucketed, recorded path takes."""
        return all(s.num_new == 1 and s.samples for s in self.scheduled)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        *,
        max_batch: int,
        max_num_batched_tokens: int,
        max_waiting: int | None = None,
        watermark_blocks: int = 1,
        prefill_budget: PrefillBudget | None = None,
        drafter: Drafter | None = None,
        state_slots: StateSlots | None = None,
        whole_prompts: bool = False,
    ) -> None:
        self.blocks = blocks
        # An encoder's prompt is one chunk: its attention reads every position, not a cache
        self.whole_prompts = whole_prompts
        # One per running sequence: taken at admission, given back at preemption or the end.
        self.state_slots = state_slots or StateSlots(max_batch)
        if self.state_slots.num_slots < max_batch:
            raise GeometryError(
                f"{self.state_slots.num_slots} state slots cannot run max_batch {max_batch}"
            )
        self.max_batch = max_batch
        self.max_num_batched_tokens = max_num_batched_tokens
        # None: prompt tokens take whatever of the token budget decoding rows leave
        self.prefill_budget = prefill_budget
        self.drafter = drafter  # None: no speculation
        self.max_waiting = max_waiting
        self.watermark_blocks = watermark_blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seqs: Iterable[Sequence]) -> None:
        seqs = list(seqs)
        if self.max_waiting is not None and len(self.waiting) + len(seqs) > self.max_waiting:
            raise QueueFullError(
                f"the waiting queue holds {len(self.waiting)} of {self.max_waiting}; try again later"
            )
        self.waiting.extend(seqs)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        decoding = sum(1 for seq in self.running if seq.uncomputed == 1)
        prompt_budget = budget - decoding
        if self.prefill_budget is not None:
            prompts = [s for s in self.running if s.uncomputed > 1] + list(self.waiting)
            backlog = sum(s.uncomputed for s in prompts)
            tokens = self.prefill_budget.tokens(decoding, backlog, len(prompts))
            prompt_budget = min(prompt_budget, tokens)
        scheduled: list[ScheduledSeq] = []
        preempted: list[int] = []
        restores: list[tuple[int, int]] = []
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            prompt = seq.uncomputed > 1  # a prompt chunk (or a recomputation), not one token
            num_new = self._cut(seq, min(seq.uncomputed, budget, prompt_budget if prompt else 1))
            if num_new == 0:
                index += 1
                continue
            if not self._reserve(seq, num_new, scheduled, preempted):
                break  # seq itself was preempted: it was the newest
            scheduled.append(schedule_seq(seq, num_new))
            budget -= num_new
            if prompt:
                prompt_budget -= num_new
            index += 1
        if not preempted:
            self._admit(min(budget, prompt_budget), scheduled, restores)
            if self.drafter is not None:
                self._add_drafts(scheduled)
        return SchedulerOutput(tuple(scheduled), tuple(preempted), tuple(restores))

    def _cut(self, seq: Sequence, num_new: int) -> int:
        """A prompt chunk stops where a checkpoint is to be saved (a hybrid's prefix cache)."""
        checkpoints = self.blocks.checkpoints
        if checkpoints is None or not self.blocks.enable_prefix_cache or num_new <= 1:
            return num_new
        return checkpoints.rule.cut(seq.num_computed, num_new, seq.num_tokens)

    def _add_drafts(self, scheduled: list[ScheduledSeq]) -> None:
        """Decoding rows become verify rows where the drafter proposes and the pool has the
        blocks without preempting anyone (a draft is never worth a recomputation)."""
        assert self.drafter is not None
        budget = self.max_num_batched_tokens - sum(item.num_new for item in scheduled)
        running = {seq.seq_id: seq for seq in self.running}
        # A grammar's state cannot take tokens that may be rejected: its rows never verify.
        decoding = {
            item.seq_id: i
            for i, item in enumerate(scheduled)
            if item.num_new == 1 and item.samples and running[item.seq_id].grammar is None
        }
        if budget < 1 or not decoding:
            return
        drafts = self.drafter([running[seq_id] for seq_id in decoding], budget)
        for seq_id, proposed in drafts.items():
            seq, draft = running[seq_id], tuple(proposed[:budget])
            end = seq.num_computed + 1 + len(draft)
            if not draft or not self.blocks.can_allocate(seq.block_table.blocks_needed(end)):
                continue
            self.blocks.grow(seq.block_table, end)
            scheduled[decoding[seq_id]] = schedule_draft(seq, draft)
            budget -= len(draft)

    def _reserve(
        self, seq: Sequence, num_new: int, scheduled: list[ScheduledSeq], preempted: list[int]
    ) -> bool:
        """Blocks for seq's next num_new tokens, preempting the newest running sequences."""
        while True:
            needed = seq.block_table.blocks_needed(seq.num_computed + num_new)
            if self.blocks.can_allocate(needed):
                self.blocks.grow(seq.block_table, seq.num_computed + num_new)
                return True
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim.seq_id)
            if victim is seq:
                return False

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.block_table)
        self._release_state(seq)  # recomputed with its K/V
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)

    def _admit(
        self, budget: int, scheduled: list[ScheduledSeq], restores: list[tuple[int, int]]
    ) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            if seq.after is not None and not self._sibling_cached(seq.after):
                break
            if self.whole_prompts and seq.uncomputed > budget:
                break  # the next step with room for all of it
            tokens = seq.token_ids()
            # A pooling request reads its prompt's hidden states: it recomputes every token
            cached = self.blocks.match_prefix(tokens) if seq.pooling is None else []
            restore = self.blocks.restore_slot(cached)  # the state at the hit's end
            seq.block_table.blocks = cached
            seq.num_computed = seq.num_cached = len(cached) * self.blocks.block_size
            num_new = self._cut(seq, min(seq.uncomputed, budget))
            needed = seq.block_table.blocks_needed(seq.num_computed + num_new)
            # The watermark keeps room for running sequences to grow; with none running it
            # would only refuse a request that fits the pool exactly, forever.
            watermark = self.watermark_blocks if self.running else 0
            if not self.blocks.can_allocate(needed, watermark):
                self.blocks.release(seq.block_table)
                seq.num_computed = seq.num_cached = 0
                break
            self.blocks.grow(seq.block_table, seq.num_computed + num_new)
            self.blocks.count_admitted(len(tokens), seq.num_cached)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            seq.state_slot = self.state_slots.take(seq.seq_id)
            if restore is not None:
                restores.append((restore, seq.state_slot))
            self.running.append(seq)
            scheduled.append(schedule_seq(seq, num_new))
            budget -= num_new

    def _release_state(self, seq: Sequence) -> None:
        self.state_slots.give_back(seq.seq_id)
        seq.state_slot = None
        check_state_conservation(self.state_slots)

    def _sibling_cached(self, seq_id: int) -> bool:
        """A parallel sample starts once its first sibling's prompt is computed (and cached)."""
        for seq in self.running:
            if seq.seq_id == seq_id:
                return seq.num_computed >= len(seq.prompt_ids)
        return True  # finished, aborted or preempted: nothing to wait for

    def seqs_of(self, out: SchedulerOutput) -> list[Sequence]:
        """The running sequences of out's rows, in its order (a step's rows stay running until
        it is committed)."""
        running = {seq.seq_id: seq for seq in self.running}
        return [running[item.seq_id] for item in out.scheduled]

    def commit(
        self, out: SchedulerOutput, accepted: Mapping[int, int] | None = None
    ) -> list[tuple[int, int]]:
        """After a step, before its tokens are appended: advance computed counts, cache blocks
        that became full. A verify row's positions count up to its accepted draft tokens
        (`accepted`, by seq_id); the K/V written for the rejected ones is past the computed
        count, where no attention reads, and the blocks that held only those are given back.

        Returns the states to save, (sequence's slot, checkpoint slot): those of rows whose
        computed count landed where the checkpoint rule saves."""
        block_size, caching = self.blocks.block_size, self.blocks.enable_prefix_cache
        checkpoints = self.blocks.checkpoints if caching else None
        saves: list[tuple[int, int]] = []
        for seq, item in zip(self.seqs_of(out), out.scheduled, strict=True):
            kept = item.draft[: (accepted or {}).get(item.seq_id, 0)]
            seq.num_computed += item.num_new - len(item.draft) + len(kept)
            if seq.pooling is not None:
                continue  # its K/V is not kept after its answer: nothing to cache
            if item.draft:
                self.blocks.trim(seq.block_table, seq.num_computed + 1)
            if caching and seq.num_computed // block_size > len(seq.block_hashes):  # one filled
                self.blocks.cache_full_blocks(
                    seq.block_table, [*seq.token_ids(), *kept], seq.num_computed, seq.block_hashes
                )
            if checkpoints is not None and checkpoints.rule.saves_at(
                seq.num_computed, seq.num_tokens
            ):
                key = seq.block_hashes[seq.num_computed // block_size - 1]
                if (slot := self.blocks.checkpoint(key)) is not None:
                    saves.append((_state_slot(seq), slot))
        return saves

    def finish(self, seq: Sequence) -> None:
        """Free a finished or aborted sequence at once."""
        if seq in self.running:
            self.running.remove(seq)
            self.blocks.release(seq.block_table)
            self._release_state(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            self.blocks.release(seq.block_table)

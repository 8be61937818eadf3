"""Scheduler: token budget, row limit, admission by blocks, preemption — driven without a model.

`drive` plays the engine's part: schedule, commit, then append a token to every sequence whose
chunk reached its last token, and retire finished ones. Block size 4 throughout.
"""

from __future__ import annotations

import itertools
import random

import pytest

from nanoserve.core import BlockTable, PrefillBudget
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step.block_manager import BlockManager
from nanoserve.runtime.engine.step.scheduler import QueueFullError, Scheduler, SchedulerOutput
from nanoserve.runtime.engine.step.sequence import Sequence, Status
from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.text.tokenizer import IncrementalDetokenizer

BS = 4
TOKEN = 100  # what the fake sampler always draws (not eos)


@pytest.fixture
def make_seq(tiny_llama_checkpoint: Checkpoint):
    tokenizer = tiny_llama_checkpoint.tokenizer
    ids = itertools.count()

    def make(prompt_len: int, max_tokens: int = 4, first_token: int | None = None) -> Sequence:
        seq_id = next(ids)
        if first_token is None:  # prompts of different sequences share no prefix unless asked
            first_token = 1000 * (seq_id + 1)
        return Sequence(
            seq_id=seq_id,
            request_id=f"r{seq_id}",
            index=0,
            prompt_ids=list(range(first_token, first_token + prompt_len)),
            params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
            block_table=BlockTable(BS),
            detokenizer=IncrementalDetokenizer(tokenizer),
            eos_token_ids=frozenset({2}),
        )

    return make


def scheduler(num_blocks: int = 64, **kwargs: object) -> Scheduler:
    options = {"max_batch": 8, "max_num_batched_tokens": 64, **kwargs}
    return Scheduler(BlockManager(num_blocks, BS), **options)  # type: ignore[arg-type]


def drive(s: Scheduler) -> SchedulerOutput:
    """One engine step without a model."""
    out = s.schedule()
    seqs = s.seqs_of(out)
    s.commit(out)
    for seq, item in zip(seqs, out.scheduled, strict=True):
        if item.samples:  # this chunk reached the last token
            seq.append(TOKEN, None, None)
            if seq.finished:
                s.finish(seq)
    return out


def shape(out: SchedulerOutput) -> list[tuple[int, int]]:
    return [(item.seq_id, item.num_new) for item in out.scheduled]


def test_one_request_prefill_then_decode(make_seq) -> None:
    s = scheduler()
    seq = make_seq(6, max_tokens=3)
    s.add([seq])
    assert s.has_work
    first = s.schedule()
    assert shape(first) == [(seq.seq_id, 6)]
    assert first.scheduled[0].samples
    assert not first.is_decode_only  # a prompt chunk
    assert first.num_tokens == 6
    assert seq.status is Status.RUNNING
    assert seq.block_table.blocks == [0, 1]
    s.commit(first)
    seq.append(TOKEN, None, None)
    second = s.schedule()
    assert shape(second) == [(seq.seq_id, 1)]
    assert second.is_decode_only
    s.commit(second)
    seq.append(TOKEN, None, None)
    seq.append(TOKEN, None, None)
    assert seq.finished
    s.finish(seq)
    assert not s.has_work
    s.blocks.check(idle=True)


def test_long_prompt_is_chunked_within_the_budget(make_seq) -> None:
    s = scheduler(max_num_batched_tokens=8)
    seq = make_seq(20, max_tokens=2)
    s.add([seq])
    shapes, samples = [], []
    for _ in range(4):
        out = s.schedule()
        shapes.append(shape(out))
        samples.append(out.scheduled[0].samples)
        s.commit(out)
        if samples[-1]:
            seq.append(TOKEN, None, None)
    assert shapes == [[(0, 8)], [(0, 8)], [(0, 4)], [(0, 1)]]
    assert samples == [False, False, True, True]
    assert seq.output_ids == [TOKEN, TOKEN]
    assert seq.finished
    s.finish(seq)
    s.blocks.check(idle=True)


def test_decodes_keep_running_while_a_long_prompt_is_chunked(make_seq) -> None:
    s = scheduler(max_num_batched_tokens=8)
    a, b = make_seq(3, max_tokens=10), make_seq(2, max_tokens=10)
    s.add([a, b])
    assert shape(drive(s)) == [(a.seq_id, 3), (b.seq_id, 2)]
    long = make_seq(20, max_tokens=2)
    s.add([long])
    outs = [drive(s) for _ in range(4)]
    # Each step: both decodes first (1 token each), the prompt takes the other 6 of the budget.
    assert [shape(o) for o in outs] == [
        [(a.seq_id, 1), (b.seq_id, 1), (long.seq_id, 6)],
        [(a.seq_id, 1), (b.seq_id, 1), (long.seq_id, 6)],
        [(a.seq_id, 1), (b.seq_id, 1), (long.seq_id, 6)],
        [(a.seq_id, 1), (b.seq_id, 1), (long.seq_id, 2)],
    ]
    assert all(o.num_tokens <= 8 for o in outs)
    assert long.output_ids == [TOKEN]  # sampled once its last chunk ran


def test_a_prefill_budget_bounds_prompt_tokens_while_sequences_decode(make_seq) -> None:
    s = scheduler(prefill_budget=PrefillBudget.fixed(4, max_tokens=64))
    a, b = make_seq(3, max_tokens=10), make_seq(2, max_tokens=10)
    s.add([a, b])
    assert shape(drive(s)) == [(a.seq_id, 3), (b.seq_id, 2)]  # nothing decodes: the whole step
    long = make_seq(10, max_tokens=2)
    s.add([long])
    outs = [drive(s) for _ in range(3)]
    assert [shape(o) for o in outs] == [
        [(a.seq_id, 1), (b.seq_id, 1), (long.seq_id, 4)],
        [(a.seq_id, 1), (b.seq_id, 1), (long.seq_id, 4)],
        [(a.seq_id, 1), (b.seq_id, 1), (long.seq_id, 2)],
    ]
    assert long.output_ids == [TOKEN]


def test_a_decoding_row_is_never_left_out_by_an_earlier_prompt(make_seq) -> None:
    """Admission order puts a long prompt before a later sequence already decoding (after a
    preemption, say): the decode row still gets its token, the prompt the rest."""
    s = scheduler(max_num_batched_tokens=8)
    long, short = make_seq(30, max_tokens=2), make_seq(2, max_tokens=10)
    s.add([short])
    drive(s)
    s.running.insert(0, long)  # as if admitted before it
    long.status = Status.RUNNING
    long.state_slot = s.state_slots.take(long.seq_id)
    out = s.schedule()
    assert shape(out) == [(long.seq_id, 7), (short.seq_id, 1)]


def test_budget_smaller_than_the_running_rows(make_seq) -> None:
    s = scheduler(max_num_batched_tokens=2)
    seqs = [make_seq(1, max_tokens=5) for _ in range(3)]
    s.add(seqs)
    assert shape(drive(s)) == [(0, 1), (1, 1)]  # a third row does not fit the budget
    assert shape(drive(s)) == [(0, 1), (1, 1)]  # running rows come first; 2 still waits
    assert seqs[2].status is Status.WAITING


def test_row_limit(make_seq) -> None:
    s = scheduler(max_batch=2)
    seqs = [make_seq(3, max_tokens=2) for _ in range(5)]
    s.add(seqs)
    rows = []
    while s.has_work:
        out = drive(s)
        rows.append(len(out.scheduled))
        assert len(s.running) <= 2
    assert rows == [2, 2, 2, 2, 1, 1]
    assert all(seq.finished for seq in seqs)
    s.blocks.check(idle=True)


def test_admission_needs_blocks_plus_the_watermark(make_seq) -> None:
    s = scheduler(num_blocks=4)  # watermark 1 block
    a = make_seq(8, max_tokens=4)  # 2 blocks now, 3 when it decodes
    b = make_seq(5, max_tokens=1)  # 2 blocks: 2 + 1 watermark > the 2 left
    s.add([a, b])
    out = drive(s)
    assert shape(out) == [(a.seq_id, 8)]
    assert s.waiting[0] is b and b.block_table.blocks == []
    while not a.finished:
        assert b.status is Status.WAITING
        drive(s)
    out = drive(s)
    assert shape(out) == [(b.seq_id, 5)]


def test_watermark_does_not_block_a_request_alone(make_seq) -> None:
    """A request that fits the whole pool is admitted when nothing else runs (no deadlock)."""
    s = scheduler(num_blocks=4)
    seq = make_seq(14, max_tokens=2)  # 16 tokens: all 4 blocks, no room for a watermark
    s.add([seq])
    assert shape(drive(s)) == [(seq.seq_id, 14)]
    drive(s)
    assert seq.finished and seq.block_table.blocks == []


def test_preemption_takes_the_most_recently_admitted(make_seq) -> None:
    s = scheduler(num_blocks=4)
    a, b, c, d = (make_seq(3, max_tokens=6) for _ in range(4))
    s.add([a, b, c, d])
    assert shape(drive(s)) == [(0, 3), (1, 3), (2, 3)]  # 1 block each, 1 free: d waits
    assert shape(drive(s)) == [(0, 1), (1, 1), (2, 1)]  # position 3: still 1 block each
    out = drive(s)  # position 4: each needs a second block; one is free
    assert out.preempted == (c.seq_id,)
    assert shape(out) == [(0, 1), (1, 1)]
    assert c.status is Status.WAITING and list(s.waiting) == [c, d]  # ahead of d
    assert c.num_computed == 0 and c.block_table.blocks == []
    assert c.output_ids == [TOKEN, TOKEN]  # kept: recomputed, not resampled
    assert s.running == [a, b]
    s.blocks.check()


def test_a_running_sequence_holds_a_state_slot_until_preempted_or_finished(make_seq) -> None:
    """Admission takes a state slot, which each of the sequence's rows carries; preemption
    gives it back (the state is recomputed with the K/V), and so does the end."""
    s = scheduler(num_blocks=4)
    a, b, c, d = (make_seq(3, max_tokens=6) for _ in range(4))
    s.add([a, b, c, d])
    out = drive(s)
    assert [a.state_slot, b.state_slot, c.state_slot, d.state_slot] == [0, 1, 2, None]
    assert [item.chunk.state_slot for item in out.scheduled] == [0, 1, 2]
    drive(s)
    out = drive(s)  # c is preempted (as above)
    assert out.preempted == (c.seq_id,) and c.state_slot is None
    assert s.state_slots.num_used == 2
    s.finish(a)
    assert a.state_slot is None and s.state_slots.slot_of(a.seq_id) is None
    assert (s.state_slots.num_used, s.state_slots.num_free) == (1, 7)


def test_fewer_state_slots_than_rows_is_refused() -> None:
    from nanoserve.core.errors import GeometryError
    from nanoserve.core.state_slots import StateSlots

    with pytest.raises(GeometryError, match="3 state slots cannot run max_batch 8"):
        scheduler(state_slots=StateSlots(3))


def test_preemption_of_the_scheduled_sequence_itself(make_seq) -> None:
    s = scheduler(num_blocks=3, max_num_batched_tokens=64)
    a = make_seq(4, max_tokens=8)  # needs a 2nd block at position 4
    b = make_seq(3, max_tokens=8)  # needs a 2nd block at position 4
    s.add([a, b])
    assert shape(drive(s)) == [(0, 4), (1, 3)]  # 2 blocks used, 1 free
    out = drive(s)  # a: position 4 takes the free block; b: position 3 still fits
    assert shape(out) == [(0, 1), (1, 1)] and out.preempted == ()
    out = drive(s)  # b (the newest) needs a block: none free, so b preempts itself
    assert out.preempted == (b.seq_id,)
    assert shape(out) == [(a.seq_id, 1)]
    assert s.running == [a] and list(s.waiting) == [b]


def test_no_deadlock_on_a_tiny_pool(make_seq) -> None:
    rng = random.Random(7)
    s = scheduler(num_blocks=6, max_batch=8, max_num_batched_tokens=10)
    seqs = []
    for _ in range(40):
        prompt = rng.randint(1, 18)
        seqs.append(make_seq(prompt, max_tokens=rng.randint(1, 24 - prompt)))  # fits the pool
    s.add(seqs)
    preempted = 0
    for _ in range(5000):
        if not s.has_work:
            break
        out = drive(s)
        preempted += len(out.preempted)
        assert out.scheduled or out.preempted, "a step with work did nothing"
        assert out.num_tokens <= 10
        s.blocks.check()
    assert not s.has_work
    assert all(seq.finished for seq in seqs)
    assert [len(seq.output_ids) for seq in seqs] == [seq.params.max_tokens for seq in seqs]
    assert preempted > 0  # the pool really ran dry
    s.blocks.check(idle=True)
    assert s.blocks.num_in_use == 0


def test_admission_reuses_cached_prefix(make_seq) -> None:
    s = scheduler()
    a = make_seq(10, max_tokens=1, first_token=3)
    s.add([a])
    drive(s)  # a prefilled and finished; its 2 full prompt blocks stay cached
    b = make_seq(10, max_tokens=1, first_token=3)
    s.add([b])
    out = s.schedule()
    assert b.num_cached == 8 and b.num_computed == 8
    assert shape(out) == [(b.seq_id, 2)]  # only the uncached tail runs
    s.commit(out)
    b.append(TOKEN, None, None)
    s.finish(b)
    assert s.blocks.stats.hit_tokens == 8


def test_parallel_sample_waits_for_its_first_sibling(make_seq) -> None:
    s = scheduler()
    first = make_seq(9, max_tokens=3, first_token=3)
    second = make_seq(9, max_tokens=3, first_token=3)
    second.after = first.seq_id
    s.add([first, second])
    assert shape(drive(s)) == [(first.seq_id, 9)]  # the sibling waits for the prompt's blocks
    out = drive(s)
    assert shape(out) == [(first.seq_id, 1), (second.seq_id, 1)]  # 8 of its 9 tokens cached
    assert second.num_cached == 8
    assert second.block_table.blocks[:2] == first.block_table.blocks[:2]


def test_queue_bound(make_seq) -> None:
    s = scheduler(max_waiting=2)
    s.add([make_seq(3)])
    s.add([make_seq(3)])
    with pytest.raises(QueueFullError, match="holds 2 of 2"):
        s.add([make_seq(3)])
    assert len(s.waiting) == 2
    drive(s)  # both admitted: the queue has room again
    s.add([make_seq(3), make_seq(3)])
    with pytest.raises(QueueFullError):
        s.add([make_seq(3)])


def test_finish_frees_a_waiting_or_running_sequence(make_seq) -> None:
    s = scheduler()
    a, b = make_seq(5), make_seq(5)
    s.add([a])
    drive(s)
    s.add([b])
    s.finish(a)
    s.finish(b)
    assert not s.has_work
    s.blocks.check(idle=True)


def test_a_refused_admission_is_not_counted_as_a_cache_query(make_seq) -> None:
    """A request that waits for blocks is matched again every step; only the admission that
    succeeds is a prefix-cache query (else a busy server reports a made-up hit rate)."""
    s = scheduler(num_blocks=6)
    a = make_seq(9, max_tokens=12, first_token=3)  # 3 blocks, 6 when done
    s.add([a])
    drive(s)
    b = make_seq(17, max_tokens=1, first_token=3)  # shares a's 2 whole prompt blocks; needs 5
    s.add([b])
    refused = 0
    while b.status is Status.WAITING:
        drive(s)
        refused += 1
    assert refused > 1  # it really waited
    assert b.num_cached == 8
    assert (s.blocks.stats.queried_tokens, s.blocks.stats.hit_tokens) == (9 + 17, 8)


def test_refused_admissions_without_a_prefix_cache_count_nothing(make_seq) -> None:
    s = Scheduler(
        BlockManager(4, BS, enable_prefix_cache=False), max_batch=8, max_num_batched_tokens=64
    )
    a, b = make_seq(9, max_tokens=6), make_seq(9, max_tokens=1)
    s.add([a, b])
    while s.has_work:
        drive(s)
    assert (s.blocks.stats.queried_tokens, s.blocks.stats.hit_tokens) == (0, 0)
    assert a.finished and b.finished


def test_the_output_is_data_about_its_rows(make_seq) -> None:
    """Each row carries its sequence's id, the tokens computed this step, the position of the
    first and whether it samples: the runner needs no live sequence."""
    s = scheduler(max_num_batched_tokens=4)
    seq = make_seq(6, max_tokens=3)
    s.add([seq])
    first = drive(s)
    (row,) = first.scheduled
    assert (row.seq_id, row.chunk.token_ids, row.chunk.start_pos, row.samples) == (
        seq.seq_id,
        tuple(seq.prompt_ids[:4]),
        0,
        False,
    )
    assert row.chunk.block_table is seq.block_table
    second = drive(s)
    assert (second.scheduled[0].chunk.token_ids, second.scheduled[0].samples) == (
        tuple(seq.prompt_ids[4:]),
        True,
    )
    third = s.schedule()  # a decode: the token sampled last, at the next position
    assert third.scheduled[0].chunk.token_ids == (TOKEN,)
    assert third.scheduled[0].chunk.start_pos == 6 and third.is_decode_only


# -- drafts (speculation) --------------------------------------------------------------------------


def decoding(s: Scheduler, make_seq, count: int, max_tokens: int = 20) -> list[Sequence]:
    """`count` sequences past their 6-token prompts, each with one token sampled."""
    seqs = [make_seq(6, max_tokens=max_tokens) for _ in range(count)]
    s.add(seqs)
    while not all(seq.uncomputed == 1 for seq in seqs):
        drive(s)
    return seqs


def test_decoding_rows_take_their_drafts_within_the_budget(make_seq) -> None:
    asked: list[tuple[list[int], int]] = []

    def drafter(rows, budget):
        asked.append(([r.seq_id for r in rows], budget))
        if len(rows) < 2:  # one prompt still being computed
            return {}
        return {rows[0].seq_id: (5, 6, 7), rows[1].seq_id: (8, 9, 10, 11)}

    s = scheduler(max_num_batched_tokens=8, drafter=drafter)
    first, second = decoding(s, make_seq, 2)
    out = s.schedule()
    assert asked[-1] == ([first.seq_id, second.seq_id], 6)  # 8 - the two decode tokens
    assert [item.draft for item in out.scheduled] == [(5, 6, 7), (8, 9, 10)]  # cut to budget
    assert [item.chunk.token_ids for item in out.scheduled] == [(TOKEN, 5, 6, 7), (TOKEN, 8, 9, 10)]
    assert first.block_table.capacity >= first.num_computed + 4


def test_a_draft_never_preempts(make_seq) -> None:
    s = scheduler(num_blocks=3, drafter=lambda rows, budget: {rows[0].seq_id: (5,) * 8})
    decoding(s, make_seq, 1)  # 7 tokens in 2 blocks of 3; a draft of 8 would need 4
    before = s.blocks.num_in_use
    out = s.schedule()
    assert out.scheduled[0].draft == () and out.preempted == ()
    assert s.blocks.num_in_use == before
    s.commit(out)


def test_commit_counts_the_accepted_and_gives_back_the_rest(make_seq) -> None:
    s = scheduler(drafter=lambda rows, budget: {rows[0].seq_id: (5, 6, 7, 8, 9, 10)})
    (seq,) = decoding(s, make_seq, 1)  # 7 tokens: 6 computed, in 2 blocks
    out = s.schedule()
    assert len(seq.block_table.blocks) == 4  # 6 + 1 + 6 = 13 positions
    s.commit(out, {seq.seq_id: 2})  # 5 and 6 kept, 7 rejected
    assert seq.num_computed == 6 + 1 + 2
    assert len(seq.block_table.blocks) == 3  # room for the 10th token, the target's next
    s.blocks.check()


def test_rows_under_a_grammar_never_draft(make_seq) -> None:
    asked: list[list[int]] = []

    def drafter(rows, budget):
        asked.append([r.seq_id for r in rows])
        return {r.seq_id: (5,) for r in rows}

    s = scheduler(drafter=drafter)
    free, constrained = decoding(s, make_seq, 2)
    constrained.grammar = object()  # type: ignore[assignment]  # any matcher: never consulted
    out = s.schedule()
    assert asked[-1] == [free.seq_id]
    assert [item.draft for item in out.scheduled] == [(5,), ()]
    s.commit(out)

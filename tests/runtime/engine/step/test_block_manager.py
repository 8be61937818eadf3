"""BlockManager: the allocator plus a prefix cache over full blocks, on pools of a few blocks."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.core import BlockTable, OutOfBlocksError
from nanoserve.core.blocks import ConservationError
from nanoserve.core.state_checkpoints import CheckpointRule, StateCheckpoints
from nanoserve.core.state_slots import StateSlots, check_state_conservation
from nanoserve.runtime.engine.step.block_manager import BlockManager
from nanoserve.runtime.engine.step.kv_events import ROOT_KEY, block_key

BS = 4


def computed(manager: BlockManager, tokens: list[int]) -> BlockTable:
    """A sequence that matched what it could, got blocks for the rest, and computed it all."""
    cached = manager.match_prefix(tokens)
    num_cached = len(cached) * BS
    table = BlockTable(BS, cached)
    manager.grow(table, len(tokens))
    manager.count_admitted(len(tokens), num_cached)
    manager.cache_full_blocks(table, tokens, len(tokens))
    return table


def test_allocate_and_release_without_cache() -> None:
    manager = BlockManager(6, BS, enable_prefix_cache=False)
    table = BlockTable(BS)
    manager.grow(table, 9)
    assert table.blocks == [0, 1, 2]
    assert (manager.num_available, manager.num_in_use) == (3, 3)
    assert manager.usage() == 0.5
    manager.cache_full_blocks(table, list(range(9)), 9)  # off: names nothing
    assert manager.match_prefix(list(range(9))) == []
    assert manager.stats.queried_tokens == 0
    manager.release(table)
    assert table.blocks == []
    assert (manager.num_available, manager.num_in_use) == (6, 0)
    manager.check(idle=True)


def test_grow_adds_only_what_is_missing() -> None:
    manager = BlockManager(6, BS)
    table = BlockTable(BS)
    manager.grow(table, 4)
    assert table.blocks == [0]
    manager.grow(table, 4)
    assert table.blocks == [0]
    manager.grow(table, 5)
    assert table.blocks == [0, 1]
    manager.release(table)


def test_trim_gives_back_the_blocks_past_a_position() -> None:
    manager = BlockManager(6, BS)
    table = BlockTable(BS)
    manager.grow(table, 13)  # a verify row's 13 positions
    assert table.blocks == [0, 1, 2, 3]
    manager.cache_full_blocks(table, list(range(13)), 8)  # the first two are computed
    manager.trim(table, 9)  # 8 kept and the next token's slot
    assert table.blocks == [0, 1, 2]
    assert (manager.num_available, manager.num_in_use) == (3, 3)
    manager.trim(table, 9)
    assert table.blocks == [0, 1, 2]
    manager.release(table)
    assert manager.num_in_use == 0
    manager.check(idle=True)


def test_out_of_blocks_quotes_the_numbers() -> None:
    manager = BlockManager(2, BS)
    table = BlockTable(BS)
    manager.grow(table, 8)
    assert not manager.can_allocate(1)
    with pytest.raises(
        OutOfBlocksError, match="cannot get 1 blocks: 0 free, 0 evictable, 2 in all"
    ):
        manager.allocate(1)
    manager.release(table)
    assert manager.can_allocate(2)
    assert not manager.can_allocate(2, watermark=1)
    assert manager.can_allocate(1, watermark=1)


def test_prefix_match_is_full_blocks_only_and_never_the_last_tokens_block() -> None:
    manager = BlockManager(8, BS)
    first = computed(manager, list(range(10)))  # blocks 0, 1 full; 2 holds tokens 8-9
    assert first.blocks == [0, 1, 2]
    # The same 10 tokens: 2 full blocks match; the partial third never does.
    assert manager.match_prefix(list(range(10))) == [0, 1]
    # 8 tokens: both full blocks are cached, but block 1 holds the last token: only block 0.
    assert manager.match_prefix(list(range(8))) == [0]
    # 9 tokens: the last token is alone in a third block, so both full blocks match.
    assert manager.match_prefix(list(range(9))) == [0, 1]
    # A difference inside the second block stops the match at the first.
    assert manager.match_prefix([0, 1, 2, 3, 4, 5, 99, 7, 8]) == [0]
    # A difference in the first block matches nothing, even if the second block agrees.
    assert manager.match_prefix([9, 1, 2, 3, 4, 5, 6, 7, 8]) == []
    # One token, or a block's worth: nothing to share.
    assert manager.match_prefix([0]) == []
    assert manager.match_prefix([0, 1, 2, 3]) == []


def test_match_is_a_chain_not_a_bag_of_blocks() -> None:
    manager = BlockManager(8, BS)
    table = computed(manager, [1, 1, 1, 1, 2, 2, 2, 2, 0])
    # Block 1's tokens (2, 2, 2, 2) after a different first block are a different key.
    assert manager.match_prefix([2, 2, 2, 2, 2, 2, 2, 2, 0]) == []
    manager.release(table)


def test_matched_blocks_are_shared_with_reference_counts() -> None:
    manager = BlockManager(8, BS)
    tokens = list(range(9))
    first = computed(manager, tokens)
    shared = first.blocks[:2]
    ref = manager.allocator.ref_count
    assert [ref(b) for b in first.blocks] == [2, 2, 1]  # the cache holds the two full blocks
    second = computed(manager, tokens)
    assert second.blocks[:2] == shared
    assert second.blocks[2] not in first.blocks  # each computes its own last block
    assert [ref(b) for b in shared] == [3, 3]
    assert manager.num_in_use == 4
    manager.release(first)
    assert [ref(b) for b in shared] == [2, 2]
    manager.release(second)
    assert [ref(b) for b in shared] == [1, 1]  # the cache's own
    assert manager.num_in_use == 0
    assert manager.num_available == 8  # cached-only blocks are available
    manager.check(idle=True)


def test_cache_names_only_computed_blocks() -> None:
    manager = BlockManager(8, BS)
    tokens = list(range(12))
    table = BlockTable(BS)
    manager.grow(table, 12)
    manager.cache_full_blocks(table, tokens, 7)  # a chunk ending inside block 1: only block 0
    assert manager.match_prefix([*tokens, 50]) == [0]
    manager.cache_full_blocks(table, tokens, 12)
    assert manager.match_prefix([*tokens, 50]) == [0, 1, 2]
    manager.release(table)
    manager.release(BlockTable(BS, [0]))  # the two matches' references
    manager.release(BlockTable(BS, [0, 1, 2]))
    manager.check(idle=True)


def test_duplicate_content_is_cached_once() -> None:
    manager = BlockManager(8, BS)
    tokens = [7] * 8 + [1]
    a = BlockTable(BS)
    b = BlockTable(BS)
    manager.grow(a, 9)
    manager.grow(b, 9)  # both computed the same prompt without sharing (admitted together)
    manager.cache_full_blocks(a, tokens, 9)
    manager.cache_full_blocks(b, tokens, 9)
    cached = a.blocks[:2]
    assert manager.match_prefix(tokens) == cached
    ref = manager.allocator.ref_count
    assert [ref(x) for x in b.blocks] == [1, 1, 1]  # b's copies are not the cache's
    manager.release(a)
    manager.release(b)
    manager.release(BlockTable(BS, cached))
    assert manager.allocator.num_used == 2  # only the cached copies remain
    manager.check(idle=True)


def test_eviction_is_least_recently_released_first() -> None:
    manager = BlockManager(4, BS)
    a = computed(manager, [1, 1, 1, 1, 9])  # block 0 cached, block 1 not
    b = computed(manager, [2, 2, 2, 2, 9])  # block 2 cached, block 3 not
    manager.release(a)
    manager.release(b)
    assert manager.allocator.num_free == 2 and manager.num_available == 4
    # Two free blocks go first; the third allocation evicts a's block (released first).
    c = BlockTable(BS)
    manager.grow(c, 12)
    assert sorted(c.blocks) == [0, 1, 3]
    assert manager.match_prefix([1, 1, 1, 1, 9]) == []
    assert manager.match_prefix([2, 2, 2, 2, 9]) == [2]
    manager.release(c)
    manager.release(BlockTable(BS, [2]))
    manager.check(idle=True)


def test_a_hit_refreshes_recency() -> None:
    manager = BlockManager(4, BS)
    a = computed(manager, [1, 1, 1, 1, 9])
    b = computed(manager, [2, 2, 2, 2, 9])
    manager.release(a)
    manager.release(b)
    again = computed(manager, [1, 1, 1, 1, 8])  # a's block used again: now the most recent
    manager.release(again)
    c = BlockTable(BS)
    manager.grow(c, 12)  # must evict one cached block: b's, the least recently used
    assert manager.match_prefix([2, 2, 2, 2, 9]) == []
    assert manager.match_prefix([1, 1, 1, 1, 9]) == [0]
    manager.release(c)
    manager.release(BlockTable(BS, [0]))
    manager.check(idle=True)


def test_a_block_in_use_is_never_evicted() -> None:
    manager = BlockManager(3, BS)
    a = computed(manager, [1, 1, 1, 1, 9])  # blocks 0 (cached) and 1
    assert manager.num_available == 1
    with pytest.raises(OutOfBlocksError):
        manager.allocate(2)
    manager.release(a)


def test_evicted_block_reused_for_other_tokens_is_not_matched() -> None:
    manager = BlockManager(2, BS)
    a = computed(manager, [1, 1, 1, 1, 9])
    manager.release(a)
    b = computed(manager, [5, 5, 5, 5, 5, 5, 5, 6])  # needs both blocks: evicts a's
    assert manager.match_prefix([1, 1, 1, 1, 9]) == []
    assert b.blocks == [1, 0]  # the free block, then a's evicted one
    manager.release(b)
    assert manager.match_prefix([5, 5, 5, 5, 5, 5, 5, 6, 0]) == [1, 0]  # now b's tokens
    manager.release(BlockTable(BS, [1, 0]))
    manager.check(idle=True)


def test_hit_rate_counters() -> None:
    manager = BlockManager(16, BS)
    assert manager.stats.hit_rate == 0.0
    a = computed(manager, list(range(10)))  # queried 10, hit 0
    b = computed(manager, list(range(9)))  # queried 9, hit 8
    c = computed(manager, [*range(4), 40, 41, 42])  # queried 7, hit 4
    assert (manager.stats.queried_tokens, manager.stats.hit_tokens) == (26, 12)
    assert manager.stats.hit_rate == pytest.approx(12 / 26)
    for table in (a, b, c):
        manager.release(table)
    manager.check(idle=True)


def test_check_catches_a_held_block_when_idle() -> None:
    manager = BlockManager(4, BS)
    table = computed(manager, list(range(6)))
    manager.check()  # busy: fine
    with pytest.raises(ConservationError, match="idle, yet 2 blocks are held"):
        manager.check(idle=True)
    manager.release(table)
    manager.check(idle=True)


def test_check_catches_a_broken_free_list() -> None:
    manager = BlockManager(4, BS)
    manager.allocator._free.append(0)  # a double free the allocator did not see
    with pytest.raises(ConservationError):
        manager.check()


# -- a hybrid's state checkpoints ----------------------------------------------------------------


def with_checkpoints(num_blocks: int, capacity: int) -> tuple[BlockManager, StateSlots]:
    slots = StateSlots(2 + capacity)
    checkpoints = StateCheckpoints(slots, capacity, CheckpointRule(BS, 1))
    return BlockManager(num_blocks, BS, checkpoints=checkpoints), slots


def keys_of(tokens: list[int]) -> list[int]:
    keys, parent = [], ROOT_KEY
    for i in range(len(tokens) // BS):
        parent = block_key(parent, tuple(tokens[i * BS : (i + 1) * BS]))
        keys.append(parent)
    return keys


def test_a_match_ends_at_the_deepest_checkpoint() -> None:
    manager, slots = with_checkpoints(8, 4)
    tokens = list(range(13))
    table = computed(manager, tokens)  # blocks 0, 1, 2 named
    assert manager.match_prefix(tokens) == []  # no checkpoint: no hit
    keys = keys_of(tokens)
    saved = manager.checkpoint(keys[1])  # the state after 8 tokens
    assert saved is not None and slots.checkpoints == {saved}
    assert manager.checkpoint(keys[1]) is None  # saved once
    hit = manager.match_prefix(tokens)  # three blocks match, the checkpoint is at two
    assert hit == table.blocks[:2]
    assert manager.restore_slot(hit) == saved
    assert manager.restore_slot([]) is None
    manager.release(BlockTable(BS, hit))
    manager.release(table)
    manager.check(idle=True)


def test_an_unnamed_block_gets_no_checkpoint() -> None:
    manager, slots = with_checkpoints(8, 4)
    assert manager.checkpoint(keys_of([1, 2, 3, 4])[0]) is None
    assert slots.checkpoints == set()


def test_a_checkpoint_is_dropped_with_its_block() -> None:
    manager, slots = with_checkpoints(2, 4)
    a = computed(manager, [1, 1, 1, 1, 9])
    assert manager.checkpoint(keys_of([1, 1, 1, 1])[0]) is not None
    manager.release(a)
    b = computed(manager, [5, 5, 5, 5, 5, 5, 5, 6])  # needs both blocks: evicts a's
    assert slots.checkpoints == set()
    check_state_conservation(slots)
    manager.release(b)
    manager.check(idle=True)


def test_check_catches_a_checkpoint_that_outlived_its_block() -> None:
    manager, _ = with_checkpoints(4, 4)
    assert manager.checkpoints is not None
    manager.checkpoints.save(12345)  # saved behind the manager's back, under no named block
    with pytest.raises(ConservationError, match="1 of 1 state checkpoints outlived their blocks"):
        manager.check()


# -- conservation under random traffic -------------------------------------------------------------


def run_traffic(ops: list[tuple[int, int, int]], num_blocks: int) -> None:
    """Interpret ops against a model of what each block holds; check the books after each op.

    A sequence's tokens come from a 2-letter alphabet so prompts share prefixes often. The
    simulated pool records the tokens written into each slot; a block handed out by
    match_prefix must hold exactly the tokens it was matched for.
    """
    manager = BlockManager(num_blocks, BS)
    content: dict[int, list[int | None]] = {}
    live: list[tuple[BlockTable, list[int]]] = []
    for kind, a, b in ops:
        if kind == 0 or not live:  # a new sequence: match, then compute as much as fits
            tokens = [(a >> i) & 1 for i in range(1 + b % 13)]
            matched = manager.match_prefix(tokens)
            for i, block in enumerate(matched):
                assert content[block] == tokens[i * BS : (i + 1) * BS], "stale prefix block"
            table = BlockTable(BS, matched)
            needed = table.blocks_needed(len(tokens))
            if not manager.can_allocate(needed):
                manager.release(table)
            else:
                manager.grow(table, len(tokens))
                for pos in range(len(matched) * BS, len(tokens)):
                    block, offset = divmod(pos, BS)
                    if offset == 0:  # a fresh block: whatever it held before is overwritten
                        content[table.blocks[block]] = [None] * BS
                    content[table.blocks[block]][offset] = tokens[pos]
                manager.cache_full_blocks(table, tokens, len(tokens))
                live.append((table, tokens))
        elif kind == 1:  # a sequence finishes
            table, _ = live.pop(a % len(live))
            manager.release(table)
        else:  # a sequence decodes one more token
            table, tokens = live[a % len(live)]
            if table.blocks_needed(len(tokens) + 1) and not manager.can_allocate(1):
                continue
            manager.grow(table, len(tokens) + 1)
            block, offset = divmod(len(tokens), BS)
            if offset == 0:
                content[table.blocks[block]] = [None] * BS
            content[table.blocks[block]][offset] = b & 1
            tokens.append(b & 1)
            manager.cache_full_blocks(table, tokens, len(tokens))
        manager.check()
        held = {blk for table, _ in live for blk in table.blocks}
        assert manager.num_in_use == len(held)
        assert manager.num_available + manager.num_in_use == num_blocks
    for table, _ in live:
        manager.release(table)
    manager.check(idle=True)
    assert manager.num_in_use == 0
    assert manager.num_available == num_blocks


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 255), st.integers(0, 255)), max_size=60
    ),
    num_blocks=st.integers(1, 10),
)
def test_conservation_under_random_traffic(
    ops: list[tuple[int, int, int]], num_blocks: int
) -> None:
    run_traffic(ops, num_blocks)


def test_conservation_seeded_long_run() -> None:
    rng = random.Random(2024)
    ops = [
        (rng.choice((0, 0, 1, 2, 2, 2)), rng.randrange(256), rng.randrange(256))
        for _ in range(3000)
    ]
    run_traffic(ops, 12)

"""KV-cache events: block keys, the block manager's exact events on a pool of a few blocks,
and, on the tiny engine, that replaying every event rebuilds exactly the set of cached blocks
(prefix hits, preemption, eviction under pressure, a reset)."""

from __future__ import annotations

import hashlib
import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.core import BlockTable
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step.block_manager import BlockManager
from nanoserve.runtime.engine.step.kv_events import (
    ROOT_KEY,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventQueue,
    block_key,
)

BS = 2
REQUEST_IDS = itertools.count()


def documented_key(parent: int, token_ids: list[int]) -> int:
    """The README's definition, written from its words: BLAKE2b with an 8-byte digest over the
    parent's key (8 bytes, little-endian) and then each token id (4 bytes, little-endian),
    the digest read as a little-endian unsigned 64-bit int."""
    data = parent.to_bytes(8, "little") + b"".join(t.to_bytes(4, "little") for t in token_ids)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def test_block_key_is_a_fixed_64_bit_digest_of_parent_and_tokens() -> None:
    key = block_key(ROOT_KEY, [1, 2])
    assert key == documented_key(0, [1, 2])  # the same in every process and Python version
    assert block_key(key, [49151, 0, 7]) == documented_key(key, [49151, 0, 7])
    assert block_key(2**64 - 1, [2**32 - 1]) == documented_key(2**64 - 1, [2**32 - 1])
    assert 0 <= key < 2**64
    assert block_key(key, [1, 2]) != key != block_key(ROOT_KEY, [2, 1])


@given(st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**31), min_size=1, max_size=16))
def test_block_key_is_deterministic(parent: int, tokens: list[int]) -> None:
    assert block_key(parent, tokens) == block_key(parent, list(tokens))


def cached(manager: BlockManager, tokens: list[int]) -> BlockTable:
    table = BlockTable(BS, manager.match_prefix(tokens))
    manager.grow(table, len(tokens))
    manager.cache_full_blocks(table, tokens, len(tokens))
    return table


def test_the_events_of_store_dedupe_evict_and_reset() -> None:
    manager = BlockManager(4, BS)
    manager.events = []
    a = cached(manager, [1, 2, 3, 4, 5])  # two full blocks, one event
    k1 = block_key(ROOT_KEY, [1, 2])
    k2 = block_key(k1, [3, 4])
    assert manager.events == [BlockStored((k1, k2), None, (1, 2, 3, 4), BS)]
    manager.release(a)
    manager.events.clear()
    b = cached(manager, [1, 2, 3, 4, 9, 9, 7])  # two blocks from the cache, one new
    k3 = block_key(k2, [9, 9])
    assert manager.events == [BlockStored((k3,), k2, (9, 9), BS)]
    manager.release(b)
    manager.events.clear()
    c = cached(manager, [8, 8, 8, 8, 8])  # needs 3 blocks: evicts the two least recent
    k4 = block_key(ROOT_KEY, [8, 8])
    assert manager.events == [
        BlockRemoved((k1,)),
        BlockRemoved((k2,)),
        BlockStored((k4, block_key(k4, [8, 8])), None, (8, 8, 8, 8), BS),
    ]
    manager.events.clear()
    assert manager.reset_prefix_cache() == 3
    assert manager.events == [AllBlocksCleared()]
    assert manager.cached_keys() == frozenset()
    manager.release(c)
    manager.check(idle=True)
    assert manager.num_available == 4


def test_a_block_already_named_elsewhere_is_not_stored_again() -> None:
    manager = BlockManager(8, BS)
    manager.events = []
    # two tables computed side by side: the second's blocks have keys the cache already has
    first, second = BlockTable(BS), BlockTable(BS)
    manager.grow(first, 4)
    manager.grow(second, 4)
    manager.cache_full_blocks(first, [5, 6, 7, 8], 4)
    manager.cache_full_blocks(second, [5, 6, 7, 8], 4)
    assert len(manager.events) == 1 and len(manager.cached_keys()) == 2
    manager.release(first)
    manager.release(second)


def test_the_queue_never_blocks_and_counts_what_it_drops() -> None:
    queue = KVEventQueue(max_size=2)
    assert queue.offer([AllBlocksCleared()]) and queue.offer([AllBlocksCleared()])
    assert not queue.offer([BlockRemoved((1,)), BlockRemoved((2,))])
    assert (queue.offered_batches, queue.dropped_batches, queue.dropped_events) == (2, 1, 2)
    first = queue.get(0.0)
    assert first is not None and first.events == (AllBlocksCleared(),)
    assert queue.offer([BlockRemoved((3,))])
    # numbered when offered: the dropped batch (2) is a gap a subscriber can see
    assert [first.seq] + [b.seq for b in (queue.get(0.0), queue.get(0.0)) if b] == [0, 1, 3]


# -- on the tiny engine --------------------------------------------------------------------------


def replayed(events: list[KVEvent]) -> frozenset[int]:
    """The cached set a subscriber rebuilds from the stream."""
    held: set[int] = set()
    for event in events:
        if isinstance(event, BlockStored):
            assert len(event.token_ids) == len(event.block_hashes) * event.block_size
            held.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            held.difference_update(event.block_hashes)
        else:
            held.clear()
    return frozenset(held)


def run(engine, prompts: list[list[int]], max_tokens: int = 6) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{next(REQUEST_IDS)}", prompt, params)
        if i % 3 == 2:
            engine.step()  # some arrive mid-run
    engine.run_until_done()


def prompts(seed: int, count: int, shared: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 320) for _ in range(shared)]
    return [
        prefix + [rng.randrange(3, 320) for _ in range(rng.randint(1, 30))] for _ in range(count)
    ]


@pytest.fixture
def watched(make_tiny_engine):
    def build(**config):
        engine = make_tiny_engine(**config)
        events: list[KVEvent] = []
        engine.attach_kv_events(events.extend)
        return engine, events

    return build


@pytest.mark.usefixtures("single_torch_thread")
def test_a_workload_with_prefix_hits(watched) -> None:
    engine, events = watched()
    run(engine, prompts(0, 12, shared=20))
    assert engine.status().prefix_cache.hit_tokens > 0
    assert events[0] == AllBlocksCleared()
    assert replayed(events) == engine.blocks.cached_keys() != frozenset()


@pytest.mark.usefixtures("single_torch_thread")
def test_preemption_and_eviction_under_pressure(watched) -> None:
    engine, events = watched(num_blocks=20)  # 80 slots for 16 requests of up to 70 tokens
    preempted = []
    schedule = engine.scheduler.schedule

    def watching():
        out = schedule()
        preempted.extend(out.preempted)
        return out

    engine.scheduler.schedule = watching
    run(engine, prompts(1, 16, shared=8), max_tokens=30)
    assert preempted
    assert any(isinstance(e, BlockRemoved) for e in events)
    assert replayed(events) == engine.blocks.cached_keys()


@pytest.mark.usefixtures("single_torch_thread")
def test_a_reset_mid_run(watched) -> None:
    engine, events = watched()
    run(engine, prompts(2, 6, shared=12))
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    engine.add_request("late", prompts(3, 1, shared=12)[0], params)
    engine.step()
    assert engine.reset_prefix_cache() > 0  # while "late" runs: its blocks stay its own
    assert replayed(events) == frozenset() == engine.blocks.cached_keys()
    engine.run_until_done()
    run(engine, prompts(2, 3, shared=12))
    assert replayed(events) == engine.blocks.cached_keys() != frozenset()

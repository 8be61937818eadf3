"""KV-cache events: what the prefix cache holds, told as it changes, for a fleet's router.

The block manager records an event when it names a full block (`BlockStored`: its key, its
parent's, its tokens), when it evicts one (`BlockRemoved`) and when it forgets them all
(`AllBlocksCleared`); the engine hands each step's events, as one `KVEventBatch`, to a sink.
The sink here is a bounded queue that never blocks the step thread: a full queue drops the
batch and counts it. Whoever drains the queue (the API's ZMQ publisher) runs on its own thread.

A block's key is `block_key(parent key, its token ids)`: a 64-bit BLAKE2b digest of the parent's
key and the tokens, so it names the block's content and its whole prefix, and is the same in
every process and Python version (Python's own `hash` is neither promised). The root's parent
is 0. A router such as llm-d's indexer recomputes its own keys from `token_ids`; ours need only
be stable and unique, which 64 bits make so for any cache that fits in memory.
"""

from __future__ import annotations

import hashlib
import queue
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

ROOT_KEY = 0  # the parent of a sequence's first block


def block_key(parent: int, token_ids: Sequence[int]) -> int:
    """The key of a full block: its parent's key and its tokens, as an unsigned 64-bit int."""
    data = struct.pack(f"<Q{len(token_ids)}I", parent, *token_ids)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Consecutive full blocks of one sequence, now cached: block_hashes[i] holds
    token_ids[i * block_size:(i + 1) * block_size]; the first one's parent is
    parent_block_hash (None at the start of a sequence)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    seq: int  # numbered when offered, so a dropped batch is a gap subscribers can see
    ts: float  # wall-clock seconds, when the step that made them ended
    events: tuple[KVEvent, ...]


class KVEventQueue:
    """The step thread's sink: `offer` never blocks; past `max_size` batches it drops. Each
    batch takes the next sequence number when offered, dropped or not: a subscriber that sees
    a gap knows its copy of the cache is stale (and resyncs, as after AllBlocksCleared)."""

    def __init__(self, max_size: int) -> None:
        self._queue: queue.Queue[KVEventBatch] = queue.Queue(maxsize=max_size)
        self._lock = threading.Lock()
        self.next_seq = 0  # offer runs on the step thread alone
        self.offered_batches = 0
        self.dropped_batches = 0
        self.dropped_events = 0

    def offer(self, events: Sequence[KVEvent]) -> bool:
        batch = KVEventBatch(self.next_seq, time.time(), tuple(events))
        self.next_seq += 1
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            with self._lock:
                self.dropped_batches += 1
                self.dropped_events += len(batch.events)
            return False
        with self._lock:
            self.offered_batches += 1
        return True

    def get(self, timeout: float) -> KVEventBatch | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def qsize(self) -> int:
        return self._queue.qsize()

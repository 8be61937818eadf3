"""BlockManager: the allocator plus the prefix cache, a hash chain over full blocks.

A full block's key is block_key(parent key, its token ids) (kv_events.py), so a key names the
whole prefix up to that block. The cache holds one reference on every block it names; a block
whose only owner is the cache is evictable, least recently used first, and evicting it is what
frees it. With `events` on, every change to the set of named blocks is recorded as a KV event
(stored, removed, all cleared), so a router's replica of that set stays exact.

A hybrid model's cache also keeps `checkpoints`: recurrent states saved under the keys of the
blocks they end (core/state_checkpoints.py). Its prefixes match only as deep as the deepest
checkpoint, and a checkpoint goes with its block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nanoserve.core import BlockAllocator, BlockTable, OutOfBlocksError, check_conservation
from nanoserve.core.blocks import ConservationError
from nanoserve.core.state_checkpoints import StateCheckpoints
from nanoserve.runtime.engine.step.kv_events import (
    ROOT_KEY,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    block_key,
)


@dataclass(slots=True)
class PrefixCacheStats:
    queried_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_cache: bool = True,
        checkpoints: StateCheckpoints | None = None,
    ):
        self.allocator = BlockAllocator(num_blocks)
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        # A hybrid's saved states by block key; None: the model has no recurrent state
        self.checkpoints = checkpoints
        self._by_key: dict[int, int] = {}  # key -> block
        self._key_of: dict[int, int] = {}  # block -> key
        self._tokens_of: dict[
            int, tuple[int, ...]
        ] = {}  # block -> its tokens, to rule out collisions
        self._evictable: OrderedDict[int, None] = OrderedDict()  # LRU first
        self.stats = PrefixCacheStats()
        self.events: list[KVEvent] | None = None  # recorded here while on; None: off, no cost
        self.sink: Callable[[list[KVEvent]], object] | None = None  # where `publish` sends them

    def send_events(self, sink: Callable[[list[KVEvent]], object] | None) -> None:
        """From now on record every change as an event, for `publish` to hand to sink (which
        must not block: it runs on the step thread); None turns events off."""
        self.sink = sink
        self.events = None if sink is None else []

    def publish(self) -> None:
        """Hand the events recorded since the last publish to the sink."""
        if self.events and self.sink is not None:
            self.sink(list(self.events))
            self.events.clear()

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_available(self) -> int:
        """Blocks an allocation can get: free ones plus cached ones nobody else holds."""
        return self.allocator.num_free + len(self._evictable)

    @property
    def num_in_use(self) -> int:
        """Blocks held by sequences (not counting those held only by the cache)."""
        return self.num_blocks - self.num_available

    def usage(self) -> float:
        return self.num_in_use / self.num_blocks

    def can_allocate(self, count: int, watermark: int = 0) -> bool:
        return count + watermark <= self.num_available

    def allocate(self, count: int) -> list[int]:
        if count > self.num_available:
            raise OutOfBlocksError(
                f"cannot get {count} blocks: {self.allocator.num_free} free,"
                f" {len(self._evictable)} evictable, {self.num_blocks} in all"
            )
        while self.allocator.num_free < count:
            self._evict_one()
        return self.allocator.allocate(count)

    def grow(self, table: BlockTable, num_tokens: int) -> None:
        """Give table enough blocks for num_tokens positions."""
        needed = table.blocks_needed(num_tokens)
        if needed:
            table.blocks.extend(self.allocate(needed))

    def release(self, table: BlockTable) -> None:
        """Drop a sequence's references; cached blocks it leaves become evictable."""
        self._drop(table.blocks)
        table.blocks.clear()

    def trim(self, table: BlockTable, num_tokens: int) -> None:
        """Give back the blocks past the first num_tokens positions (a verify row's rejected
        draft tokens held them)."""
        keep = -(-num_tokens // table.block_size)
        if len(table.blocks) > keep:
            self._drop(table.blocks[keep:])
            del table.blocks[keep:]

    def _drop(self, blocks: list[int]) -> None:
        self.allocator.free(blocks)
        for block in blocks:
            if block in self._key_of and self.allocator.ref_count(block) == 1:
                self._evictable[block] = None
                self._evictable.move_to_end(block)

    # -- prefix cache ----------------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """Cached blocks for the longest prefix of whole blocks, each with a reference taken.

        The block holding the last token is never matched: that token must be computed to give
        logits, and its K/V must not be written into a block others share. With checkpoints,
        the match ends at the deepest block that has one (`restore_slot` names it).
        """
        if not self.enable_prefix_cache:
            return []
        bs = self.block_size
        matchable = (len(token_ids) - 1) // bs
        blocks: list[int] = []
        deepest = 0  # blocks up to the deepest checkpoint
        parent = ROOT_KEY
        for i in range(matchable):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            key = block_key(parent, tokens)
            block = self._by_key.get(key)
            if block is None or self._tokens_of[block] != tokens:
                break
            blocks.append(block)
            parent = key
            if self.checkpoints is not None and key in self.checkpoints:
                deepest = len(blocks)
        if self.checkpoints is not None:
            del blocks[deepest:]
        for block in blocks:
            self.allocator.fork(block)
            self._evictable.pop(block, None)
        return blocks

    def restore_slot(self, blocks: Sequence[int]) -> int | None:
        """The checkpoint slot holding the state at the end of matched `blocks` (None: no
        checkpoints, or no blocks)."""
        if self.checkpoints is None or not blocks:
            return None
        return self.checkpoints.use(self._key_of[blocks[-1]])

    def checkpoint(self, key: int) -> int | None:
        """A slot to save the state at the end of key's block into, if that block is named and
        has no checkpoint yet; else None."""
        if self.checkpoints is None or key not in self._by_key:
            return None
        return self.checkpoints.save(key)

    def count_admitted(self, num_tokens: int, num_cached: int) -> None:
        """A sequence of num_tokens was admitted with num_cached of them from the cache. Counted
        here, once, rather than in match_prefix: a sequence that matched but found no room is
        matched again next step, and counting each try would report a rate no request saw."""
        if self.enable_prefix_cache:
            self.stats.queried_tokens += num_tokens
            self.stats.hit_tokens += num_cached

    def cache_full_blocks(
        self,
        table: BlockTable,
        token_ids: Sequence[int],
        num_computed: int,
        hashes: list[int] | None = None,
    ) -> None:
        """Name every block whose positions are all computed, so later prompts can share it.

        `hashes`, if given, is the caller's list of the keys already computed for this table;
        hashing resumes after them and appends, so a step hashes only newly full blocks.
        """
        if not self.enable_prefix_cache:
            return
        bs = self.block_size
        done = len(hashes) if hashes is not None else 0
        parent = hashes[-1] if hashes else ROOT_KEY
        stored: list[tuple[int, int, tuple[int, ...]]] = []  # (parent, key, tokens) named now
        for i in range(done, num_computed // bs):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            key = block_key(parent, tokens)
            block = table.blocks[i]
            if block not in self._key_of and key not in self._by_key:
                self.allocator.fork(block)  # the cache's own reference
                self._by_key[key] = block
                self._key_of[block] = key
                self._tokens_of[block] = tokens
                stored.append((parent, key, tokens))
            if hashes is not None:
                hashes.append(key)
            parent = key
        if self.events is not None and stored:
            self._record_stored(stored)

    def _record_stored(self, stored: list[tuple[int, int, tuple[int, ...]]]) -> None:
        """One BlockStored per run of blocks that chain (each the next one's parent)."""
        assert self.events is not None
        run: list[tuple[int, int, tuple[int, ...]]] = []
        for item in stored:
            if run and item[0] != run[-1][1]:
                self.events.append(self._stored(run))
                run = []
            run.append(item)
        self.events.append(self._stored(run))

    def _stored(self, run: list[tuple[int, int, tuple[int, ...]]]) -> BlockStored:
        parent = run[0][0]
        return BlockStored(
            block_hashes=tuple(key for _, key, _ in run),
            parent_block_hash=None if parent == ROOT_KEY else parent,
            token_ids=tuple(t for _, _, tokens in run for t in tokens),
            block_size=self.block_size,
        )

    def cached_keys(self) -> frozenset[int]:
        """The keys of every named block: what the KV events say the cache holds."""
        return frozenset(self._by_key)

    def reset_prefix_cache(self) -> int:
        """Forget every named block (vLLM's reset_prefix_cache): blocks the cache alone held are
        freed; those sequences hold stay theirs, unnamed. Returns how many were named."""
        named = len(self._by_key)
        for block in list(self._key_of):
            self.allocator.free([block])  # the cache's reference
        self._by_key.clear()
        self._key_of.clear()
        self._tokens_of.clear()
        self._evictable.clear()
        if self.checkpoints is not None:
            self.checkpoints.clear()
        if self.events is not None:
            self.events.append(AllBlocksCleared())
        return named

    def _evict_one(self) -> None:
        block, _ = self._evictable.popitem(last=False)
        key = self._key_of.pop(block)
        del self._by_key[key]
        del self._tokens_of[block]
        self.allocator.free([block])
        if self.checkpoints is not None:
            self.checkpoints.drop(key)
        if self.events is not None:
            self.events.append(BlockRemoved((key,)))

    def check(self, *, idle: bool = False) -> None:
        """Conservation, every state checkpoint's block still named, and when idle: every used
        block is held by the cache alone."""
        check_conservation(self.allocator)
        for block in self._evictable:
            if self.allocator.ref_count(block) != 1:
                raise ConservationError(
                    f"evictable block {block} has {self.allocator.ref_count(block)} references"
                )
        if self.checkpoints is not None:
            stray = [key for key in self.checkpoints.saved() if key not in self._by_key]
            if stray:
                raise ConservationError(
                    f"{len(stray)} of {len(self.checkpoints)} state checkpoints outlived their"
                    f" blocks (keys {stray[:4]})"
                )
        if idle:
            held = self.allocator.num_used - len(self._evictable)
            if held:
                raise ConservationError(
                    f"idle, yet {held} blocks are held by sequences ({self.allocator.num_used}"
                    f" used, {len(self._evictable)} only by the prefix cache)"
                )

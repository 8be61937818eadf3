"""StateCheckpoints: recurrent states saved where cached prefixes end, so that a prefix-cache
hit on a hybrid model restores a state instead of recomputing the whole prefix.

Any sequence whose prompt starts with a K/V block's tokens can share that block. A recurrent
state is different: it sums every token before it, so it serves only at the exact position
where it was saved. A checkpoint is a copy of a sequence's state slot, taken when its computed
count lands on a block boundary and kept under that block's prefix-cache key.
`CheckpointRule` says where: every `interval_blocks` blocks, and at the last block boundary
before a prompt's final token (the deepest point a repeat of that prompt can match) when that
is at least one interval in (a shorter prompt costs little to recompute, and cutting it would
cost a step). A prompt's chunks are cut at those positions, so the state is there to be
copied.

A hit restores the deepest checkpoint within the matched blocks and recomputes the rest.
Checkpoint slots come out of the state pool's count (free + used + checkpoints == total).
When all `capacity` are held, the least recently used one is dropped, and a checkpoint goes
when its block is evicted (anchors: llama.cpp's `--ctx-checkpoints`, vLLM's prefix caching
for Mamba-style layers).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from nanoserve.core.errors import GeometryError
from nanoserve.core.state_slots import StateSlots

DEFAULT_INTERVAL_BLOCKS = 32  # 512 tokens at the default block size
BUDGET_SHARE = 8  # "auto" checkpoints take at most this fraction (1/8) of the K/V budget


@dataclass(frozen=True, slots=True)
class CheckpointRule:
    """Where a sequence's state is saved: positions counted in tokens computed."""

    block_size: int
    interval_blocks: int = DEFAULT_INTERVAL_BLOCKS

    def __post_init__(self) -> None:
        for name in ("block_size", "interval_blocks"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise GeometryError(f"{name} must be a positive integer, got {value!r}")

    @property
    def interval_tokens(self) -> int:
        return self.interval_blocks * self.block_size

    def prompt_end(self, num_tokens: int) -> int:
        """The last block boundary before a sequence's final token (what a repeat matches),
        where a state is saved if it is at least one interval in; else 0 (none)."""
        end = (num_tokens - 1) // self.block_size * self.block_size
        return end if end >= self.interval_tokens else 0

    def saves_at(self, position: int, num_tokens: int) -> bool:
        """Whether the state computed through `position` tokens of a sequence of num_tokens is
        saved."""
        if position <= 0 or position % self.block_size:
            return False
        return position % self.interval_tokens == 0 or position == self.prompt_end(num_tokens)

    def cut(self, start: int, num_new: int, num_tokens: int) -> int:
        """num_new, or fewer: a chunk from `start` stops at the first saving position after
        start."""
        every = self.interval_tokens
        stop = (start // every + 1) * every
        end = self.prompt_end(num_tokens)
        if start < end < stop:
            stop = end
        return min(num_new, stop - start)


def auto_checkpoints(max_batch: int, bytes_per_slot: int, budget_bytes: int) -> int:
    """ "auto": one checkpoint per running sequence, within an eighth of the K/V budget."""
    if bytes_per_slot <= 0:
        return 0
    return min(max_batch, budget_bytes // BUDGET_SHARE // bytes_per_slot)


class StateCheckpoints:
    """Saved states by prefix-cache key, at most `capacity`, least recently used first."""

    def __init__(self, slots: StateSlots, capacity: int, rule: CheckpointRule) -> None:
        if type(capacity) is not int or capacity < 0:
            raise GeometryError(f"capacity must be an integer >= 0, got {capacity!r}")
        self.slots = slots
        self.capacity = capacity
        self.rule = rule
        self._slot_of: OrderedDict[int, int] = OrderedDict()  # key -> slot

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, key: int) -> bool:
        return key in self._slot_of

    def saved(self) -> list[int]:
        """The keys that have a checkpoint, least recently used first."""
        return list(self._slot_of)

    def use(self, key: int) -> int:
        """key's slot, to restore from; it becomes the most recently used."""
        self._slot_of.move_to_end(key)
        return self._slot_of[key]

    def save(self, key: int) -> int | None:
        """A slot to copy the state at key's block into; None when key has one already (or
        there is no room for any). Past capacity, the least recently used one is dropped."""
        if key in self._slot_of or self.capacity == 0:
            return None
        if len(self._slot_of) >= self.capacity:
            self.drop(next(iter(self._slot_of)))
        slot = self._slot_of[key] = self.slots.keep()
        return slot

    def drop(self, key: int) -> None:
        """key's checkpoint goes (nothing, if it has none): its block was evicted."""
        slot = self._slot_of.pop(key, None)
        if slot is not None:
            self.slots.drop(slot)

    def clear(self) -> None:
        for key in list(self._slot_of):
            self.drop(key)

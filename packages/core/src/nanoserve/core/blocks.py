"""Blocks of K/V slots: a reference-counted allocator and a per-sequence block table."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import torch

from nanoserve.core.errors import GateError, GeometryError, NanoserveError, require_positive


class OutOfBlocksError(NanoserveError):
    """More blocks were asked for than are free."""


class ConservationError(GateError):
    """The allocator's books do not balance: free + used != total, or a block is both."""


class BlockAllocator:
    """Hands out block ids from a free list; a block returns to it when its last reference goes.

    Reference counts let several sequences share a block (a cached prompt prefix, or the
    prompt of `n` parallel samples): `fork` adds a reference, `free` drops one.
    """

    def __init__(self, num_blocks: int) -> None:
        require_positive(num_blocks=num_blocks)
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refs: list[int] = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def can_allocate(self, count: int) -> bool:
        return 0 <= count <= len(self._free)

    def allocate(self, count: int = 1) -> list[int]:
        if count < 0:
            raise GeometryError(f"cannot allocate {count} blocks")
        if not self.can_allocate(count):
            raise OutOfBlocksError(
                f"cannot get {count} free blocks: {self.num_free} of {self.num_blocks} free"
            )
        blocks = [self._free.popleft() for _ in range(count)]
        for block in blocks:
            self._refs[block] = 1
        return blocks

    def fork(self, block: int) -> int:
        """Add a reference to a used block, so that one more owner shares it."""
        self._check_used(block, "fork")
        self._refs[block] += 1
        return block

    def free(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            self._check_used(block, "free")
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)

    def ref_count(self, block: int) -> int:
        self._check_id(block)
        return self._refs[block]

    def _check_id(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise GeometryError(f"block {block} is outside 0..{self.num_blocks - 1}")

    def _check_used(self, block: int, verb: str) -> None:
        self._check_id(block)
        if self._refs[block] == 0:
            raise ConservationError(f"cannot {verb} block {block}: it is free")


def check_conservation(allocator: BlockAllocator) -> None:
    """free + used == total, and no block is both free and referenced."""
    free = set(allocator._free)
    if len(free) != allocator.num_free:
        raise ConservationError(
            f"free list holds {allocator.num_free} entries but {len(free)} distinct blocks"
        )
    used = {b for b, refs in enumerate(allocator._refs) if refs > 0}
    both = free & used
    if both:
        raise ConservationError(f"blocks {sorted(both)[:8]} are both free and used")
    if len(free) + len(used) != allocator.num_blocks:
        raise ConservationError(
            f"free {len(free)} + used {len(used)} != total {allocator.num_blocks}"
        )


class BlockTable:
    """One sequence's blocks, in order: position p lives in slot blocks[p // bs] * bs + p % bs."""

    def __init__(self, block_size: int, blocks: Iterable[int] = ()) -> None:
        require_positive(block_size=block_size)
        self.block_size = block_size
        self.blocks: list[int] = list(blocks)

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.block_size

    def blocks_needed(self, num_tokens: int) -> int:
        """How many more blocks this table needs to hold num_tokens positions."""
        needed = -(-num_tokens // self.block_size)
        return max(0, needed - len(self.blocks))

    def slot(self, position: int) -> int:
        if not 0 <= position < self.capacity:
            raise GeometryError(
                f"position {position} is outside this table's {self.capacity} slots"
            )
        block, offset = divmod(position, self.block_size)
        return self.blocks[block] * self.block_size + offset

    def slot_ids(self, num_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Slot ids of positions 0..num_tokens-1."""
        if not 0 <= num_tokens <= self.capacity:
            raise GeometryError(
                f"{num_tokens} tokens do not fit this table's {self.capacity} slots"
            )
        blocks = torch.tensor(self.blocks, dtype=torch.int64, device=device)  # [num_blocks]
        offsets = torch.arange(self.block_size, dtype=torch.int64, device=device)
        return (blocks[:, None] * self.block_size + offsets).reshape(-1)[:num_tokens]

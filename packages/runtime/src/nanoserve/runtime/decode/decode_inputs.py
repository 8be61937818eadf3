"""DecodeInputs: a decode step planned on the host and moved to the device in one copy.

A step's addressing is known on the host (positions, block tables and the last sampled token
all live in Python), so it is written there, into a staging vector that is pinned on CUDA, and
moved with one non-blocking copy into its device twin:

    [ input_ids | positions | write_slots | context_lens | state_slots | index x k | slot x k ]
      \\________________________ 5 x max_batch ________________________/   \\_ k new entries _/

The device twin's first 5 x max_batch entries *are* the persistent DecodeBuffers (views), so the
copy lands the plan where every recording reads it; the new slot-table entries (one per row per
step, a whole row when a sequence takes a row) are scattered into the table on the device.
Nothing in a step builds a device tensor from Python data, and nothing reads one back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nanoserve.core import DecodeBuffers, DecodePlan, DecodeSeq, Shape, SlotTable
from nanoserve.core.errors import GeometryError

NUM_VECTORS = 5  # input_ids, positions, write_slots, context_lens, state_slots (DecodeBuffers)


class DecodeInputs:
    """The slot table, the persistent buffers, and the host staging that feeds them."""

    def __init__(
        self,
        max_batch: int,
        max_model_len: int,
        sink_slot: int,
        device: torch.device,
        *,
        capacity: int | None = None,
        sink_state_slot: int = 0,
    ) -> None:
        self.max_batch = max_batch
        self.sink_slot = sink_slot
        self.sink_state_slot = sink_state_slot
        self.device = device
        self.table = SlotTable(max_batch, max_model_len, sink_slot, device)
        # New table entries one copy carries; a step with more (several long prompts joining
        # at once) takes one more copy per `capacity`.
        self.capacity = capacity or max(max_model_len, 8 * max_batch)
        size = NUM_VECTORS * max_batch + 2 * self.capacity
        self._pinned = device.type == "cuda" and torch.cuda.is_available()
        self._host = torch.zeros(size, dtype=torch.int64, pin_memory=self._pinned)  # [size]
        # Recorded after each copy out of the pinned staging and waited on before the staging
        # is rewritten: the copy is asynchronous, and nothing else says it has landed.
        self.copied = torch.cuda.Event() if self._pinned else None
        self._device = torch.zeros(size, dtype=torch.int64, device=device)  # [size]
        vectors = self._device[: NUM_VECTORS * max_batch].view(NUM_VECTORS, max_batch)
        self.buffers = DecodeBuffers(*vectors.unbind(0))
        self.num_copies = 0  # host -> device copies made, for the per-step count

    def storage_pointers(self) -> tuple[int, int]:
        """(host staging, device twin): what a transfer count recognises as each side."""
        return (self._host.untyped_storage().data_ptr(), self._device.untyped_storage().data_ptr())

    def load(self, seqs: Sequence[DecodeSeq], shape: Shape) -> DecodePlan:
        """Plan seqs (row i is seqs[i]) padded to shape, and move the plan to the device."""
        real = len(seqs)
        if not 0 < real <= shape.rows <= self.max_batch:
            raise GeometryError(
                f"{real} sequences do not fit a {shape} step of max_batch {self.max_batch}"
            )
        pad = self.max_batch - real
        stride = self.table.max_model_len  # a table row's length in the flat view
        staged = (
            [s.token_id for s in seqs]
            + [0] * pad
            + [s.position for s in seqs]
            + [0] * pad
            + [s.block_table.slot(s.position) for s in seqs]
            + [self.sink_slot] * pad
            + [s.position + 1 for s in seqs]
            + [0] * pad
            + [s.state_slot for s in seqs]
            + [self.sink_state_slot] * pad
        )
        index: list[int] = []
        slots: list[int] = []
        for row, seq in enumerate(seqs):
            num_tokens = seq.position + 1
            # What the table lacks, read without changing it: a bad position raises here,
            # before any row is marked written.
            held = self.table.written_len(row) if self.table.owner(row) == seq.seq_id else 0
            start = min(held, num_tokens)
            index.extend(range(row * stride + start, row * stride + num_tokens))
            slots.extend(seq.block_table.slot(p) for p in range(start, num_tokens))
        for row, seq in enumerate(seqs):
            self.table.claim(row, seq.seq_id, seq.position + 1)
        self._move(staged, index, slots)
        seq_ids = tuple(s.seq_id for s in seqs)
        views = {name: vector[: shape.rows] for name, vector in self._named_vectors()}
        return DecodePlan(
            seq_ids=seq_ids,
            pad_rows=shape.rows - real,
            slot_rect=self.table.read(seq_ids, shape.rows - real, shape.width),
            sink_slot=self.sink_slot,
            sink_state_slot=self.sink_state_slot,
            **views,
        )

    def _named_vectors(self) -> tuple[tuple[str, torch.Tensor], ...]:
        b = self.buffers
        return (
            ("input_ids", b.input_ids),
            ("positions", b.positions),
            ("write_slots", b.write_slots),
            ("context_lens", b.context_lens),
            ("state_slots", b.state_slots),
        )

    def _move(self, staged: list[int], index: list[int], slots: list[int]) -> None:
        """One host->device copy of the vectors and up to `capacity` table entries; then the
        entries scattered into the table on the device. On CUDA the copy is asynchronous: the
        staging is rewritten only once the event recorded after the last copy out of it has
        passed (at once in a steady decode, whose sampled ids came back since; an overflow
        chunk, when many long sequences take rows at once, waits for the chunk before it)."""
        head = len(staged)
        first = True
        for start in range(0, max(len(index), 1), self.capacity):
            if self.copied is not None:
                self.copied.synchronize()
            k = len(index[start : start + self.capacity])
            data = (staged if first else []) + index[start : start + k] + slots[start : start + k]
            offset = 0 if first else head
            end = offset + len(data)
            self._host[offset:end].copy_(torch.tensor(data, dtype=torch.int64))
            self._device[offset:end].copy_(self._host[offset:end], non_blocking=True)
            if self.copied is not None:
                self.copied.record(torch.cuda.current_stream(self.device))
            self.num_copies += 1
            if k:
                entries = self._device[head : head + 2 * k]
                self.table.tensor.view(-1).index_copy_(0, entries[:k], entries[k:])
            first = False

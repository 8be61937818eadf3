"""DecodePlan: one decode step as data — each row's token, position, write slot and addresses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nanoserve.core.blocks import BlockTable
from nanoserve.core.errors import GeometryError
from nanoserve.core.slot_table import SlotTable


@dataclass(frozen=True, slots=True)
class DecodeSeq:
    """One running sequence as the planner sees it: feed token_id at position, reading and
    writing its recurrent state in state_slot (a model without recurrent layers ignores it)."""

    seq_id: int
    token_id: int
    position: int
    block_table: BlockTable
    state_slot: int = 0


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """Row i < len(rows) is sequence rows[i]; the pad_rows rows after them are padding.

    A padded row has context_lens 0 (fully masked), writes its K/V to sink_slot and reads and
    writes the recurrent state of sink_state_slot. The context length counts the token being
    fed, so a real row's position is context_lens - 1.
    """

    seq_ids: tuple[int, ...]  # sequence ids of the real rows, in row order
    pad_rows: int
    input_ids: torch.Tensor  # [batch] int64
    positions: torch.Tensor  # [batch] int64
    write_slots: torch.Tensor  # [batch] int64: where each row's new K/V goes
    context_lens: torch.Tensor  # [batch] int64: 0 on a padded row
    state_slots: torch.Tensor  # [batch] int64: each row's recurrent-state slot
    slot_rect: torch.Tensor  # [batch, width] int64: slot id of each position of each row
    sink_slot: int
    sink_state_slot: int

    @property
    def num_rows(self) -> int:
        return len(self.seq_ids) + self.pad_rows

    @property
    def width(self) -> int:
        return int(self.slot_rect.shape[1])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.width)


def plan_decode(
    seqs: Sequence[DecodeSeq],
    *,
    sink_slot: int,
    sink_state_slot: int = 0,
    table: SlotTable | None = None,
    device: torch.device | str | None = None,
) -> DecodePlan:
    """Give each sequence a row. With a table, the rectangle is a window on it; else a new tensor."""
    if not seqs:
        raise GeometryError(
            "plan_decode needs at least one sequence (a warm batch uses padding_plan)"
        )
    if table is not None:
        device = table.device
        if len(seqs) > table.max_batch:
            raise GeometryError(f"{len(seqs)} rows exceed max_batch {table.max_batch}")
    context_lens = [s.position + 1 for s in seqs]
    width = max(context_lens)
    write_slots = [s.block_table.slot(s.position) for s in seqs]
    seq_ids = tuple(s.seq_id for s in seqs)
    if table is not None:
        for row, seq in enumerate(seqs):
            table.write_row(row, seq.seq_id, seq.block_table.slot_ids(seq.position + 1, device))
        rect = table.read(seq_ids, 0, width)
    else:
        rect = torch.full((len(seqs), width), sink_slot, dtype=torch.int64, device=device)
        for row, seq in enumerate(seqs):
            rect[row, : seq.position + 1] = seq.block_table.slot_ids(seq.position + 1, device)

    def vector(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return DecodePlan(
        seq_ids=seq_ids,
        pad_rows=0,
        input_ids=vector([s.token_id for s in seqs]),
        positions=vector([s.position for s in seqs]),
        write_slots=vector(write_slots),
        context_lens=vector(context_lens),
        state_slots=vector([s.state_slot for s in seqs]),
        slot_rect=rect,
        sink_slot=sink_slot,
        sink_state_slot=sink_state_slot,
    )


def pad_decode(
    plan: DecodePlan, num_rows: int, width: int, table: SlotTable | None = None
) -> DecodePlan:
    """The same plan padded to [num_rows, width]: padded rows read nothing and write the sink."""
    real = len(plan.seq_ids)
    if num_rows < plan.num_rows or width < plan.width:
        raise GeometryError(f"cannot pad a {plan.shape} plan down to {(num_rows, width)}")
    pad = num_rows - real
    if not plan.seq_ids and pad == 0:
        raise GeometryError("a plan with no rows must pad at least one row")
    device = plan.input_ids.device

    def padded(vector: torch.Tensor, fill: int) -> torch.Tensor:
        out = torch.full((num_rows,), fill, dtype=torch.int64, device=device)
        out[:real] = vector[:real]
        return out

    if table is not None:
        rect = table.read(plan.seq_ids, pad, width)
    else:
        rect = torch.full((num_rows, width), plan.sink_slot, dtype=torch.int64, device=device)
        rect[:real, : plan.width] = plan.slot_rect[:real]
    return DecodePlan(
        seq_ids=plan.seq_ids,
        pad_rows=pad,
        input_ids=padded(plan.input_ids, 0),
        positions=padded(plan.positions, 0),
        write_slots=padded(plan.write_slots, plan.sink_slot),
        context_lens=padded(plan.context_lens, 0),
        state_slots=padded(plan.state_slots, plan.sink_state_slot),
        slot_rect=rect,
        sink_slot=plan.sink_slot,
        sink_state_slot=plan.sink_state_slot,
    )


def padding_plan(
    num_rows: int, width: int, *, table: SlotTable, sink_state_slot: int = 0
) -> DecodePlan:
    """A step over no sequences: every row padding, every write to the sink, every length 0.

    The rectangle is still a window on the real table, so a recording made over this plan
    reads the storage that real steps write through.
    """
    empty = _no_rows(table.sink_slot, sink_state_slot, table.device)
    return pad_decode(empty, num_rows, width, table)


def padding_decode(
    num_rows: int, sink_slot: int, device: torch.device, sink_state_slot: int = 0
) -> DecodePlan:
    """`num_rows` padding rows on no table, each of length 0 and writing the sink: the step a
    boot times, on a scratch pool whose only slot a request never reads."""
    return pad_decode(_no_rows(sink_slot, sink_state_slot, device), num_rows, 1)


def _no_rows(sink_slot: int, sink_state_slot: int, device: torch.device) -> DecodePlan:
    def empty(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.int64, device=device)

    return DecodePlan(
        seq_ids=(),
        pad_rows=0,
        input_ids=empty(0),
        positions=empty(0),
        write_slots=empty(0),
        context_lens=empty(0),
        state_slots=empty(0),
        slot_rect=empty(0, 0),
        sink_slot=sink_slot,
        sink_state_slot=sink_state_slot,
    )

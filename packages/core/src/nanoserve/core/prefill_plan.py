"""PrefillPlan: chunks of prompts (and single decode tokens) flattened into one batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nanoserve.core.blocks import BlockTable
from nanoserve.core.errors import GeometryError


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """token_ids are the sequence's positions start_pos .. start_pos + len - 1; state_slot
    holds its recurrent state (a model without recurrent layers ignores it)."""

    seq_id: int
    token_ids: tuple[int, ...]
    start_pos: int
    block_table: BlockTable
    state_slot: int = 0


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    """Chunk i's tokens are input_ids[query_starts[i]:query_starts[i+1]].

    context_lens counts each sequence's cached prefix plus this chunk; its rectangle row holds
    the slots of all those positions (sink past the end), so attention sees prefix and chunk.
    """

    seq_ids: tuple[int, ...]  # sequence id of each chunk
    input_ids: torch.Tensor  # [tokens] int64
    positions: torch.Tensor  # [tokens] int64
    write_slots: torch.Tensor  # [tokens] int64
    query_starts: tuple[int, ...]  # len(rows) + 1 offsets into the flat batch
    context_lens: torch.Tensor  # [chunks] int64
    slot_rect: torch.Tensor  # [chunks, width] int64
    last_token_idx: torch.Tensor  # [chunks] int64: the flat index of each chunk's last token
    token_rows: torch.Tensor  # [tokens] int64: each token's chunk, its row of slot_rect
    token_context_lens: torch.Tensor  # [tokens] int64: slots each token sees, position + 1
    state_slots: torch.Tensor  # [chunks] int64: each chunk's recurrent-state slot
    sink_slot: int
    sink_state_slot: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def plan_prefill(
    chunks: Sequence[PrefillChunk],
    *,
    sink_slot: int,
    sink_state_slot: int = 0,
    device: torch.device | str | None = None,
) -> PrefillPlan:
    if not chunks:
        raise GeometryError("plan_prefill needs at least one chunk")
    input_ids: list[int] = []
    positions: list[int] = []
    write_slots: list[torch.Tensor] = []
    starts = [0]
    context_lens = []
    for chunk in chunks:
        if not chunk.token_ids:
            raise GeometryError(f"sequence {chunk.seq_id} has an empty chunk")
        if chunk.start_pos < 0:
            raise GeometryError(f"sequence {chunk.seq_id} starts at position {chunk.start_pos}")
        end = chunk.start_pos + len(chunk.token_ids)
        if end > chunk.block_table.capacity:
            raise GeometryError(
                f"sequence {chunk.seq_id} reaches position {end - 1};"
                f" its blocks hold {chunk.block_table.capacity}"
            )
        input_ids.extend(chunk.token_ids)
        positions.extend(range(chunk.start_pos, end))
        write_slots.append(chunk.block_table.slot_ids(end, device)[chunk.start_pos :])
        starts.append(starts[-1] + len(chunk.token_ids))
        context_lens.append(end)
    width = max(context_lens)
    rect = torch.full((len(chunks), width), sink_slot, dtype=torch.int64, device=device)
    for row, chunk in enumerate(chunks):
        rect[row, : context_lens[row]] = chunk.block_table.slot_ids(context_lens[row], device)
    return PrefillPlan(
        seq_ids=tuple(c.seq_id for c in chunks),
        input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        write_slots=torch.cat(write_slots),
        query_starts=tuple(starts),
        context_lens=torch.tensor(context_lens, dtype=torch.int64, device=device),
        slot_rect=rect,
        last_token_idx=torch.tensor([s - 1 for s in starts[1:]], dtype=torch.int64, device=device),
        token_rows=torch.tensor(
            [row for row, chunk in enumerate(chunks) for _ in chunk.token_ids],
            dtype=torch.int64,
            device=device,
        ),
        token_context_lens=torch.tensor(
            [p + 1 for p in positions], dtype=torch.int64, device=device
        ),
        state_slots=torch.tensor([c.state_slot for c in chunks], dtype=torch.int64, device=device),
        sink_slot=sink_slot,
        sink_state_slot=sink_state_slot,
    )


def last_tokens(plan: PrefillPlan) -> PrefillPlan:
    """Each chunk's last token alone, over the same rectangle: the queries of a forward's last
    layer, whose other rows nobody reads once their K/V is written (llama.cpp trims its last
    layer so too). A query stays the last of its chunk's context, so the causal mask and the
    visible slots are those it had in the whole plan."""
    rows = plan.last_token_idx  # [chunks]
    chunks = len(plan.query_starts) - 1  # not seq_ids: a boot timing's plan names no sequence
    return PrefillPlan(
        seq_ids=plan.seq_ids,
        input_ids=plan.input_ids[rows],
        positions=plan.positions[rows],
        write_slots=plan.write_slots[rows],
        query_starts=tuple(range(chunks + 1)),
        context_lens=plan.context_lens,
        slot_rect=plan.slot_rect,
        last_token_idx=torch.arange(chunks, dtype=torch.int64, device=rows.device),
        token_rows=plan.token_rows[rows],
        token_context_lens=plan.token_context_lens[rows],
        state_slots=plan.state_slots,
        sink_slot=plan.sink_slot,
        sink_state_slot=plan.sink_state_slot,
    )


def padding_prefill(
    num_tokens: int, sink_slot: int, device: torch.device, sink_state_slot: int = 0
) -> PrefillPlan:
    """One chunk of `num_tokens` tokens at positions 0.., every one writing and reading the
    sink (K/V and state): a prompt's arithmetic (attention over its own positions included) on
    no real slot, the chunk a boot times."""
    positions = torch.arange(num_tokens, dtype=torch.int64, device=device)
    return PrefillPlan(
        seq_ids=(),
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=positions,
        write_slots=torch.full((num_tokens,), sink_slot, dtype=torch.int64, device=device),
        query_starts=(0, num_tokens),
        context_lens=torch.tensor([num_tokens], dtype=torch.int64, device=device),
        slot_rect=torch.full((1, num_tokens), sink_slot, dtype=torch.int64, device=device),
        last_token_idx=torch.tensor([num_tokens - 1], dtype=torch.int64, device=device),
        token_rows=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        token_context_lens=positions + 1,
        state_slots=torch.tensor([sink_state_slot], dtype=torch.int64, device=device),
        sink_slot=sink_slot,
        sink_state_slot=sink_state_slot,
    )

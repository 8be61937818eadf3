"""LFM2's gated short convolution on the state pool: exact values on a tiny geometry, one
result however a prompt is cut into chunks and decode steps, and padding that reads and writes
only the sink."""

from __future__ import annotations

import torch

from nanoserve.core import (
    BlockTable,
    DecodeSeq,
    PrefillChunk,
    PrefillPlan,
    pad_decode,
    plan_decode,
    plan_prefill,
)
from nanoserve.runtime.model.short_conv import short_conv

HIDDEN, TAPS = 2, 3
SINK_SLOT = 64  # K/V: never read here
KERNEL = torch.tensor([[1.0, 2.0, 4.0], [0.5, 0.25, 0.125]])  # [hidden, taps]


def bcx_of(values: list[list[float]]) -> torch.Tensor:
    """[tokens, 3 * hidden] with B = 1 and C = 2, so C * conv(B * x) = 2 * conv(x)."""
    x = torch.tensor(values)
    return torch.cat((torch.ones_like(x), 2 * torch.ones_like(x), x), dim=1)


def state(slots: int = 3) -> torch.Tensor:
    return torch.zeros(slots + 1, HIDDEN, TAPS - 1)


def prefill(chunks: list[tuple[int, int, list[list[float]]]], sink_state: int) -> PrefillPlan:
    table = BlockTable(16, [0])
    return plan_prefill(
        [
            PrefillChunk(seq, tuple(range(len(x))), start, table, state_slot=slot)
            for seq, (slot, start, x) in enumerate(chunks)
        ],
        sink_slot=SINK_SLOT,
        sink_state_slot=sink_state,
    )


def test_a_prompt_gives_the_convolution_by_hand_and_leaves_its_last_inputs() -> None:
    x = [[1.0, 8.0], [2.0, 16.0], [3.0, 32.0]]
    pool = state()
    out = short_conv(bcx_of(x), prefill([(1, 0, x)], 3), pool, KERNEL, None)
    # channel 0: taps (1, 2, 4) over (0, 0, 1), (0, 1, 2), (1, 2, 3); channel 1 likewise
    assert out.tolist() == [
        [2 * 4.0, 2 * 1.0],
        [2 * (2 + 8.0), 2 * (2 + 2.0)],
        [2 * (1 + 4 + 12.0), 2 * (4 + 4 + 4.0)],
    ]
    assert pool[1].tolist() == [[2.0, 3.0], [16.0, 32.0]]  # the window: the last two inputs
    assert pool[[0, 2, 3]].abs().sum() == 0  # no other slot, the sink included


def test_with_a_bias_it_is_added_before_the_gate() -> None:
    x = [[1.0, 8.0]]
    out = short_conv(
        bcx_of(x),
        prefill([(0, 0, x)], 3),
        state(),
        KERNEL,
        torch.tensor([0.5, -1.0]),
    )
    assert out.tolist() == [[2 * (4.0 + 0.5), 2 * (1.0 - 1.0)]]


def test_chunks_and_decode_steps_give_the_same_bits_as_one_prompt() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(9, HIDDEN, generator=generator)
    kernel = torch.randn(HIDDEN, TAPS, generator=generator)
    whole = state()
    expected = short_conv(bcx_of(x.tolist()), prefill([(0, 0, x.tolist())], 3), whole, kernel, None)
    for cut in (1, 2, 4, 7):
        pool = state()
        pieces = [
            short_conv(
                bcx_of(x[:cut].tolist()), prefill([(0, 0, x[:cut].tolist())], 3), pool, kernel, None
            )
        ]
        for position in range(cut, 9):  # then one token at a time, as decode rows
            seq = DecodeSeq(0, 0, position, BlockTable(16, [0]), state_slot=0)
            plan = pad_decode(plan_decode([seq], sink_slot=SINK_SLOT, sink_state_slot=3), 4, 16)
            rows = torch.cat((x[position : position + 1], torch.zeros(3, HIDDEN)))
            pieces.append(short_conv(bcx_of(rows.tolist()), plan, pool, kernel, None)[:1])
        assert torch.equal(torch.cat(pieces), expected)
        assert torch.equal(pool[0], whole[0])


def test_a_batch_computes_each_row_as_alone() -> None:
    generator = torch.Generator().manual_seed(1)
    a, b = torch.randn(5, HIDDEN, generator=generator), torch.randn(3, HIDDEN, generator=generator)
    alone_a, alone_b = state(), state()
    out_a = short_conv(bcx_of(a.tolist()), prefill([(2, 0, a.tolist())], 3), alone_a, KERNEL, None)
    out_b = short_conv(bcx_of(b.tolist()), prefill([(0, 0, b.tolist())], 3), alone_b, KERNEL, None)
    both = state()
    plan = prefill([(2, 0, a.tolist()), (0, 0, b.tolist())], 3)
    out = short_conv(bcx_of(torch.cat((a, b)).tolist()), plan, both, KERNEL, None)
    assert torch.equal(out, torch.cat((out_a, out_b)))
    assert torch.equal(both[2], alone_a[2]) and torch.equal(both[0], alone_b[0])


def test_a_sequence_at_position_0_ignores_what_its_slot_held() -> None:
    """A slot is never cleared between sequences: position 0 reads an empty window."""
    x = [[1.0, 8.0], [2.0, 16.0]]
    clean = state()
    expected = short_conv(bcx_of(x), prefill([(1, 0, x)], 3), clean, KERNEL, None)
    stale = state()
    stale[1] = float("nan")  # whatever a finished sequence left
    got = short_conv(bcx_of(x), prefill([(1, 0, x)], 3), stale, KERNEL, None)
    assert torch.equal(got, expected) and torch.equal(stale[1], clean[1])


def test_padded_decode_rows_touch_only_the_sink_state() -> None:
    pool = torch.randn(4, HIDDEN, TAPS - 1, generator=torch.Generator().manual_seed(2))
    before = pool.clone()
    seq = DecodeSeq(0, 0, 4, BlockTable(16, [0]), state_slot=1)
    plan = pad_decode(plan_decode([seq], sink_slot=SINK_SLOT, sink_state_slot=3), 4, 8)
    short_conv(bcx_of([[1.0, 1.0]] * 4), plan, pool, KERNEL, None)
    assert torch.equal(pool[[0, 2]], before[[0, 2]])  # no other sequence's state
    assert not torch.equal(pool[1], before[1])  # the real row's window moved on
    assert pool[3].tolist() == [[0.0, 1.0], [0.0, 1.0]]  # padding: an empty window, then 1

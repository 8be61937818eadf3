"""Mamba2 on the state pool: the recurrence by hand on one number, the chunked (SSD) form
against the step taken token by token, a state that crosses any cut of a prompt, and padding
that reads and writes only the sink."""

from __future__ import annotations

import math

import pytest
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
from nanoserve.runtime.loading.recurrent_layers import Mamba2Layers
from nanoserve.runtime.model.mamba2 import BLOCK, Mamba2Weights, chunked, mamba2, step

SHAPE = Mamba2Layers(
    layers=(0,), kernel=3, heads=4, head_dim=4, groups=2, d_state=4, conv_bias=True, proj_bias=False
)
SINK_SLOT = 64  # K/V: never read here
SINK_STATE = 3


def weights(seed: int = 0) -> Mamba2Weights:
    generator = torch.Generator().manual_seed(seed)
    return Mamba2Weights(
        conv_kernel=torch.randn(SHAPE.conv_size, SHAPE.kernel, generator=generator),
        conv_bias=torch.randn(SHAPE.conv_size, generator=generator),
        decay_rate=-torch.rand(SHAPE.heads, generator=generator).exp(),
        dt_bias=torch.randn(SHAPE.heads, generator=generator),
        skip=torch.randn(SHAPE.heads, generator=generator),
        norm=torch.randn(SHAPE.inner_size, generator=generator),
        eps=1e-6,
    )


def pools() -> tuple[torch.Tensor, torch.Tensor]:
    window = torch.zeros(SINK_STATE + 1, SHAPE.conv_size, SHAPE.kernel - 1)
    return window, torch.zeros(SINK_STATE + 1, SHAPE.heads, SHAPE.head_dim, SHAPE.d_state)


def prefill(slot: int, start: int, tokens: int) -> PrefillPlan:
    chunk = PrefillChunk(0, tuple(range(tokens)), start, BlockTable(16, [0]), state_slot=slot)
    return plan_prefill([chunk], sink_slot=SINK_SLOT, sink_state_slot=SINK_STATE)


def test_two_steps_by_hand() -> None:
    """One head of one number, A = -ln 2: S = dt x b = 1 * 3 * 2 = 6, y = S c = 6; then with
    dt = 1 the state halves and takes 1 * 1 * 2: S = 5, y = 5."""
    one = torch.ones(1, 1, 1)
    rate = torch.tensor([-math.log(2.0)])
    s = torch.zeros(1, 1, 1, 1)
    y, s = step(3 * one, 2 * one, one, torch.ones(1, 1), rate, s)
    assert (y.item(), s.item()) == (6.0, 6.0)
    y, s = step(one, 2 * one, one, torch.ones(1, 1), rate, s)
    assert (y.item(), s.item()) == pytest.approx((5.0, 5.0), abs=1e-6)


def random_inputs(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    heads, head_dim, d_state = 2, 4, 8
    x = torch.randn(n, heads, head_dim, generator=generator)
    b = torch.randn(n, heads, d_state, generator=generator)
    c = torch.randn(n, heads, d_state, generator=generator)
    dt = torch.rand(n, heads, generator=generator)
    rate = -torch.rand(heads, generator=generator)
    s = torch.randn(heads, head_dim, d_state, generator=generator)
    return x, b, c, dt, rate, s


def test_the_chunked_form_is_the_step_taken_token_by_token() -> None:
    n = 2 * BLOCK + 22  # three blocks, the last one short
    x, b, c, dt, rate, s = random_inputs(n, seed=3)
    out, final = chunked(x, b, c, dt, rate, s)
    expected, state = [], s[None]
    for t in range(n):
        y, state = step(x[t : t + 1], b[t : t + 1], c[t : t + 1], dt[t : t + 1], rate, state)
        expected.append(y)
    torch.testing.assert_close(out, torch.cat(expected), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, state[0], rtol=1e-5, atol=1e-5)


def test_a_prompt_cut_anywhere_carries_its_state_across_the_cut() -> None:
    n = 100
    x, b, c, dt, rate, s = random_inputs(n, seed=4)
    whole, final = chunked(x, b, c, dt, rate, s)
    for cut in (1, 37, 64, 99):
        first, middle = chunked(x[:cut], b[:cut], c[:cut], dt[:cut], rate, s)
        rest, end = chunked(x[cut:], b[cut:], c[cut:], dt[cut:], rate, middle)
        torch.testing.assert_close(torch.cat((first, rest)), whole, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(end, final, rtol=1e-5, atol=1e-5)


def projected(tokens: int, seed: int) -> torch.Tensor:
    return torch.randn(tokens, SHAPE.in_size, generator=torch.Generator().manual_seed(seed))


def test_a_one_token_chunk_gives_a_decode_rows_bits() -> None:
    w, x = weights(), projected(5, seed=5)
    window, state = pools()
    mamba2(x[:4], prefill(1, 0, 4), window, state, w, SHAPE)  # the prompt
    window2, state2 = window.clone(), state.clone()
    as_chunk = mamba2(x[4:], prefill(1, 4, 1), window, state, w, SHAPE)
    seq = DecodeSeq(0, 0, 4, BlockTable(16, [0]), state_slot=1)
    plan = pad_decode(plan_decode([seq], sink_slot=SINK_SLOT, sink_state_slot=SINK_STATE), 4, 16)
    rows = torch.cat((x[4:], torch.zeros(3, SHAPE.in_size)))
    as_row = mamba2(rows, plan, window2, state2, w, SHAPE)[:1]
    assert torch.equal(as_chunk, as_row)
    assert torch.equal(state[1], state2[1]) and torch.equal(window[1], window2[1])


def test_a_sequence_at_position_0_ignores_what_its_slot_held() -> None:
    w, x = weights(), projected(6, seed=6)
    clean_window, clean_state = pools()
    expected = mamba2(x, prefill(2, 0, 6), clean_window, clean_state, w, SHAPE)
    window, state = pools()
    window[2], state[2] = float("nan"), float("nan")  # whatever a finished sequence left
    got = mamba2(x, prefill(2, 0, 6), window, state, w, SHAPE)
    assert torch.equal(got, expected) and torch.equal(state[2], clean_state[2])


def test_padded_decode_rows_touch_only_the_sink_state() -> None:
    generator = torch.Generator().manual_seed(7)
    window = torch.randn(SINK_STATE + 1, SHAPE.conv_size, SHAPE.kernel - 1, generator=generator)
    state = torch.randn(
        SINK_STATE + 1, SHAPE.heads, SHAPE.head_dim, SHAPE.d_state, generator=generator
    )
    before = window.clone(), state.clone()
    seq = DecodeSeq(0, 0, 4, BlockTable(16, [0]), state_slot=1)
    plan = pad_decode(plan_decode([seq], sink_slot=SINK_SLOT, sink_state_slot=SINK_STATE), 4, 8)
    mamba2(projected(4, seed=8), plan, window, state, weights(), SHAPE)
    for now, then in zip((window, state), before, strict=True):
        assert torch.equal(now[[0, 2]], then[[0, 2]])  # no other sequence's state
        assert not torch.equal(now[1], then[1])  # the real row's moved on

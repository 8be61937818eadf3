"""Gated DeltaNet on the state pool: the recurrence by hand on one number, the chunked form
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
from nanoserve.runtime.loading.recurrent_layers import DeltaNetLayers
from nanoserve.runtime.model.delta_net import BLOCK, DeltaNetWeights, chunked, delta_net, step

SHAPE = DeltaNetLayers(layers=(0,), kernel=3, k_heads=1, k_dim=4, v_heads=2, v_dim=4)
SINK_SLOT = 64  # K/V: never read here
SINK_STATE = 3


def weights(seed: int = 0) -> DeltaNetWeights:
    generator = torch.Generator().manual_seed(seed)
    return DeltaNetWeights(
        conv_kernel=torch.randn(SHAPE.conv_size, SHAPE.kernel, generator=generator),
        decay_rate=-torch.rand(SHAPE.v_heads, generator=generator).exp(),
        dt_bias=torch.randn(SHAPE.v_heads, generator=generator),
        norm=torch.randn(SHAPE.v_dim, generator=generator),
        eps=1e-6,
    )


def pools() -> tuple[torch.Tensor, torch.Tensor]:
    window = torch.zeros(SINK_STATE + 1, SHAPE.conv_size, SHAPE.kernel - 1)
    return window, torch.zeros(SINK_STATE + 1, SHAPE.v_heads, SHAPE.k_dim, SHAPE.v_dim)


def prefill(slot: int, start: int, tokens: int) -> PrefillPlan:
    chunk = PrefillChunk(0, tuple(range(tokens)), start, BlockTable(16, [0]), state_slot=slot)
    return plan_prefill([chunk], sink_slot=SINK_SLOT, sink_state_slot=SINK_STATE)


def test_two_steps_by_hand() -> None:
    """One head of one number: S = 0, then S = 3 (beta 1, no decay: S takes v), then decayed
    to 1.5 and moved halfway (beta 1/2) towards v = 1: S = 1.25; o = q S."""
    one = torch.ones(1, 1, 1)
    s = torch.zeros(1, 1, 1, 1)
    o, s = step(2 * one, one, 3 * one, torch.zeros(1, 1), torch.ones(1, 1), s)
    assert (o.item(), s.item()) == (6.0, 3.0)
    o, s = step(2 * one, one, one, torch.full((1, 1), math.log(0.5)), torch.full((1, 1), 0.5), s)
    assert (o.item(), s.item()) == pytest.approx((2.5, 1.25), abs=1e-6)


def random_inputs(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    heads, k_dim, v_dim = 2, 8, 4
    q = torch.nn.functional.normalize(torch.randn(n, heads, k_dim, generator=generator), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(n, heads, k_dim, generator=generator), dim=-1)
    v = torch.randn(n, heads, v_dim, generator=generator)
    g = -torch.rand(n, heads, generator=generator)
    beta = torch.rand(n, heads, generator=generator)
    s = torch.randn(heads, k_dim, v_dim, generator=generator)
    return q, k, v, g, beta, s


def test_the_chunked_form_is_the_step_taken_token_by_token() -> None:
    n = 2 * BLOCK + 22  # three blocks, the last one short
    q, k, v, g, beta, s = random_inputs(n, seed=3)
    out, final = chunked(q, k, v, g, beta, s)
    expected, state = [], s[None]
    for t in range(n):
        o, state = step(
            q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], state
        )
        expected.append(o)
    torch.testing.assert_close(out, torch.cat(expected), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, state[0], rtol=1e-5, atol=1e-5)


def test_a_prompt_cut_anywhere_carries_its_state_across_the_cut() -> None:
    n = 100
    q, k, v, g, beta, s = random_inputs(n, seed=4)
    whole, final = chunked(q, k, v, g, beta, s)
    for cut in (1, 37, 64, 99):
        first, middle = chunked(q[:cut], k[:cut], v[:cut], g[:cut], beta[:cut], s)
        rest, end = chunked(q[cut:], k[cut:], v[cut:], g[cut:], beta[cut:], middle)
        torch.testing.assert_close(torch.cat((first, rest)), whole, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(end, final, rtol=1e-5, atol=1e-5)


def projected(tokens: int, seed: int) -> torch.Tensor:
    return torch.randn(tokens, SHAPE.in_size, generator=torch.Generator().manual_seed(seed))


def test_a_one_token_chunk_gives_a_decode_rows_bits() -> None:
    """A decode row may ride in a prefill step (a chunk of one token) or a decode step: one
    result either way, so a row's tokens do not depend on which step carried it."""
    w, x = weights(), projected(5, seed=5)
    window, state = pools()
    delta_net(x[:4], prefill(1, 0, 4), window, state, w, SHAPE)  # the prompt
    window2, state2 = window.clone(), state.clone()
    as_chunk = delta_net(x[4:], prefill(1, 4, 1), window, state, w, SHAPE)
    seq = DecodeSeq(0, 0, 4, BlockTable(16, [0]), state_slot=1)
    plan = pad_decode(plan_decode([seq], sink_slot=SINK_SLOT, sink_state_slot=SINK_STATE), 4, 16)
    rows = torch.cat((x[4:], torch.zeros(3, SHAPE.in_size)))
    as_row = delta_net(rows, plan, window2, state2, w, SHAPE)[:1]
    assert torch.equal(as_chunk, as_row)
    assert torch.equal(state[1], state2[1]) and torch.equal(window[1], window2[1])


def test_a_sequence_at_position_0_ignores_what_its_slot_held() -> None:
    w, x = weights(), projected(6, seed=6)
    clean_window, clean_state = pools()
    expected = delta_net(x, prefill(2, 0, 6), clean_window, clean_state, w, SHAPE)
    window, state = pools()
    window[2], state[2] = float("nan"), float("nan")  # whatever a finished sequence left
    got = delta_net(x, prefill(2, 0, 6), window, state, w, SHAPE)
    assert torch.equal(got, expected) and torch.equal(state[2], clean_state[2])


def test_padded_decode_rows_touch_only_the_sink_state() -> None:
    generator = torch.Generator().manual_seed(7)
    window = torch.randn(SINK_STATE + 1, SHAPE.conv_size, SHAPE.kernel - 1, generator=generator)
    state = torch.randn(
        SINK_STATE + 1, SHAPE.v_heads, SHAPE.k_dim, SHAPE.v_dim, generator=generator
    )
    before = window.clone(), state.clone()
    seq = DecodeSeq(0, 0, 4, BlockTable(16, [0]), state_slot=1)
    plan = pad_decode(plan_decode([seq], sink_slot=SINK_SLOT, sink_state_slot=SINK_STATE), 4, 8)
    delta_net(projected(4, seed=8), plan, window, state, weights(), SHAPE)
    for now, then in zip((window, state), before, strict=True):
        assert torch.equal(now[[0, 2]], then[[0, 2]])  # no other sequence's state
        assert not torch.equal(now[1], then[1])  # the real row's moved on

"""Granite 4.0-H's Mamba2 layer over a flat batch: a selective state space whose state, per head
a [head_dim, d_state] matrix S, lives in the state pool beside the convolution's window.

Per token, after a causal convolution (with its bias, then SiLU) over x, B and C, with
dt = clamp(softplus(dt + dt_bias)) and A = -exp(A_log) per head, and B, C shared by the heads
of a group:

    S <- exp(dt * A) * S + dt * x B^T      (decay, then write)
    y  = S C + D * x

then y is gated by SiLU(z) and RMS-normalised per group of heads (norm after the gate).

A decode row takes one step. A prompt chunk takes the chunked form (SSD, the state-space dual):
within a block of `BLOCK` tokens the outputs are one masked, decayed attention-like product,
and the state crosses blocks and chunk boundaries whole. As in DeltaNet (delta_net.py), a chunk
of one token takes the decode step and every per-row transcendental runs on whole vectors, so
a row's bits do not depend on its batch; a row or chunk at position 0 starts from a zero state
and padding writes only the sink.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nanoserve.core import DecodePlan, PrefillPlan
from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.loading.recurrent_layers import Mamba2Layers
from nanoserve.runtime.model.recurrent_rows import (
    InPlaceStep,
    run_chunks,
    starting_state,
    whole_vectors,
)
from nanoserve.runtime.model.short_conv import causal_conv

BLOCK = 64  # tokens in one SSD block (the L matrix is BLOCK x BLOCK per head)


@dataclass(frozen=True, slots=True)
class Mamba2Weights:
    """One layer's tensors besides its linears (all float32)."""

    conv_kernel: torch.Tensor  # [conv channels, taps]
    conv_bias: torch.Tensor | None  # [conv channels]
    decay_rate: torch.Tensor  # [heads]: A = -exp(A_log)
    dt_bias: torch.Tensor  # [heads]
    skip: torch.Tensor  # [heads]: D
    norm: torch.Tensor  # [heads * head_dim]: the gated group norm's weight
    eps: float


def mamba2(
    projected: torch.Tensor,  # [tokens, in_size]: z, x, B, C, dt
    plan: DecodePlan | PrefillPlan,
    conv_state: torch.Tensor,  # [slots + 1, conv channels, taps - 1]
    state: torch.Tensor,  # [slots + 1, heads, head_dim, d_state]
    weights: Mamba2Weights,
    shape: Mamba2Layers,
    native: bool = False,
) -> torch.Tensor:
    """The gated, normalised output of every token, [tokens, heads * head_dim] float32 (what
    the output projection reads); each row's or chunk's state written to its slot. native:
    one-token rows take nanoserve's C++ steps, in place on the pool (CPU kernels)."""
    tokens, heads, group_size = projected.shape[0], shape.heads, shape.groups * shape.d_state
    z, xbc, dt = projected.float().split([shape.inner_size, shape.conv_size, heads], dim=1)
    xbc = causal_conv(xbc, plan, conv_state, weights.conv_kernel, weights.conv_bias, native)
    xbc = whole_vectors(F.silu, xbc)
    x, b, c = xbc.split([shape.inner_size, group_size, group_size], dim=1)
    x = x.reshape(tokens, heads, shape.head_dim)
    per_group = heads // shape.groups  # the heads that share one group's B and C
    b = b.reshape(tokens, shape.groups, shape.d_state).repeat_interleave(per_group, dim=1)
    c = c.reshape(tokens, shape.groups, shape.d_state).repeat_interleave(per_group, dim=1)
    dt = whole_vectors(F.softplus, dt + weights.dt_bias).clamp(shape.dt_min, shape.dt_max)
    rate = weights.decay_rate
    in_place = _in_place(state, rate) if native else None
    if isinstance(plan, DecodePlan) and in_place is not None:
        y = in_place(x, b, c, dt, plan.state_slots, plan.positions)
    elif isinstance(plan, DecodePlan):
        start = starting_state(state, plan.state_slots, plan.positions)
        y, final = step(x, b, c, dt, rate, start)
        state.index_copy_(0, plan.state_slots, final)
    else:
        y = run_chunks(
            (x, b, c, dt),
            plan,
            state,
            lambda x, b, c, dt, s: step(x, b, c, dt, rate, s),
            lambda x, b, c, dt, s: chunked(x, b, c, dt, rate, s),
            x,
            in_place,
        )
    y = (y + weights.skip[:, None] * x).reshape(tokens, shape.inner_size)
    gated = y * whole_vectors(F.silu, z)
    groups = gated.reshape(tokens, shape.groups, shape.inner_size // shape.groups)
    normed = groups / torch.sqrt(groups.pow(2).mean(-1, keepdim=True) + weights.eps)
    return normed.reshape(tokens, shape.inner_size) * weights.norm


def _in_place(state: torch.Tensor, decay_rate: torch.Tensor) -> InPlaceStep:
    """The C++ decode step on `state` (kernels/csrc/recurrent.h): each row's state updated in
    place in the pool, with no copy gathered or scattered."""

    def run(
        x: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        dt: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        decay = whole_vectors(torch.exp, dt * decay_rate)
        u = dt[..., None] * x
        args = (t.contiguous() for t in (u, b, c, decay))
        return kernel_ops.ssm_step(state, slots, positions, *args)

    return run


def step(
    x: torch.Tensor,  # [rows, heads, head_dim]
    b: torch.Tensor,  # [rows, heads, d_state]
    c: torch.Tensor,  # [rows, heads, d_state]
    dt: torch.Tensor,  # [rows, heads]
    decay_rate: torch.Tensor,  # [heads]
    s: torch.Tensor,  # [rows, heads, head_dim, d_state]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: (y [rows, heads, head_dim] before the skip, the new state)."""
    decay = whole_vectors(torch.exp, dt * decay_rate)  # [rows, heads]
    s = s * decay[..., None, None] + (dt[..., None] * x)[..., None] * b[:, :, None, :]
    return (s * c[:, :, None, :]).sum(-1), s


def chunked(
    x: torch.Tensor,  # [n, heads, head_dim]
    b: torch.Tensor,  # [n, heads, d_state]
    c: torch.Tensor,  # [n, heads, d_state]
    dt: torch.Tensor,  # [n, heads]
    decay_rate: torch.Tensor,  # [heads]
    s: torch.Tensor,  # [heads, head_dim, d_state]: the state before the first token
) -> tuple[torch.Tensor, torch.Tensor]:
    """n tokens of one sequence, BLOCK at a time: (y [n, heads, head_dim], the final state).

    Within a block (G the running sum of dt * A from the block's start, u_j = dt_j x_j):
        y_i = exp(G_i) S c_i + sum_{j<=i} exp(G_i - G_j) (c_i.b_j) u_j
        S'  = exp(G_last) S + sum_j exp(G_last - G_j) u_j b_j^T
    """
    u = (x * dt[..., None]).transpose(0, 1)  # [heads, n, head_dim]
    b, c = b.transpose(0, 1), c.transpose(0, 1)  # [heads, n, d_state]
    a = (dt * decay_rate).transpose(0, 1)  # [heads, n]
    n = u.shape[1]
    out = torch.empty_like(u)
    for lo in range(0, n, BLOCK):
        hi = min(lo + BLOCK, n)
        ub, bb, cb = u[:, lo:hi], b[:, lo:hi], c[:, lo:hi]
        cum = a[:, lo:hi].cumsum(-1)  # [heads, m]
        m = hi - lo
        future = torch.ones(m, m, dtype=torch.bool, device=u.device).triu(1)
        decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(future, float("-inf")).exp()
        scores = (cb @ bb.transpose(-1, -2)) * decay  # [heads, m, m], causal
        out[:, lo:hi] = (cb @ s.transpose(-1, -2)) * cum.exp()[..., None] + scores @ ub
        last = cum[:, -1:]  # [heads, 1]
        s = s * last.exp()[..., None] + (ub * (last - cum).exp()[..., None]).transpose(-1, -2) @ bb
    return out.transpose(0, 1), s

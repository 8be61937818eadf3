"""Qwen3.5's gated DeltaNet over a flat batch: linear attention whose state, per value head a
[k_dim, v_dim] matrix S, lives in the state pool beside the convolution's window.

Per token, after a causal convolution (and SiLU) over its q, k and v projections, with q and k
L2-normalised per head (q also scaled by k_dim ** -0.5), and per value head a decay
g = -exp(A_log) * softplus(a + dt_bias) and a rate beta = sigmoid(b):

    S <- exp(g) * S                        (forget)
    S <- S + k (beta * (v - k^T S))^T      (the delta rule: correct what S predicts for k)
    o  = q^T S

then o is RMS-normalised per head, scaled by its weight and gated by SiLU(z).

A decode row takes one step of that recurrence. A prompt chunk takes it in its chunked form
(the WY/UT form of DeltaNet, as `torch_chunk_gated_delta_rule` and the fla kernels): within a
block of `BLOCK` tokens the rule is solved as one triangular system, and the state crosses
blocks and chunk boundaries whole, so no loop runs over tokens. A chunk of one token (a decode
row in a mixed step) takes the decode step, so a row's bits do not depend on which kind of
step carried it: every transcendental of a row runs on whole vectors (recurrent_rows.py). A row
or chunk at position 0 starts from a zero state whatever its slot holds; a padded row (position
0, the sink slot) writes only the sink.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nanoserve.core import DecodePlan, PrefillPlan
from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.loading.recurrent_layers import DeltaNetLayers
from nanoserve.runtime.model.recurrent_rows import (
    InPlaceStep,
    run_chunks,
    starting_state,
    whole_vectors,
)
from nanoserve.runtime.model.short_conv import causal_conv

BLOCK = 64  # tokens solved at once in a chunk (the fla kernels' and transformers' block)
L2_EPS = 1e-6  # q and k are divided by sqrt(sum of squares + this), as the fla kernels do


@dataclass(frozen=True, slots=True)
class DeltaNetWeights:
    """One layer's tensors besides its linears (all float32)."""

    conv_kernel: torch.Tensor  # [conv channels, taps]
    decay_rate: torch.Tensor  # [v_heads]: -exp(A_log)
    dt_bias: torch.Tensor  # [v_heads]
    norm: torch.Tensor  # [v_dim]: the gated RMSNorm's weight (no offset)
    eps: float


def delta_net(
    projected: torch.Tensor,  # [tokens, in_size]: q, k, v, z, b, a
    plan: DecodePlan | PrefillPlan,
    conv_state: torch.Tensor,  # [slots + 1, conv channels, taps - 1]
    state: torch.Tensor,  # [slots + 1, v_heads, k_dim, v_dim]
    weights: DeltaNetWeights,
    shape: DeltaNetLayers,
    native: bool = False,
) -> torch.Tensor:
    """The gated, normalised output of every token, [tokens, v_heads * v_dim] float32 (what the
    output projection reads); each row's or chunk's state written to its slot. native: one-token
    rows take nanoserve's C++ step, in place on the pool (CPU kernels); else torch's."""
    tokens = projected.shape[0]
    mixed, z, b, a = projected.float().split(
        [shape.conv_size, shape.value_size, shape.v_heads, shape.v_heads], dim=1
    )
    mixed = causal_conv(mixed, plan, conv_state, weights.conv_kernel, None, native)
    mixed = whole_vectors(F.silu, mixed)
    q, k, v = mixed.split([shape.key_size, shape.key_size, shape.value_size], dim=1)
    repeat = shape.v_heads // shape.k_heads  # each key head serves this many value heads
    q = _l2_normalise(q.reshape(tokens, shape.k_heads, shape.k_dim)) * shape.k_dim**-0.5
    k = _l2_normalise(k.reshape(tokens, shape.k_heads, shape.k_dim))
    if shape.tiled:  # value head h reads key head h mod k_heads (llama.cpp's order)
        q, k = q.repeat(1, repeat, 1), k.repeat(1, repeat, 1)
    else:  # value head h reads key head h // repeat (the checkpoint's order)
        q, k = q.repeat_interleave(repeat, dim=1), k.repeat_interleave(repeat, dim=1)
    v = v.reshape(tokens, shape.v_heads, shape.v_dim)
    beta = whole_vectors(torch.sigmoid, b)  # [tokens, v_heads]
    g = weights.decay_rate * whole_vectors(F.softplus, a + weights.dt_bias)  # <= 0
    in_place = _in_place(state) if native else None
    if isinstance(plan, DecodePlan) and in_place is not None:
        out = in_place(q, k, v, g, beta, plan.state_slots, plan.positions)
    elif isinstance(plan, DecodePlan):
        start = starting_state(state, plan.state_slots, plan.positions)
        out, final = step(q, k, v, g, beta, start)
        state.index_copy_(0, plan.state_slots, final)
    else:
        out = run_chunks((q, k, v, g, beta), plan, state, step, chunked, v, in_place)
    normed = out / torch.sqrt(out.pow(2).mean(-1, keepdim=True) + weights.eps) * weights.norm
    gated = normed.reshape(tokens, shape.value_size) * whole_vectors(F.silu, z)
    return gated


def _in_place(state: torch.Tensor) -> InPlaceStep:
    """The C++ decode step on `state` (kernels/csrc/recurrent.h): each row's state read once
    and updated in place in the pool, with no copy gathered or scattered."""

    def run(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        decay = whole_vectors(torch.exp, g)
        args = (x.contiguous() for x in (q, k, v, decay, beta))
        return kernel_ops.delta_net_step(state, slots, positions, *args)

    return run


def _l2_normalise(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def step(
    q: torch.Tensor,  # [rows, v_heads, k_dim]
    k: torch.Tensor,  # [rows, v_heads, k_dim]
    v: torch.Tensor,  # [rows, v_heads, v_dim]
    g: torch.Tensor,  # [rows, v_heads]
    beta: torch.Tensor,  # [rows, v_heads]
    s: torch.Tensor,  # [rows, v_heads, k_dim, v_dim], contiguous: updated in place
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence per row: (o [rows, v_heads, v_dim], the new state, which is
    `s` itself, updated in place: callers pass a copy gathered from the pool).

    The state is the big operand ([rows, v_heads, k_dim, v_dim] float32, 1 MiB a head at
    Qwen3.5's 128 x 128), so it is read once for both of its products and then updated in
    place, never copied: with d = exp(g), S' = d S + k delta^T, so k^T (d S) = d (S^T k) and
    o = S'^T q = d (S^T q) + delta (k . q)."""
    rows, heads, k_dim, v_dim = s.shape
    flat = s.view(rows * heads, k_dim, v_dim)
    d = whole_vectors(torch.exp, g).reshape(-1, 1)  # [rows * heads, 1]
    both = torch.stack((k, q), 2).reshape(-1, 2, k_dim)  # [rows * heads, 2, k_dim]
    reads = torch.bmm(both, flat)  # k^T S and q^T S: [rows * heads, 2, v_dim]
    delta = (v.reshape(-1, v_dim) - reads[:, 0] * d) * beta.reshape(-1, 1)
    out = reads[:, 1] * d + delta * (k * q).sum(-1).reshape(-1, 1)
    flat.mul_(d[..., None]).baddbmm_(k.reshape(-1, k_dim, 1), delta[:, None, :])
    return out.reshape(rows, heads, v_dim), s


def chunked(
    q: torch.Tensor,  # [n, v_heads, k_dim]
    k: torch.Tensor,  # [n, v_heads, k_dim]
    v: torch.Tensor,  # [n, v_heads, v_dim]
    g: torch.Tensor,  # [n, v_heads]
    beta: torch.Tensor,  # [n, v_heads]
    s: torch.Tensor,  # [v_heads, k_dim, v_dim]: the state before the first token
) -> tuple[torch.Tensor, torch.Tensor]:
    """n tokens of one sequence, BLOCK at a time: (o [n, v_heads, v_dim], the final state).

    Within a block (positions i, j; G the running sum of g from the block's start), the delta
    rule's writes u solve a unit lower-triangular system
        (I + tril(beta_i k_i.k_j exp(G_i - G_j), -1)) u = beta (v - exp(G) k^T S)
    and the outputs and the state at the block's end follow by matmuls:
        o_i = exp(G_i) q_i^T S + sum_{j<=i} exp(G_i - G_j) (q_i.k_j) u_j
        S'  = exp(G_last) S + sum_j exp(G_last - G_j) k_j u_j^T
    """
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # [v_heads, n, dim]
    g, beta = g.transpose(0, 1), beta.transpose(0, 1)  # [v_heads, n]
    n = q.shape[1]
    out = torch.empty_like(v)
    for lo in range(0, n, BLOCK):
        hi = min(lo + BLOCK, n)
        qb, kb, vb, bb = q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], beta[:, lo:hi]
        cum = g[:, lo:hi].cumsum(-1)  # [v_heads, m]
        m = hi - lo
        future = torch.ones(m, m, dtype=torch.bool, device=q.device).triu(1)
        decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(future, float("-inf")).exp()
        k_beta = kb * bb[..., None]
        system = (k_beta @ kb.transpose(-1, -2)) * decay  # its strict lower part is used
        u = torch.linalg.solve_triangular(
            system, vb * bb[..., None], upper=False, unitriangular=True
        )
        w = torch.linalg.solve_triangular(
            system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True
        )
        u = u - w @ s  # the writes, less what the state before the block already predicts
        scores = (qb @ kb.transpose(-1, -2)) * decay  # causal within the block
        out[:, lo:hi] = (qb * cum.exp()[..., None]) @ s + scores @ u
        last = cum[:, -1:]  # [v_heads, 1]
        s = s * last.exp()[..., None] + (kb * (last - cum).exp()[..., None]).transpose(-1, -2) @ u
    return out.transpose(0, 1), s

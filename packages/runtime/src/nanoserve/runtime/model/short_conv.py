"""A causal depthwise convolution over a flat batch, carrying each sequence's window of past
inputs in the state pool; and LFM2's gated short convolution made of it.

Each channel is convolved along time with its own kernel of `taps` taps:

    y_t = bias + sum_k kernel[:, k] * u_{t - taps + 1 + k}

LFM2's layer projects its input to B, C and x per token, convolves u = B*x and gates the result
by C; Qwen3.5's DeltaNet convolves its q, k and v projections (then SiLU). The state of a
sequence is its last `taps - 1` inputs u per channel. A decode row extends
its window by one token; a prompt chunk by its whole length at once (one gather, no loop over
tokens); either way the window ending the row or chunk is written back to the row's state
slot. A row at position 0 starts from an empty window whatever its slot holds, so a slot
needs no clearing between sequences, and a padded row (position 0, the sink slot) reads
nothing and writes only the sink.

The taps are summed in one fixed order, elementwise: a row's bits do not depend on its batch,
its bucket or the CPU's vector width (no reduction runs across lanes).
"""

from __future__ import annotations

import torch

from nanoserve.core import DecodePlan, PrefillPlan
from nanoserve.runtime.kernels import kernel_ops


def short_conv(
    bcx: torch.Tensor,  # [tokens, 3 * hidden]: B, C, x
    plan: DecodePlan | PrefillPlan,
    state: torch.Tensor,  # [state slots + 1, hidden, taps - 1] float32
    kernel: torch.Tensor,  # [hidden, taps] float32
    bias: torch.Tensor | None,  # [hidden] float32
    native: bool = False,
) -> torch.Tensor:
    """LFM2's C * conv(B * x), [tokens, hidden] float32; each row's window written to its slot.
    native: a decode step runs nanoserve's C++ step, in place on the pool."""
    b, c, x = bcx.float().split(kernel.shape[0], dim=1)
    return c * causal_conv(b * x, plan, state, kernel, bias, native)


def causal_conv(
    bx: torch.Tensor,  # [tokens, channels] float32: the inputs u
    plan: DecodePlan | PrefillPlan,
    state: torch.Tensor,  # [state slots + 1, channels, taps - 1] float32
    kernel: torch.Tensor,  # [channels, taps] float32
    bias: torch.Tensor | None,  # [channels] float32
    native: bool = False,
) -> torch.Tensor:
    """conv(u), [tokens, channels] float32; each row's (or chunk's) window written to its slot.
    native: a decode step runs nanoserve's C++ step (kernels/csrc/recurrent.h), each window
    read and shifted in place, its products and sums in this function's order (so its bits
    are a one-token prompt chunk's)."""
    taps = kernel.shape[1]
    if isinstance(plan, DecodePlan) and native:
        return kernel_ops.conv_step(state, plan.state_slots, plan.positions, bx, kernel, bias)
    if isinstance(plan, DecodePlan):
        windows = _decode_windows(bx, plan, state)  # [rows, taps, channels]
        last = windows[:, 1:]  # [rows, taps - 1, channels]
    else:
        windows, last = _prefill_windows(bx, plan, state, taps)
    state.index_copy_(0, plan.state_slots, last.transpose(1, 2))
    out = windows[:, 0] * kernel[:, 0]
    for k in range(1, taps):
        out = out + windows[:, k] * kernel[:, k]
    if bias is not None:
        out = out + bias
    return out


def _past(state: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """The stored windows of `slots`, [n, taps - 1, channels]; empty (zeros) where the row or
    chunk starts a sequence (position 0)."""
    past = state[slots].transpose(1, 2)  # [n, taps - 1, channels]
    return torch.where((starts > 0)[:, None, None], past, 0.0)


def _decode_windows(bx: torch.Tensor, plan: DecodePlan, state: torch.Tensor) -> torch.Tensor:
    """Each row's window: its past inputs, then this token's. [rows, taps, channels]."""
    past = _past(state, plan.state_slots, plan.positions)
    return torch.cat((past, bx[:, None, :]), dim=1)


def _prefill_windows(
    bx: torch.Tensor, plan: PrefillPlan, state: torch.Tensor, taps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's window ([tokens, taps, channels]) and each chunk's last one, what its state
    slot keeps ([chunks, taps - 1, channels]). Every chunk's past is laid before its tokens in one
    tensor, so a token's window is `taps` consecutive rows of it."""
    starts = plan.query_starts
    first = torch.tensor(starts[:-1], dtype=torch.int64, device=bx.device)
    past = _past(state, plan.state_slots, plan.positions[first])  # [chunks, taps - 1, channels]
    keep = taps - 1
    pieces = []
    for chunk in range(len(starts) - 1):
        pieces += [past[chunk], bx[starts[chunk] : starts[chunk + 1]]]
    laid = torch.cat(pieces)  # [tokens + chunks * (taps - 1), channels]
    # A token's own row in `laid` is its flat index plus the pasts laid before it (one per
    # chunk up to and including its own); its window is the `taps` rows ending there.
    chunk_of = plan.token_rows  # [tokens]
    own = torch.arange(bx.shape[0], device=bx.device) + (chunk_of + 1) * keep
    rows = own[:, None] + torch.arange(-keep, 1, device=bx.device)  # [tokens, taps]
    ends = torch.tensor(starts[1:], dtype=torch.int64, device=bx.device)
    ends = ends + torch.arange(1, len(starts), device=bx.device) * keep  # one past each chunk
    last_rows = ends[:, None] + torch.arange(-keep, 0, device=bx.device)  # [chunks, taps - 1]
    return laid[rows], laid[last_rows]

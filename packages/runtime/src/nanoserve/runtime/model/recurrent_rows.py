"""What every recurrent layer (DeltaNet, Mamba2) does to its rows the same way: the state a row
or chunk starts from, and elementwise transcendentals whose bits do not depend on the batch.

A row or chunk at position 0 starts its sequence: it reads a zero state whatever its slot held,
so a slot needs no clearing between sequences and a padded row (position 0, the sink slot)
reads nothing.

torch's CPU loops take float32 in pairs of vectors (32 lanes on AVX-512, 16 on AVX2) and finish
a tail in scalar code whose exp, sigmoid and softplus round otherwise. A per-head quantity of a
few heads per row ([rows, heads]) would land in that tail or not depending on how many rows
came with it; padded to whole vector pairs per row, it never does. Norms divide by a square
root (exact in every lane) rather than multiply by torch's approximate `rsqrt` for the same
reason.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LANES = 32  # float32 lanes of two AVX-512 vectors (a multiple of AVX2's pair)


def starting_state(
    state: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """The stored states of `slots` ([n, ...]); zero where the row or chunk starts its sequence."""
    started = (positions > 0).reshape(-1, *([1] * (state.dim() - 1)))
    return torch.where(started, state[slots], 0.0)


def whole_vectors(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) of a [rows, width] tensor with each row padded to whole vector pairs: a row's bits
    do not depend on how many rows came with it."""
    pad = -x.shape[-1] % LANES
    return fn(F.pad(x, (0, pad)))[..., : x.shape[-1]] if pad else fn(x)

"""What every recurrent layer (DeltaNet, Mamba2) does to its rows the same way: the state a row
or chunk starts from, a prompt step's chunks run from their states, and elementwise
transcendentals whose bits do not depend on the batch.

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

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from nanoserve.core import PrefillPlan

# (inputs..., states) -> (outputs, states): one token per row, or one chunk of one sequence
Recurrence = Callable[..., tuple[torch.Tensor, torch.Tensor]]
# (inputs..., slots, positions) -> outputs: one token per row, each row's state updated in
# place in the pool (a C++ decode step)
InPlaceStep = Callable[..., torch.Tensor]

LANES = 32  # float32 lanes of two AVX-512 vectors (a multiple of AVX2's pair)


def starting_state(
    state: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """The stored states of `slots` ([n, ...], a copy); zero where the row or chunk starts its
    sequence (whatever the slot held, NaN included)."""
    fresh = (positions == 0).reshape(-1, *([1] * (state.dim() - 1)))
    return state[slots].masked_fill_(fresh, 0.0)


def whole_vectors(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) of a [rows, width] tensor with each row padded to whole vector pairs: a row's bits
    do not depend on how many rows came with it."""
    pad = -x.shape[-1] % LANES
    return fn(F.pad(x, (0, pad)))[..., : x.shape[-1]] if pad else fn(x)


def run_chunks(
    inputs: Sequence[torch.Tensor],  # per token, [tokens, ...] each
    plan: PrefillPlan,
    state: torch.Tensor,  # [slots + 1, ...]
    step: Recurrence,
    chunked: Recurrence,
    out_like: torch.Tensor,  # [tokens, ...]: the outputs' shape
    in_place: InPlaceStep | None = None,
) -> torch.Tensor:
    """Every chunk of a prompt step from its slot's state (zero at position 0), its final
    state written back: chunks of one token (decode rows riding in the step) together by
    `in_place` where given (a decode step's kernel, on the pool itself) or else by `step`, so
    their bits are a decode step's; longer ones each by `chunked`."""
    starts = plan.query_starts
    lengths = [starts[c + 1] - starts[c] for c in range(len(starts) - 1)]
    device = out_like.device
    out = torch.empty_like(out_like)
    ones = [c for c, n in enumerate(lengths) if n == 1]
    gathered = list(range(len(lengths)))
    if in_place is not None and ones:
        rows = torch.tensor([starts[c] for c in ones], dtype=torch.int64, device=device)
        slots = plan.state_slots[ones]
        out[rows] = in_place(*(x[rows] for x in inputs), slots, plan.positions[rows])
        gathered = [c for c, n in enumerate(lengths) if n > 1]
        if not gathered:
            return out
    index = torch.tensor(gathered, dtype=torch.int64, device=device)
    first = torch.tensor([starts[c] for c in gathered], dtype=torch.int64, device=device)
    begin = starting_state(state, plan.state_slots[index], plan.positions[first])
    finals = torch.empty_like(begin)
    single = [i for i, c in enumerate(gathered) if lengths[c] == 1]
    if single:
        rows = first[single]
        out[rows], finals[single] = step(*(x[rows] for x in inputs), begin[single])
    for i, c in enumerate(gathered):
        lo, hi = starts[c], starts[c + 1]
        if hi - lo > 1:
            out[lo:hi], finals[i] = chunked(*(x[lo:hi] for x in inputs), begin[i])
    state.index_copy_(0, plan.state_slots[index], finals)
    return out

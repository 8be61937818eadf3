"""Gates of the warm-up: a warm step touches nothing real, and every recording came from it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from nanoserve.core.buckets import Shape
from nanoserve.core.decode_plan import DecodePlan
from nanoserve.core.errors import GateError
from nanoserve.core.step_footprint import StepFootprint


class WarmRowsNotEmptyError(GateError):
    """A warm batch carries real rows."""


class WarmWriteNotSinkError(GateError):
    """A warm batch row is unmasked or writes somewhere other than the sink."""


class WarmTouchedPoolError(GateError):
    """A real slot of the K/V pool changed during the warm-up."""


class TableMovedError(GateError):
    """The slot table was reallocated after recordings took windows on it."""


class WarmGraphBoundError(GateError):
    """A recording froze a real row set: it came from a step, not from the warm-up."""


class ColdCaptureError(GateError):
    """A recording was made while requests were in flight."""


class NotAllWarmError(GateError):
    """A shape of the warm list has no recording."""


class WarmBudgetError(GateError):
    """A shape of the warm list needs more memory at its peak than the budget."""


def check_warm_rows_empty(plan: DecodePlan) -> None:
    if plan.seq_ids:
        raise WarmRowsNotEmptyError(f"a warm batch must have no rows; this one has {plan.seq_ids}")


def check_warm_writes_sink(plan: DecodePlan) -> None:
    lens = plan.context_lens.tolist()
    writes = plan.write_slots.tolist()
    states = plan.state_slots.tolist()
    for row in range(plan.num_rows):
        if writes[row] != plan.sink_slot or lens[row] != 0:
            raise WarmWriteNotSinkError(
                f"warm row {row} writes slot {writes[row]} with context_len {lens[row]};"
                f" it must write the sink {plan.sink_slot} with 0"
            )
        if states[row] != plan.sink_state_slot:
            raise WarmWriteNotSinkError(
                f"warm row {row} uses state slot {states[row]}; it must use the sink state"
                f" slot {plan.sink_state_slot}"
            )


def check_warm_touches_nothing(
    before: Sequence[torch.Tensor], after: Sequence[torch.Tensor], num_slots: int
) -> None:
    """The pool's real slots (all but the sink) are byte-identical before and after."""
    if len(before) != len(after):
        raise WarmTouchedPoolError(f"{len(before)} pools before the warm-up, {len(after)} after")
    for index, (old, new) in enumerate(zip(before, after, strict=True)):
        old_bytes = old[:num_slots].contiguous().view(torch.uint8)
        new_bytes = new[:num_slots].contiguous().view(torch.uint8)
        if old_bytes.shape != new_bytes.shape:
            raise WarmTouchedPoolError(
                f"pool {index}: {tuple(old.shape)} {old.dtype} before the warm-up,"
                f" {tuple(new.shape)} {new.dtype} after"
            )
        if not torch.equal(old_bytes, new_bytes):
            # Locate the change in bytes, not values: NaN != NaN would name an unchanged slot,
            # and -0.0 == 0.0 would name none.
            changed = (old_bytes != new_bytes).reshape(old_bytes.shape[0], -1).any(dim=1)
            first = int(changed.nonzero()[0])
            raise WarmTouchedPoolError(
                f"pool {index}: real slot {first} of {num_slots} changed during the warm-up"
            )


def check_table_stable(address_before: int, address_after: int) -> None:
    if address_before != address_after:
        raise TableMovedError(
            f"the slot table moved from {address_before:#x} to {address_after:#x}"
        )


def check_warm_graphs_unbound(recorded_rows: Mapping[Shape, tuple[int, ...]]) -> None:
    for shape, rows in recorded_rows.items():
        if rows:
            raise WarmGraphBoundError(f"the recording of {shape} is bound to rows {rows}")


def check_no_cold_captures(num_cold: int) -> None:
    if num_cold:
        raise ColdCaptureError(f"{num_cold} recordings were made in front of clients")


def check_all_warm(warm_list: Iterable[Shape], recorded: Iterable[Shape]) -> None:
    missing = sorted(set(warm_list) - set(recorded), reverse=True)
    if missing:
        raise NotAllWarmError(f"{len(missing)} shapes have no recording, first {missing[:4]}")


def check_warm_budget(
    warm_list: Sequence[Shape], footprint: StepFootprint, budget_bytes: int
) -> None:
    """The costliest shape's step fits the budget at its peak (StepFootprint.peak_bytes)."""
    if not warm_list:
        return
    widest = max(warm_list, key=lambda s: footprint.peak_bytes(s.rows, s.width))
    needed = footprint.peak_bytes(widest.rows, widest.width)
    if needed > budget_bytes:
        raise WarmBudgetError(
            f"shape {widest} needs {needed} bytes at its peak; the budget is {budget_bytes}"
        )

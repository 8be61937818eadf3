"""The bytes of a hybrid's recurrent state."""

from __future__ import annotations

import pytest

from nanoserve.core.errors import GeometryError
from nanoserve.core.state_pool_plan import StatePoolPlan


def test_bytes_count_every_tensor_of_a_slot_and_the_sink() -> None:
    # LFM2-1.2B's ten convolution layers: a [2048, 2] window each, float32.
    plan = StatePoolPlan(32, ((2048, 2),) * 10)
    assert plan.sink == 32
    assert plan.bytes_per_slot == 10 * 2048 * 2 * 4 == 163_840
    assert plan.total_bytes == 33 * 163_840
    assert plan.as_dict() == {
        "num_state_slots": 32,
        "sink_state_slot": 32,
        "state_bytes_per_slot": 163_840,
        "state_total_bytes": 33 * 163_840,
        "state_checkpoint_slots": 0,
        "state_checkpoint_bytes": 0,
    }


def test_checkpoint_slots_are_counted_among_the_slots() -> None:
    plan = StatePoolPlan(40, ((2048, 2),) * 10, checkpoint_slots=8)
    assert (plan.sink, plan.total_bytes) == (40, 41 * 163_840)
    assert plan.as_dict()["state_checkpoint_slots"] == 8
    assert plan.as_dict()["state_checkpoint_bytes"] == 8 * 163_840


def test_a_model_without_state_costs_nothing() -> None:
    plan = StatePoolPlan(8, ())
    assert (plan.bytes_per_slot, plan.total_bytes, plan.sink) == (0, 0, 8)


def test_more_checkpoints_than_slots_are_refused() -> None:
    with pytest.raises(
        GeometryError, match=r"checkpoint_slots must be an integer in 0\.\.2, got 3"
    ):
        StatePoolPlan(2, ((4,),), checkpoint_slots=3)


@pytest.mark.parametrize(
    ("slots", "tensors", "message"),
    [
        (-1, (), "num_slots must be an integer >= 0, got -1"),
        (2, ((4, 0),), r"a state tensor's shape \(4, 0\) must be positive sizes"),
        (2, ((),), r"a state tensor's shape \(\) must be positive sizes"),
    ],
)
def test_impossible_plans_are_refused(
    slots: int, tensors: tuple[tuple[int, ...], ...], message: str
) -> None:
    with pytest.raises(GeometryError, match=message):
        StatePoolPlan(slots, tensors)

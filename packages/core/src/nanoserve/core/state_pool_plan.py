"""StatePoolPlan: the bytes of a hybrid model's recurrent state, per slot and in all.

Each recurrent layer keeps, per state slot, a few float32 tensors: a short convolution's window
of its last inputs ([channels, kernel - 1]), and where the layer has one, its recurrent state
(DeltaNet's [v_heads, k_dim, v_dim], Mamba2's [heads, head_dim, d_state]). The pool holds
`num_slots` slots plus the sink; `checkpoint_slots` of them hold saved states (prefix-cache
checkpoints, core/state_checkpoints.py) and the rest the running sequences'. A model with no
recurrent layer has a plan of no tensors: its slots cost nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nanoserve.core.errors import GeometryError

STATE_ITEMSIZE = 4  # float32: a state is summed over every token of a sequence


@dataclass(frozen=True, slots=True)
class StatePoolPlan:
    num_slots: int
    tensors: tuple[tuple[int, ...], ...]  # one slot's shape of every state tensor, layer order
    checkpoint_slots: int = 0  # of num_slots: those that hold prefix-cache checkpoints

    def __post_init__(self) -> None:
        if type(self.num_slots) is not int or self.num_slots < 0:
            raise GeometryError(f"num_slots must be an integer >= 0, got {self.num_slots!r}")
        if (
            type(self.checkpoint_slots) is not int
            or not 0 <= self.checkpoint_slots <= self.num_slots
        ):
            raise GeometryError(
                f"checkpoint_slots must be an integer in 0..{self.num_slots},"
                f" got {self.checkpoint_slots!r}"
            )
        for shape in self.tensors:
            if not shape or any(type(n) is not int or n <= 0 for n in shape):
                raise GeometryError(f"a state tensor's shape {shape} must be positive sizes")

    @property
    def sink(self) -> int:
        """One past every slot a sequence holds: padded rows read and write it."""
        return self.num_slots

    @property
    def bytes_per_slot(self) -> int:
        return sum(math.prod(shape) for shape in self.tensors) * STATE_ITEMSIZE

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_slot * (self.num_slots + 1)

    def as_dict(self) -> dict[str, int]:
        return {
            "num_state_slots": self.num_slots,
            "sink_state_slot": self.sink,
            "state_bytes_per_slot": self.bytes_per_slot,
            "state_total_bytes": self.total_bytes,
            "state_checkpoint_slots": self.checkpoint_slots,
            "state_checkpoint_bytes": self.checkpoint_slots * self.bytes_per_slot,
        }

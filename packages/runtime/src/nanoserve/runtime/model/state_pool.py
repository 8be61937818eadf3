"""StatePool: a hybrid model's recurrent state, one float32 tensor per state tensor of a layer,
each [num_slots + 1, *shape], slot first (the last slot is the sink).

Like the K/V pool it is persistent storage: a decode step reads and writes the rows its plan's
`state_slots` name, in place, so a recording made over a batch of padding (every row the sink)
replays over real rows. On a CPU its pages are the OS's zeroed ones, resident as slots are
used. A slot's old contents never leak into a new sequence: a row at position 0 reads no state
(the forward masks it), whatever the slot held before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.runtime.model.device import resolve_device
from nanoserve.runtime.model.lazy_pages import zeroed


class StatePool:
    def __init__(self, plan: StatePoolPlan, device: torch.device | str = "cpu") -> None:
        self.plan = plan
        self.device = resolve_device(device)
        rows = plan.num_slots + 1
        self.tensors = [
            zeroed((rows, *shape), torch.float32, self.device) for shape in plan.tensors
        ]

    @property
    def resident_bytes(self) -> int:
        return self.plan.total_bytes

    def tensor(self, index: int) -> torch.Tensor:
        """State tensor `index` (layer order), [num_slots + 1, *shape]."""
        return self.tensors[index]

    def touch(self) -> None:
        """Every page written (resident), values unchanged, as the warm-up wants them."""
        with torch.inference_mode():
            for tensor in self.tensors:
                tensor.mul_(1)

    def copy(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy each pair's state from slot `src` to slot `dst` (a checkpoint saved or
        restored), every state tensor of every layer."""
        if not pairs or not self.tensors:
            return
        src = torch.tensor([p[0] for p in pairs], dtype=torch.int64, device=self.device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            for tensor in self.tensors:
                tensor.index_copy_(0, dst, tensor.index_select(0, src))

    def snapshot(self) -> list[torch.Tensor]:
        """Copies of every state tensor, for the warm-up's before/after comparison."""
        return [t.clone() for t in self.tensors]

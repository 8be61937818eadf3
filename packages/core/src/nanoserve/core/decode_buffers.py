"""DecodeBuffers: the five persistent [max_batch] input vectors a decode step reads."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from nanoserve.core.decode_plan import DecodePlan
from nanoserve.core.errors import GeometryError, require_positive

BUFFER_NAMES = ("input_ids", "positions", "write_slots", "context_lens", "state_slots")


@dataclass(frozen=True, slots=True)
class DecodeBuffers:
    """Allocated once; every step writes them in place, so a recording's views stay live."""

    input_ids: torch.Tensor  # [max_batch]
    positions: torch.Tensor  # [max_batch]
    write_slots: torch.Tensor  # [max_batch]
    context_lens: torch.Tensor  # [max_batch]
    state_slots: torch.Tensor  # [max_batch]

    @classmethod
    def allocate(
        cls,
        max_batch: int,
        sink_slot: int,
        device: torch.device | str | None = None,
        sink_state_slot: int = 0,
    ) -> DecodeBuffers:
        require_positive(max_batch=max_batch)

        def vector(fill: int) -> torch.Tensor:
            return torch.full((max_batch,), fill, dtype=torch.int64, device=device)

        return cls(vector(0), vector(0), vector(sink_slot), vector(0), vector(sink_state_slot))

    @property
    def max_batch(self) -> int:
        return int(self.input_ids.shape[0])

    def addresses(self) -> dict[str, int]:
        return {name: getattr(self, name).data_ptr() for name in BUFFER_NAMES}

    def load(self, plan: DecodePlan) -> DecodePlan:
        """Copy plan's vectors into the buffers; the returned plan's vectors are views on them."""
        rows = plan.num_rows
        if rows > self.max_batch:
            raise GeometryError(f"a plan of {rows} rows exceeds the buffers' {self.max_batch}")
        views = {}
        for name in BUFFER_NAMES:
            view = getattr(self, name)[:rows]
            view.copy_(getattr(plan, name))
            views[name] = view
        return replace(plan, **views)

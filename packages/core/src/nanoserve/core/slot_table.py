"""SlotTable: the persistent [max_batch, max_model_len] table of slot ids, one row per decode row."""

from __future__ import annotations

import torch

from nanoserve.core.errors import GeometryError, require_positive


class SlotTable:
    """Decode row i's K/V addresses live in row i; a plan's rectangle is a window on this storage.

    The table remembers which sequence owns each row and how many positions of it are written,
    so a step rewrites only what changed. A recording keeps windows on this storage, so it must
    never move: `to()` makes a new table (a new address) instead of moving this one.
    """

    def __init__(
        self,
        max_batch: int,
        max_model_len: int,
        sink_slot: int,
        device: torch.device | str | None = None,
    ) -> None:
        require_positive(max_batch=max_batch, max_model_len=max_model_len)
        if sink_slot < 0:
            raise GeometryError(f"sink_slot must be >= 0, got {sink_slot}")
        self.max_batch = max_batch
        self.max_model_len = max_model_len
        self.sink_slot = sink_slot
        # Unwritten entries name the sink: any id in here is a legal pool index.
        self.tensor = torch.full(
            (max_batch, max_model_len), sink_slot, dtype=torch.int64, device=device
        )  # [max_batch, max_model_len]
        self._owners: list[int | None] = [None] * max_batch
        self._written: list[int] = [0] * max_batch

    @property
    def address(self) -> int:
        return self.tensor.data_ptr()

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    @property
    def row_owners(self) -> tuple[int | None, ...]:
        return tuple(self._owners)

    def owner(self, row: int) -> int | None:
        self._check_row(row)
        return self._owners[row]

    def written_len(self, row: int) -> int:
        self._check_row(row)
        return self._written[row]

    def write_row(self, row: int, seq_id: int, slot_ids: torch.Tensor) -> None:
        """Make row `row` hold seq_id's slot ids for positions 0..len(slot_ids)-1."""
        num_tokens = int(slot_ids.shape[0])
        start = self.claim(row, seq_id, num_tokens)
        if start < num_tokens:
            self.tensor[row, start:num_tokens].copy_(slot_ids[start:])

    def claim(self, row: int, seq_id: int, num_tokens: int) -> int:
        """Record that row `row` holds seq_id's first num_tokens positions, and return the
        first position the caller must write (0 for a new owner; what was written before for
        the same one). The caller writes positions start..num_tokens-1 itself, so a planner
        on the host can batch every row's new entries into one copy."""
        self._check_row(row)
        if num_tokens > self.max_model_len:
            raise GeometryError(
                f"sequence {seq_id} has {num_tokens} positions; the table holds {self.max_model_len}"
            )
        start = self._written[row] if self._owners[row] == seq_id else 0
        self._owners[row] = seq_id
        self._written[row] = num_tokens
        return min(start, num_tokens)

    def release(self, seq_id: int) -> None:
        """Forget seq_id's rows (it finished or was preempted; its blocks may be reused)."""
        for row, owner in enumerate(self._owners):
            if owner == seq_id:
                self._owners[row] = None
                self._written[row] = 0

    def read(self, seq_ids: tuple[int, ...], pad_rows: int, width: int) -> torch.Tensor:
        """The rectangle [len(rows) + pad_rows, width] as a window (a view) on the table.

        `seq_ids` are the plan's and must own the table's first rows, in order.
        An empty `seq_ids` is legal only when something is padded: a warm batch's shape.
        """
        if pad_rows < 0:
            raise GeometryError(f"pad_rows must be >= 0, got {pad_rows}")
        if not seq_ids and pad_rows == 0:
            raise GeometryError(
                "read(seq_ids=(), pad_rows=0) addresses nothing: an empty read needs pad_rows > 0"
            )
        num_rows = len(seq_ids) + pad_rows
        if num_rows > self.max_batch:
            raise GeometryError(f"{num_rows} rows exceed the table's max_batch {self.max_batch}")
        if not 0 < width <= self.max_model_len:
            raise GeometryError(f"width {width} is outside 1..{self.max_model_len}")
        owners = tuple(self._owners[: len(seq_ids)])
        if owners != seq_ids:
            raise GeometryError(f"sequences {seq_ids} are not the table's first rows {owners}")
        return self.tensor[:num_rows, :width]

    def to(self, device: torch.device | str) -> SlotTable:
        """A copy on `device`: new storage, so a new address (never an in-place move)."""
        moved = SlotTable(self.max_batch, self.max_model_len, self.sink_slot, device=device)
        moved.tensor.copy_(self.tensor)
        moved._owners = list(self._owners)
        moved._written = list(self._written)
        return moved

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.max_batch:
            raise GeometryError(f"row {row} is outside 0..{self.max_batch - 1}")

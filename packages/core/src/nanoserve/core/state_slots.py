"""StateSlots: which running sequence holds which recurrent-state slot, and the gates on them.

A hybrid model (LFM2's short convolutions, a DeltaNet or Mamba2 layer) carries a state from
token to token beside its K/V. Each running sequence holds one state slot, taken when it is
admitted and given back when it finishes or is preempted (a preempted sequence recomputes
its state with its K/V). Slot `num_slots` is the sink: a padded row reads and writes it, as
its K/V goes to the sink slot, so a batch of padding touches no sequence's state.

Checkpoints (a state saved where a cached prefix ends) take slots from the same count; the
conservation gate counts them: free + used + checkpoints == total.

A model without recurrent layers still gives every sequence a slot (its pool holds no bytes),
so one code path serves both.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoserve.core.errors import GateError, GeometryError


class StateSlotError(GateError):
    """A plan's rows share a state slot, a real row uses the sink, or a slot is out of range."""


class StateConservationError(GateError):
    """The state slots' free + used + checkpoints is not their total."""


class StateSlots:
    """`num_slots` state slots plus the sink at index `num_slots`."""

    def __init__(self, num_slots: int) -> None:
        if type(num_slots) is not int or num_slots < 0:
            raise GeometryError(f"num_slots must be an integer >= 0, got {num_slots!r}")
        self.num_slots = num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() gives the lowest
        self._owner_of: dict[int, int] = {}  # slot -> seq_id
        self._slot_of: dict[int, int] = {}  # seq_id -> slot
        self.checkpoints: set[int] = set()  # slots holding a saved state, owned by no sequence

    @property
    def sink(self) -> int:
        return self.num_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._owner_of)

    def slot_of(self, seq_id: int) -> int | None:
        return self._slot_of.get(seq_id)

    def take(self, seq_id: int) -> int:
        """A free slot for seq_id (its own, if it holds one already)."""
        held = self._slot_of.get(seq_id)
        if held is not None:
            return held
        if not self._free:
            raise StateSlotError(
                f"no state slot is free for sequence {seq_id}: {self.num_used} used,"
                f" {len(self.checkpoints)} checkpoints, of {self.num_slots}"
            )
        slot = self._free.pop()
        self._owner_of[slot] = seq_id
        self._slot_of[seq_id] = slot
        return slot

    def give_back(self, seq_id: int) -> None:
        """seq_id's slot returns to the free list (nothing, if it holds none)."""
        slot = self._slot_of.pop(seq_id, None)
        if slot is not None:
            del self._owner_of[slot]
            self._free.append(slot)

    def keep(self) -> int:
        """A free slot to hold a checkpoint (a saved state no sequence owns)."""
        if not self._free:
            raise StateSlotError(
                f"no state slot is free for a checkpoint: {self.num_used} used,"
                f" {len(self.checkpoints)} checkpoints, of {self.num_slots}"
            )
        slot = self._free.pop()
        self.checkpoints.add(slot)
        return slot

    def drop(self, slot: int) -> None:
        """Checkpoint slot `slot` returns to the free list."""
        if slot not in self.checkpoints:
            raise StateSlotError(f"state slot {slot} holds no checkpoint")
        self.checkpoints.remove(slot)
        self._free.append(slot)


def check_state_conservation(slots: StateSlots) -> None:
    """free + used + checkpoints == total, and no slot is counted twice."""
    free, used, saved = set(slots._free), set(slots._owner_of), slots.checkpoints
    if len(free) != slots.num_free:
        raise StateConservationError(
            f"the free list holds {slots.num_free} entries but {len(free)} distinct slots"
        )
    for name, a, b in (("free", free, used), ("free", free, saved), ("used", used, saved)):
        if both := a & b:
            other = "used" if b is used else "checkpoints"
            raise StateConservationError(f"state slots {sorted(both)[:8]} are {name} and {other}")
    if len(free) + len(used) + len(saved) != slots.num_slots:
        raise StateConservationError(
            f"free {len(free)} + used {len(used)} + checkpoints {len(saved)}"
            f" != total {slots.num_slots}"
        )


def check_state_rows(seq_ids: Sequence[int], state_slots: Sequence[int], sink: int) -> None:
    """A plan's state slots: each real row's its own (no two rows share one), none the sink,
    each in range; every row past the real ones (padding) the sink."""
    real = len(seq_ids)
    seen: dict[int, int] = {}
    for row, slot in enumerate(state_slots):
        if row >= real:
            if slot != sink:
                raise StateSlotError(
                    f"padded row {row} uses state slot {slot}; padding needs the sink {sink}"
                )
            continue
        if slot == sink:
            raise StateSlotError(f"real row {row} (sequence {seq_ids[row]}) uses the sink {sink}")
        if not 0 <= slot < sink:
            raise StateSlotError(
                f"row {row} (sequence {seq_ids[row]}) uses state slot {slot}, outside 0..{sink}"
            )
        if slot in seen:
            raise StateSlotError(
                f"rows {seen[slot]} and {row} (sequences {seq_ids[seen[slot]]} and"
                f" {seq_ids[row]}) share state slot {slot}"
            )
        seen[slot] = row

"""Buckets: the closed set of (rows, width) decode shapes, and padding a plan to its bucket."""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve.core.decode_plan import DecodePlan, pad_decode
from nanoserve.core.errors import GeometryError, require_positive
from nanoserve.core.slot_table import SlotTable


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    rows: int
    width: int


@dataclass(frozen=True, slots=True)
class BucketSet:
    """Rows 1, 2, 4, … up to max_batch (max_batch itself always a bucket); widths every
    width_multiple tokens up to max_model_len (max_model_len itself always a bucket)."""

    max_batch: int
    max_model_len: int
    width_multiple: int

    def __post_init__(self) -> None:
        require_positive(
            max_batch=self.max_batch,
            max_model_len=self.max_model_len,
            width_multiple=self.width_multiple,
        )

    @property
    def row_buckets(self) -> tuple[int, ...]:
        rows, r = [], 1
        while r < self.max_batch:
            rows.append(r)
            r *= 2
        return (*rows, self.max_batch)

    @property
    def width_buckets(self) -> tuple[int, ...]:
        widths = range(self.width_multiple, self.max_model_len, self.width_multiple)
        return (*widths, self.max_model_len)

    @property
    def shapes(self) -> tuple[Shape, ...]:
        return tuple(Shape(r, w) for r in self.row_buckets for w in self.width_buckets)

    def row_bucket(self, num_rows: int) -> int:
        if not 0 < num_rows <= self.max_batch:
            raise GeometryError(f"{num_rows} rows is outside 1..max_batch {self.max_batch}")
        return next(r for r in self.row_buckets if r >= num_rows)

    def width_bucket(self, width: int) -> int:
        if not 0 < width <= self.max_model_len:
            raise GeometryError(f"width {width} is outside 1..max_model_len {self.max_model_len}")
        return min(-(-width // self.width_multiple) * self.width_multiple, self.max_model_len)

    def bucket_of(self, num_rows: int, width: int) -> Shape:
        return Shape(self.row_bucket(num_rows), self.width_bucket(width))


def bucket_decode(
    plan: DecodePlan, buckets: BucketSet, table: SlotTable | None = None
) -> DecodePlan:
    """Pad plan to the smallest bucket shape that holds it (a window on table, if given)."""
    shape = buckets.bucket_of(len(plan.seq_ids), plan.width)
    return pad_decode(plan, shape.rows, shape.width, table)

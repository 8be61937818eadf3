"""The warm list and its price: which shapes to record at startup, and what that costs
against the recordings an unwarmed engine makes in front of its clients."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nanoserve.core.buckets import BucketSet, Shape
from nanoserve.core.errors import GeometryError, require_positive

SCORE_BYTES = 4  # attention scores are float32


def warm_shapes(
    buckets: BucketSet, *, max_rows: int | None = None, max_width: int | None = None
) -> tuple[Shape, ...]:
    """The bucket set, biggest first, trimmed to what the server will present.

    Biggest first: recordings share one memory pool sized by its largest member, so recording
    that one first allocates the pool once at its final size.
    """
    rows_cap = buckets.max_batch if max_rows is None else max_rows
    width_cap = buckets.max_model_len if max_width is None else max_width
    if rows_cap < 0 or width_cap < 0:
        raise GeometryError(f"max_rows {rows_cap} and max_width {width_cap} must be >= 0")
    kept = [s for s in buckets.shapes if s.rows <= rows_cap and s.width <= width_cap]
    return tuple(sorted(kept, key=lambda s: (s.rows * s.width, s.rows), reverse=True))


def lazy_captures(prompt_len: int, generated: int, width_multiple: int) -> int:
    """Width buckets a request's context crosses while it decodes: the recordings an unwarmed
    engine makes in front of it. The first token comes from prefill; decode step k feeds token
    k and sees prompt_len + k positions, for k = 1 .. generated - 1."""
    require_positive(width_multiple=width_multiple)
    if prompt_len < 0 or generated < 0:
        raise GeometryError(f"prompt_len {prompt_len} and generated {generated} must be >= 0")
    if generated < 2:
        return 0
    first = -(-(prompt_len + 1) // width_multiple)
    last = -(-(prompt_len + generated - 1) // width_multiple)
    return last - first + 1


def stall_seconds(num_lazy: int, seconds_per_recording: float) -> float:
    return num_lazy * seconds_per_recording


def warmup_seconds(num_shapes: int, seconds_per_recording: float) -> float:
    return num_shapes * seconds_per_recording


def warm_budget_bytes(rows: int, heads: int, width: int) -> int:
    """Bytes of the widest recording's attention scores: rows x heads x width float32."""
    return rows * heads * width * SCORE_BYTES


def width_ceiling(budget_bytes: int, rows: int, heads: int) -> int:
    """The widest width whose scores fit budget_bytes at rows and heads (rounded down)."""
    require_positive(rows=rows, heads=heads)
    return max(0, budget_bytes) // (rows * heads * SCORE_BYTES)


# --- pricing the list before paying for it -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordingCost:
    """What one recording costs, as a line in the shape's area:
    seconds = fixed_seconds + seconds_per_position * rows * width.

    A step's work grows with the positions it gathers and scores, plus a fixed part per layer
    (launches, the small matmuls). Fitted through two real recordings, so both ends of the list
    are measured, not assumed. Where costs are convex (on a CPU big gathers fall out of cache),
    the chord overestimates the middle: the estimate errs towards a shorter boot.
    """

    fixed_seconds: float
    seconds_per_position: float

    def seconds(self, shape: Shape) -> float:
        return self.fixed_seconds + self.seconds_per_position * shape.rows * shape.width


def fit_recording_cost(
    small: Shape, small_seconds: float, large: Shape, large_seconds: float
) -> RecordingCost:
    """The line through two measured recordings, with both coefficients clamped at >= 0.

    A negative slope (the large probe came out no dearer: noise) keeps the dearer probe as a
    flat cost. A negative intercept (costs grow faster than the area) takes the line from zero
    through the large probe instead, which stays above the small one and is exact where most
    of the cost is. One area measured twice is proportional to its area.
    """
    if small_seconds < 0 or large_seconds < 0:
        raise GeometryError(f"probe seconds {small_seconds} and {large_seconds} must be >= 0")
    small_area, large_area = small.rows * small.width, large.rows * large.width
    if small_area > large_area:
        small, small_seconds, large, large_seconds = large, large_seconds, small, small_seconds
        small_area, large_area = large_area, small_area
    if small_area == large_area:
        mean = (small_seconds + large_seconds) / 2
        return RecordingCost(0.0, mean / large_area if large_area else 0.0)
    slope = (large_seconds - small_seconds) / (large_area - small_area)
    if slope <= 0:
        return RecordingCost(max(small_seconds, large_seconds), 0.0)
    fixed = small_seconds - slope * small_area
    if fixed < 0:
        return RecordingCost(0.0, large_seconds / large_area)
    return RecordingCost(fixed, slope)


def warm_estimate(
    shapes: Sequence[Shape], cost: RecordingCost, paid: Mapping[Shape, float] | None = None
) -> float:
    """Seconds of a warm-up that records shapes: what is already paid (the probes, measured,
    whether or not they stay in the list), plus the predicted cost of every shape not yet paid."""
    paid = paid or {}
    return sum(paid.values()) + sum(cost.seconds(s) for s in shapes if s not in paid)


def seconds_ceiling(
    shapes: Sequence[Shape],
    cost: RecordingCost,
    budget_seconds: float,
    paid: Mapping[Shape, float] | None = None,
) -> int:
    """The widest width whose list (the shapes no wider) the warm-up can record within
    budget_seconds; 0 when not even the narrowest fits. Like the memory budget, a time budget
    caps the widest shape and keeps every rows bucket below the cap."""
    for width in sorted({s.width for s in shapes}, reverse=True):
        kept = [s for s in shapes if s.width <= width]
        if warm_estimate(kept, cost, paid) <= budget_seconds:
            return width
    return 0

"""The warm list and its price: which shapes to record at startup, and what that costs
against the recordings an unwarmed engine makes in front of its clients."""

from __future__ import annotations

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

"""Warm-list arithmetic: the build log's tables (day 55), reproduced exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.core import (
    BucketSet,
    GeometryError,
    Shape,
    lazy_captures,
    stall_seconds,
    warm_budget_bytes,
    warm_shapes,
    warmup_seconds,
    width_ceiling,
)
from nanoserve.core.warm_list import (
    RecordingCost,
    fit_recording_cost,
    seconds_ceiling,
    warm_estimate,
)

SERVING = BucketSet(256, 8192, 128)
SECONDS_PER_RECORDING = 0.05


# --- warm_shapes and warmup_seconds: the startup column ------------------------------------------


@pytest.mark.parametrize(
    ("max_rows", "max_width", "num_shapes", "seconds"),
    [
        (None, None, 576, 28.8),
        (8, None, 256, 12.8),
        (8, 2048, 64, 3.2),
    ],
)
def test_startup_cost_of_the_warm_list(
    max_rows: int | None, max_width: int | None, num_shapes: int, seconds: float
) -> None:
    shapes = warm_shapes(SERVING, max_rows=max_rows, max_width=max_width)
    assert len(shapes) == num_shapes
    assert warmup_seconds(len(shapes), SECONDS_PER_RECORDING) == pytest.approx(seconds)


def test_warm_list_is_biggest_first() -> None:
    shapes = warm_shapes(SERVING)
    assert shapes[0] == Shape(256, 8192)
    assert shapes[1] == Shape(256, 8064)
    assert shapes[-1] == Shape(1, 128)
    sizes = [s.rows * s.width for s in shapes]
    assert sizes == sorted(sizes, reverse=True)
    assert set(shapes) == set(SERVING.shapes)


def test_warm_list_ties_put_more_rows_first() -> None:
    # (2, 8) and (4, 4) both hold 16 positions.
    assert warm_shapes(BucketSet(4, 8, 4)) == (
        Shape(4, 8),
        Shape(4, 4),
        Shape(2, 8),
        Shape(2, 4),
        Shape(1, 8),
        Shape(1, 4),
    )


def test_warm_list_trims() -> None:
    trimmed = warm_shapes(SERVING, max_rows=8, max_width=2048)
    assert trimmed[0] == Shape(8, 2048)
    assert {s.rows for s in trimmed} == {1, 2, 4, 8}
    assert {s.width for s in trimmed} == set(range(128, 2049, 128))
    assert warm_shapes(SERVING, max_rows=0) == ()
    assert warm_shapes(SERVING, max_width=127) == ()
    assert len(warm_shapes(SERVING, max_rows=5)) == 3 * 64  # rows 1, 2, 4


def test_warm_list_refuses_negative_ceilings() -> None:
    with pytest.raises(GeometryError, match=r"^max_rows -1 and max_width 8192 must be >= 0$"):
        warm_shapes(SERVING, max_rows=-1)
    with pytest.raises(GeometryError, match=r"^max_rows 256 and max_width -1 must be >= 0$"):
        warm_shapes(SERVING, max_width=-1)


# --- the pool budget as a width ceiling ----------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "ceiling", "num_shapes"),
    [
        (64_000_000, 1953, 135),
        (268_000_000, 8178, 567),
        (1_000_000_000, 30517, 576),
    ],
)
def test_what_a_pool_budget_buys(budget: int, ceiling: int, num_shapes: int) -> None:
    assert width_ceiling(budget, 256, 32) == ceiling
    assert len(warm_shapes(SERVING, max_width=ceiling)) == num_shapes


def test_warm_budget_bytes_exact() -> None:
    assert warm_budget_bytes(256, 32, 8192) == 256 * 32 * 8192 * 4 == 268_435_456
    assert warm_budget_bytes(1, 1, 1) == 4
    assert warm_budget_bytes(256, 32, 1953) <= 64_000_000 < warm_budget_bytes(256, 32, 1954)


def test_width_ceiling_of_nothing() -> None:
    assert width_ceiling(0, 256, 32) == 0
    assert width_ceiling(-5, 256, 32) == 0
    assert width_ceiling(32767, 256, 32) == 0
    assert width_ceiling(32768, 256, 32) == 1


@pytest.mark.parametrize(("rows", "heads"), [(0, 32), (256, 0), (-1, 32)])
def test_width_ceiling_refuses_bad_geometry(rows: int, heads: int) -> None:
    with pytest.raises(GeometryError, match=r"must be a positive integer"):
        width_ceiling(1000, rows, heads)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 512),
    heads=st.integers(1, 64),
    width=st.integers(0, 20_000),
    budget=st.integers(0, 10**10),
)
def test_width_ceiling_inverts_warm_budget_bytes(
    rows: int, heads: int, width: int, budget: int
) -> None:
    assert width_ceiling(warm_budget_bytes(rows, heads, width), rows, heads) == width
    ceiling = width_ceiling(budget, rows, heads)
    assert warm_budget_bytes(rows, heads, ceiling) <= budget
    assert warm_budget_bytes(rows, heads, ceiling + 1) > budget


# --- lazy captures and their stall: the client's column --------------------------------------


@pytest.mark.parametrize(("generated", "lazy"), [(8, 1), (32, 2), (64, 3), (128, 5)])
def test_host_table_lazy_captures(generated: int, lazy: int) -> None:
    # 2 rows off a 16-token prompt at width multiple 32 (day-55-warmbench.csv).
    assert lazy_captures(16, generated, 32) == lazy


@pytest.mark.parametrize(
    ("generated", "lazy", "stall"),
    [(128, 1, 0.05), (512, 4, 0.2), (2048, 16, 0.8), (8192, 64, 3.2)],
)
def test_serving_table_lazy_captures_and_stall(generated: int, lazy: int, stall: float) -> None:
    assert lazy_captures(0, generated, 128) == lazy
    assert stall_seconds(lazy, SECONDS_PER_RECORDING) == pytest.approx(stall)


def test_warming_everything_costs_nine_times_the_longest_stall() -> None:
    full = warmup_seconds(len(warm_shapes(SERVING)), SECONDS_PER_RECORDING)
    worst = stall_seconds(lazy_captures(0, 8192, 128), SECONDS_PER_RECORDING)
    assert full / worst == pytest.approx(9.0)


@pytest.mark.parametrize(
    ("prompt_len", "generated", "lazy"),
    [
        (16, 0, 0),  # nothing decoded
        (16, 1, 0),  # the first token comes from prefill
        (16, 2, 1),  # one decode step at context 17
        (31, 2, 1),  # context 32: still the first bucket
        (32, 2, 1),  # context 33: the second bucket only
        (31, 3, 2),  # contexts 32, 33 cross a boundary
    ],
)
def test_lazy_captures_edges(prompt_len: int, generated: int, lazy: int) -> None:
    assert lazy_captures(prompt_len, generated, 32) == lazy


def test_lazy_captures_refuses_bad_input() -> None:
    with pytest.raises(GeometryError, match=r"^prompt_len -1 and generated 4 must be >= 0$"):
        lazy_captures(-1, 4, 32)
    with pytest.raises(GeometryError, match=r"^prompt_len 1 and generated -4 must be >= 0$"):
        lazy_captures(1, -4, 32)
    with pytest.raises(GeometryError, match=r"^width_multiple must be a positive integer, got 0$"):
        lazy_captures(1, 4, 0)


@settings(max_examples=150, deadline=None)
@given(prompt_len=st.integers(0, 300), generated=st.integers(0, 300), multiple=st.integers(1, 64))
def test_lazy_captures_counts_distinct_width_buckets(
    prompt_len: int, generated: int, multiple: int
) -> None:
    # Decode step k (k = 1 .. generated - 1) sees prompt_len + k positions.
    contexts = range(prompt_len + 1, prompt_len + generated)
    buckets = {-(-c // multiple) for c in contexts}
    assert lazy_captures(prompt_len, generated, multiple) == len(buckets)


# --- pricing: a cost line through two probes, and the time budget as a width ceiling -------------

TINY = BucketSet(4, 64, 16)  # rows 1, 2, 4 x widths 16, 32, 48, 64
# Dyadic numbers, so every sum below is exact: 0.375 s + 1/128 s per position.
LINE = RecordingCost(0.375, 0.0078125)


def test_fit_goes_through_both_probes() -> None:
    cost = fit_recording_cost(Shape(1, 16), 0.5, Shape(4, 64), 2.375)
    assert cost == LINE
    assert cost.seconds(Shape(1, 16)) == 0.5 and cost.seconds(Shape(4, 64)) == 2.375
    assert cost.seconds(Shape(2, 32)) == 0.375 + 64 / 128
    # Argument order does not matter: the smaller area is the small probe.
    assert fit_recording_cost(Shape(4, 64), 2.375, Shape(1, 16), 0.5) == LINE


def test_fit_clamps_a_negative_slope_to_the_dearer_probe() -> None:
    # The large probe came out faster (noise): a flat cost at the dearer of the two.
    assert fit_recording_cost(Shape(1, 16), 0.5, Shape(4, 64), 0.25) == RecordingCost(0.5, 0.0)
    assert fit_recording_cost(Shape(1, 16), 0.5, Shape(4, 64), 0.5) == RecordingCost(0.5, 0.0)


def test_fit_clamps_a_negative_intercept_through_zero_and_the_large_probe() -> None:
    # Costs growing faster than the area: the chord would start below zero.
    cost = fit_recording_cost(Shape(1, 16), 0.0625, Shape(4, 64), 4.0)
    assert cost == RecordingCost(0.0, 4.0 / 256)
    assert cost.seconds(Shape(4, 64)) == 4.0 and cost.seconds(Shape(1, 16)) == 0.25 >= 0.0625


def test_fit_of_one_area_is_proportional() -> None:
    assert fit_recording_cost(Shape(2, 8), 1.0, Shape(2, 8), 0.5) == RecordingCost(0.0, 0.75 / 16)
    assert fit_recording_cost(Shape(2, 8), 1.0, Shape(4, 4), 1.0) == RecordingCost(0.0, 1 / 16)


def test_fit_refuses_negative_seconds() -> None:
    with pytest.raises(GeometryError, match=r"^probe seconds -1.0 and 2.0 must be >= 0$"):
        fit_recording_cost(Shape(1, 16), -1.0, Shape(4, 64), 2.0)


def test_estimate_counts_what_is_paid_and_predicts_the_rest() -> None:
    shapes = warm_shapes(TINY)
    # Per width w, rows 1 + 2 + 4: 3 x 0.375 + 7 w / 128 = 2.0, 2.875, 3.75, 4.625.
    assert warm_estimate(shapes, LINE) == 2.0 + 2.875 + 3.75 + 4.625 == 13.25
    # The probes as measured (here 1 s above the line each), the rest as predicted.
    paid = {Shape(4, 64): 3.375, Shape(1, 16): 1.5}
    assert warm_estimate(shapes, LINE, paid) == 13.25 + 2.0
    # A paid probe the list no longer holds is still paid for.
    narrow = warm_shapes(TINY, max_width=16)
    assert warm_estimate(narrow, LINE, paid) == 3.375 + 1.5 + 2.0 - 0.5
    assert warm_estimate((), LINE) == 0


@pytest.mark.parametrize(
    ("budget", "ceiling", "num_shapes"),
    [(13.25, 64, 12), (13.2, 48, 9), (8.625, 48, 9), (8.6, 32, 6), (2.0, 16, 3), (1.99, 0, 0)],
)
def test_time_budget_is_a_width_ceiling(budget: float, ceiling: int, num_shapes: int) -> None:
    shapes = warm_shapes(TINY)
    assert seconds_ceiling(shapes, LINE, budget) == ceiling
    kept = warm_shapes(TINY, max_width=ceiling)
    assert len(kept) == num_shapes and warm_estimate(kept, LINE) <= budget
    # Widest shapes go first; every rows bucket stays below the ceiling.
    assert {s.rows for s in kept} == ({1, 2, 4} if kept else set())


def test_time_budget_counts_the_probes_paid() -> None:
    shapes = warm_shapes(TINY)
    paid = {Shape(4, 64): 2.375, Shape(1, 16): 0.5}  # on the line: nothing changes while kept
    assert seconds_ceiling(shapes, LINE, 13.25, paid) == 64
    # Width <= 48 costs 8.625 predicted, plus the dropped 4x64 probe's 2.375 already spent.
    assert seconds_ceiling(shapes, LINE, 11.0, paid) == 48
    assert seconds_ceiling(shapes, LINE, 10.99, paid) == 32
    assert seconds_ceiling((), LINE, 1.0) == 0


def test_a_flat_cost_reproduces_the_build_logs_trimmed_list() -> None:
    # 50 ms a recording: rows <= 8 within 3.2 s is context <= 2048, 64 shapes.
    shapes = warm_shapes(SERVING, max_rows=8)
    flat = RecordingCost(SECONDS_PER_RECORDING, 0.0)
    ceiling = seconds_ceiling(shapes, flat, 3.2 + 1e-9)
    assert ceiling == 2048
    assert len([s for s in shapes if s.width <= ceiling]) == 64

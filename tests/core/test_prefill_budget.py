"""PrefillBudget: prompt tokens per step by decoding rows, exact on small costs, and bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.core import PrefillBudget, PrefillBudgetError


def test_tokens_keep_a_mixed_step_within_the_ratio() -> None:
    # decode: 10 ms + 2 ms a row; a prompt token 1 ms; ratio 1.5: half a decode step of tokens
    budget = PrefillBudget(max_tokens=64, base_s=0.010, per_row_s=0.002, per_token_s=0.001)
    assert budget.tokens(1) == 16  # 0.5 * 12 ms = 6 tokens, raised to min_tokens
    assert budget.tokens(12) == 17  # 0.5 * 34 ms
    assert budget.tokens(40) == 24  # 0.5 * 90 ms = 45, but only 64 - 40 are left
    assert budget.decode_step_s(12) == pytest.approx(0.034)


def test_a_backlog_is_worked_off_within_the_burst_bound() -> None:
    # decode: 10 ms + 2 ms a row, up to 32 rows; a backlog's prompts at most 2 decode steps to
    # come, so a step at most 3 of them.
    budget = PrefillBudget(
        max_tokens=512, base_s=0.010, per_row_s=0.002, per_token_s=0.001, max_rows=32
    )
    assert budget.tokens(2) == 16  # steady: 0.5 * 14 ms = 7, raised to min_tokens
    assert budget.tokens(2, waiting=100, joining=2) == 36  # 4 rows to come: 2 * 18 ms
    assert budget.burst_tokens(2, joining=30) == 148  # 32 rows to come: 2 * 74 ms
    assert budget.tokens(2, waiting=30, joining=1) == 30  # a small backlog, in one step
    assert budget.tokens(2, waiting=2000, joining=30) == 148  # 2 * 74 ms, no more
    assert budget.tokens(2, waiting=2000, joining=100) == 148  # the row limit caps "to come"
    assert budget.tokens(0, waiting=512, joining=8) == 512  # nothing decodes, all fits: at once
    assert budget.tokens(0, waiting=2000, joining=31) == 144  # too many: 2 * 72 ms
    assert budget.tokens(0, waiting=2000, joining=1) == 512  # one long prompt alone: all of it
    # as many with 32 rows decoding as with 2: the share does not grow as fewer rows decode
    assert budget.tokens(32, waiting=2000, joining=10) == 148  # 2 * 74 ms
    slow = PrefillBudget(
        max_tokens=512, base_s=0.010, per_row_s=0.002, per_token_s=0.001, max_rows=32, horizon=4
    )
    assert slow.tokens(2, waiting=400, joining=30) == 100  # a quarter a step


def test_a_fixed_count() -> None:
    budget = PrefillBudget.fixed(32, max_tokens=512)
    assert [budget.tokens(r) for r in (0, 1, 100, 490)] == [512, 32, 32, 22]
    assert budget.tokens(1, waiting=10_000) == 32  # no backlog rule without costs
    assert budget.as_dict()["tokens_at_1_row"] == 32


def test_from_timings_recovers_the_costs() -> None:
    budget = PrefillBudget.from_timings(
        max_tokens=512, one_row_s=0.012, rows=32, rows_s=0.074, tokens=128, tokens_s=0.266
    )
    assert budget.per_row_s == pytest.approx(0.002)
    assert budget.base_s == pytest.approx(0.010)
    assert budget.per_token_s == pytest.approx(0.002)
    assert budget.tokens(32) == 18  # 0.5 * 74 ms / 2 ms
    # a machine whose wider step came out faster (noise) is priced flat, not negative
    flat = PrefillBudget.from_timings(
        max_tokens=64, one_row_s=0.02, rows=8, rows_s=0.01, tokens=16, tokens_s=0.016
    )
    assert flat.per_row_s == 0.0 and flat.base_s == pytest.approx(0.02)
    # a prompt token is priced at what it adds to a step (the chunk less one row's step), and
    # never below half the chunk's mean however noisy the one-row timing
    assert flat.per_token_s == pytest.approx(0.0005)  # the marginal (16 - 20) / 15 is < 0


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 0},
        {"max_tokens": 8, "min_tokens": 0},
        {"max_tokens": 8, "per_token_s": -1.0},
        {"max_tokens": 8, "ratio": 0.9},
        {"max_tokens": 8, "base_s": float("nan")},
        {"max_tokens": 8, "burst": 0.5},
        {"max_tokens": 8, "horizon": 0},
    ],
)
def test_impossible_budgets_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(PrefillBudgetError):
        PrefillBudget(**fields)  # type: ignore[arg-type]


@given(
    base=st.floats(0, 0.2),
    per_row=st.floats(0, 0.01),
    per_token=st.floats(1e-5, 0.01),
    rows=st.integers(1, 256),
    max_tokens=st.integers(1, 2048),
)
def test_bounds_hold_for_any_costs(
    base: float, per_row: float, per_token: float, rows: int, max_tokens: int
) -> None:
    budget = PrefillBudget(max_tokens, base, per_row, per_token, max_rows=256)
    tokens = budget.tokens(rows)
    assert 0 <= tokens <= max(0, max_tokens - rows)  # the step's budget is never exceeded
    step = budget.decode_step_s(rows)
    if tokens > budget.min_tokens:  # not held up by the floor: within the ratio
        assert step + tokens * per_token <= budget.ratio * step + 1e-5 * per_token
    # a wider decode step allows as many prompt tokens, unless the step's room runs out
    assert budget.tokens(rows + 1) >= min(tokens, max(0, max_tokens - rows - 1))
    # a backlog never takes a step past the burst bound, nor the steady rule away
    backlog = budget.tokens(rows, waiting=100_000, joining=256)
    widest = budget.burst * budget.decode_step_s(256)
    assert tokens <= backlog
    if backlog > max(tokens, budget.min_tokens):
        assert step + backlog * per_token <= widest + 1e-5 * per_token
    # the backlog's share is the same whatever the number of rows decoding now
    assert budget.burst_tokens(rows, joining=256) == budget.burst_tokens(1, joining=256)

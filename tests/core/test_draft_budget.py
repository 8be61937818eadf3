"""DraftBudget: which decoding rows verify how many draft tokens, priced on step costs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.core.draft_budget import (
    Acceptance,
    DraftBudgetError,
    DraftCandidate,
    DraftCost,
    expected_tokens,
    plan_drafts,
)

# decode: 10 ms + 1 ms a row; a draft token 1 ms; no extra for a verify step
COST = DraftCost(base_s=0.010, per_row_s=0.001, switch_s=0.0, per_draft_s=0.001)


def test_one_row_takes_the_drafts_that_raise_its_rate() -> None:
    # 1 token / 11 ms; +0.5 (12 ms): 0.125/ms; +0.25 (13 ms): 0.135; +0.125 (14 ms): 0.134, no
    assert plan_drafts(COST, 1, [DraftCandidate(7, 0.5, 4)], 64) == {7: 2}


def test_a_full_step_backs_off() -> None:
    # 32 rows / 42 ms = 0.762 a ms; a draft worth 0.5 tokens for 1 ms lowers it
    assert plan_drafts(COST, 32, [DraftCandidate(7, 0.5, 4)], 64) == {}
    # ... while one accepted 9 times in 10 raises it, for two tokens, by 0.4%
    assert plan_drafts(COST, 32, [DraftCandidate(7, 0.9, 8)], 64, margin=0.0) == {7: 2}
    # which is within the margin that estimates' noise asks for
    assert plan_drafts(COST, 32, [DraftCandidate(7, 0.9, 8)], 64) == {}


def test_the_best_rows_go_first() -> None:
    candidates = [DraftCandidate(7, 0.9, 8), DraftCandidate(8, 0.95, 8)]
    assert plan_drafts(COST, 32, candidates, 64, margin=0.0) == {8: 4, 7: 2}
    both = [DraftCandidate(7, 0.9, 8), DraftCandidate(8, 0.6, 8)]
    assert plan_drafts(COST, 2, both, 64) == {7: 8, 8: 1}
    assert plan_drafts(COST, 2, both, 3) == {7: 3}  # the step's token budget


def test_a_verify_step_must_pay_for_its_switch() -> None:
    candidate = [DraftCandidate(7, 0.5, 8)]
    # +5 ms: 1.875 tokens / 19 ms beats 1 / 11 ms
    assert plan_drafts(DraftCost(0.010, 0.001, 0.005, 0.001), 1, candidate, 64) == {7: 3}
    # +10 ms: the best, 1.875 / 24 ms, does not
    assert plan_drafts(DraftCost(0.010, 0.001, 0.010, 0.001), 1, candidate, 64) == {}


def test_a_proposal_that_costs_work_is_priced_with_the_verify() -> None:
    candidate = [DraftCandidate(7, 0.9, 8)]
    # a draft model's 3 ms a token (4 ms with its verify): 1 + 0.9 + ... + 0.9^4 = 4.10 tokens
    # / 27 ms beats 1 / 11 ms; a fifth, worth 0.59 for 4 ms, is below 1.05x 4.10 / 27 ms
    cost = DraftCost(0.010, 0.001, 0.0, 0.001, propose_s=0.003)
    assert cost.token_s == 0.004
    assert plan_drafts(cost, 1, candidate, 64) == {7: 4}
    assert plan_drafts(DraftCost(0.010, 0.001, 0.0, 0.001), 1, candidate, 64) == {7: 8}
    # a draft as dear as the target's own step never pays, even accepted nearly always
    dear = DraftCost(0.010, 0.001, 0.0, 0.001, propose_s=0.011)
    assert plan_drafts(dear, 1, [DraftCandidate(7, 0.99, 8)], 64) == {}


@given(
    rows=st.integers(1, 64),
    costs=st.tuples(*[st.floats(0.0, 0.05) for _ in range(4)]),
    candidates=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 10)), max_size=8),
    budget=st.integers(0, 40),
)
def test_drafts_are_bounded_and_always_raise_the_rate(rows, costs, candidates, budget) -> None:
    cost = DraftCost(costs[0] + 1e-3, *costs[1:])
    chosen = plan_drafts(
        cost, rows, [DraftCandidate(i, r, n) for i, (r, n) in enumerate(candidates)], budget
    )
    assert sum(chosen.values()) <= budget
    assert all(0 < k <= candidates[i][1] for i, k in chosen.items())
    if chosen:
        tokens = rows + sum(expected_tokens(candidates[i][0], k) - 1 for i, k in chosen.items())
        seconds = cost.decode_s(rows) + cost.switch_s + cost.per_draft_s * sum(chosen.values())
        assert tokens / seconds > rows / cost.decode_s(rows)


def test_acceptance_counts_trials_and_forgets() -> None:
    record = Acceptance().after(5, 3)  # 3 accepted, the 4th rejected: 4 trials
    assert (record.accepted, record.trials) == pytest.approx((0.8 + 3, 1.6 + 4))
    whole = record.after(3, 3)  # all accepted: no failed trial
    assert (whole.accepted, whole.trials) == pytest.approx((3.8 * 0.8 + 3, 5.6 * 0.8 + 3))
    drifted = Acceptance(0.0, 10.0).toward_prior()
    assert (drifted.accepted, drifted.trials) == pytest.approx((0.05, 9.6))
    assert Acceptance().rate == 0.5


def test_expected_tokens() -> None:
    assert expected_tokens(0.5, 3) == 1.875
    assert expected_tokens(0.0, 5) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_s": -1.0, "per_row_s": 0.0, "switch_s": 0.0, "per_draft_s": 0.0}, "base_s"),
        ({"base_s": 0.0, "per_row_s": 0.0, "switch_s": 0.0, "per_draft_s": 0.0}, "one row"),
        ({"base_s": 1.0, "per_row_s": 0.0, "switch_s": float("nan"), "per_draft_s": 0.0}, "switch"),
    ],
)
def test_impossible_costs_are_refused(kwargs, message) -> None:
    with pytest.raises(DraftBudgetError, match=message):
        DraftCost(**kwargs)


def test_impossible_counts_are_refused() -> None:
    with pytest.raises(DraftBudgetError, match="accepted 4 of 3"):
        Acceptance().after(3, 4)
    with pytest.raises(DraftBudgetError, match="decoding rows"):
        plan_drafts(COST, 0, [], 4)

"""StepPrices: the decode step's line and the draft token's price, as the engine's steps say."""

from __future__ import annotations

import pytest

from nanoserve.core.draft_budget import DraftCost
from nanoserve.runtime.engine.timing.step_prices import DRIFT, SMOOTHING, StepPrices, row_bucket

# the boot: 10 ms + 1 ms a row; a draft token 0.8 ms; a verify step 0.5 ms more
BOOT = DraftCost(base_s=0.010, per_row_s=0.001, switch_s=0.0005, per_draft_s=0.0008)


def test_before_any_step_the_boot_prices() -> None:
    prices = StepPrices(BOOT, max_rows=32)
    assert prices.decode_s(4) == pytest.approx(0.014)
    assert prices.line() == pytest.approx((0.010, 0.001))
    assert prices.draft_s(4) == 0.001  # the row's 1 ms, the dearer of the boot's two
    cost = prices.cost(4)
    assert (cost.base_s, cost.per_row_s, cost.switch_s, cost.per_draft_s) == pytest.approx(
        (0.014, 0.0, 0.0005, 0.001)
    )


def test_decode_steps_fit_a_line_over_row_counts() -> None:
    prices = StepPrices(BOOT, max_rows=32)
    for _ in range(100):  # served: 12 ms + 1.5 ms a row
        prices.observe(2, 0, 0.015)
        prices.observe(30, 0, 0.057)
    base, per_row = prices.line()
    assert base == pytest.approx(0.012, rel=0.02)
    assert per_row == pytest.approx(0.0015, rel=0.02)


def test_one_row_count_alone_keeps_the_boots_slope_elsewhere() -> None:
    prices = StepPrices(BOOT, max_rows=32)
    for _ in range(100):
        prices.observe(1, 0, 0.016)  # one stream, 6 ms over the boot's figure
    assert prices.decode_s(1) == pytest.approx(0.016, rel=0.03)
    assert prices.decode_s(32) > prices.decode_s(1)


def test_a_burst_of_stolen_time_counts_at_most_twice_the_line() -> None:
    spiked, clipped = StepPrices(BOOT, max_rows=32), StepPrices(BOOT, max_rows=32)
    spiked.observe(4, 0, 1.0)
    clipped.observe(4, 0, 2 * 0.014)
    assert spiked.line() == clipped.line()


def test_a_verify_step_prices_its_bucket_beyond_the_decode_step() -> None:
    prices = StepPrices(BOOT, max_rows=32)
    decode = prices.decode_s(3)
    prices.observe(3, 6, decode + 0.0005 + 6 * 0.003)  # 3 ms a draft token
    assert prices.draft_s(3) == pytest.approx(0.001 + SMOOTHING * 0.002)
    assert prices.draft_s(4) == prices.draft_s(3)  # one bucket: 3-4 rows
    assert prices.draft_s(5) == 0.001  # another: the start
    before = prices.draft_s(3)
    prices.observe(3, 0, decode)  # a decode step pulls it back towards the start
    assert prices.draft_s(3) == pytest.approx(before + DRIFT * (0.001 - before))


def test_a_proposers_seconds_price_its_tokens_by_bucket() -> None:
    boot = DraftCost(0.010, 0.001, 0.0005, 0.0008, propose_s=0.004)
    prices = StepPrices(boot, max_rows=32)
    assert prices.propose_s(1) == 0.004 and prices.cost(1).propose_s == 0.004
    prices.observe_proposal(1, 5, 0.030)  # 6 ms a token
    assert prices.propose_s(1) == pytest.approx(0.004 + SMOOTHING * 0.002)
    prices.observe_proposal(3, 12, 0.024)  # 3 rows of 4 tokens, 2 ms a token
    assert prices.propose_s(4) == pytest.approx(0.004 - SMOOTHING * 0.002)
    assert prices.propose_s(2) == 0.004  # no proposal seen at 2 rows: the boot's
    prices.observe_proposal(1, 5, 10.0)  # a stall counts at most 4x the price
    assert prices.propose_s(1) == pytest.approx(0.0045 + SMOOTHING * 3 * 0.0045)
    assert prices.as_dict()["propose_s"] == {1: prices.propose_s(1), 4: prices.propose_s(4)}


def test_row_buckets() -> None:
    assert [row_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 64]

"""StepFootprint: a decode step's peak memory, to exact bytes on a tiny geometry."""

from __future__ import annotations

import pytest

from nanoserve.core.errors import GeometryError
from nanoserve.core.step_footprint import StepFootprint
from nanoserve.core.warm_list import warm_budget_bytes

TINY = StepFootprint(
    num_heads=4, num_kv_heads=2, head_dim=8, vocab_size=100, pool_bytes=4, accum_bytes=8
)


def test_attention_bytes_to_the_byte() -> None:
    rows, width = 2, 16
    kv = rows * 2 * width * 8  # 512 elements each of K and V
    expected = (
        2 * kv * 8  # K and V in float64
        + kv * 4  # one of them still in the pool's float32 while it converts
        + rows * 2 * width * 8  # the gather's int64 index
        + rows * width * 9  # the slot rectangle (int64) and its mask (bool)
        + 3 * rows * 4 * width * 8  # scores, softmax, weights
    )
    assert TINY.attention_bytes(rows, width) == expected == 14_112


def test_in_place_attention_holds_only_scores_and_output() -> None:
    # nanoserve's CPU kernels read K/V in place: one float32 score per head and position (plus
    # a 16-wide tail) and the float32 output.
    in_place = StepFootprint(4, 2, 8, 100, pool_bytes=2, accum_bytes=4, gathers=False)
    assert in_place.attention_bytes(2, 16) == 2 * 4 * (16 + 16) * 4 + 2 * 4 * 8 * 4 == 1_280
    assert in_place.peak_bytes(2, 16) == in_place.logits_bytes(2) == 1_600


def test_no_conversion_when_the_pool_is_in_the_accumulation_dtype() -> None:
    same = StepFootprint(4, 2, 8, 100, pool_bytes=2, accum_bytes=2)
    kv = 1 * 2 * 10 * 8
    scores = 3 * 1 * 4 * 10 * 4  # statistics never below float32
    assert same.attention_bytes(1, 10) == 2 * kv * 2 + 1 * 2 * 10 * 8 + 10 * 9 + scores


def test_the_peak_is_attention_or_logits_whichever_is_larger() -> None:
    assert TINY.logits_bytes(3) == 2 * 3 * 100 * 4
    assert TINY.peak_bytes(3, 1) == TINY.logits_bytes(3)  # a narrow step: the logits
    assert TINY.peak_bytes(3, 64) == TINY.attention_bytes(3, 64)


def test_the_scores_are_the_small_part() -> None:
    """What the build log's budget counted, against the real peak: SmolLM2's geometry."""
    scores = warm_budget_bytes(32, 9, 4096)
    ratios = [
        StepFootprint(9, 3, 64, 49152, pool_bytes, accum_bytes).attention_bytes(32, 4096) / scores
        for pool_bytes, accum_bytes in ((2, 2), (4, 4), (4, 8))  # bf16, fp32, fp32 invariant
    ]
    assert [round(r, 2) for r in ratios] == [25.25, 46.58, 113.58]


def test_width_ceiling_inverts_the_peak() -> None:
    budget = 100_000
    ceiling = TINY.width_ceiling(budget, 2)
    assert TINY.peak_bytes(2, ceiling) <= budget < TINY.peak_bytes(2, ceiling + 1)
    assert TINY.width_ceiling(TINY.logits_bytes(4) - 1, 4) == 0
    with pytest.raises(GeometryError):
        TINY.width_ceiling(budget, 0)

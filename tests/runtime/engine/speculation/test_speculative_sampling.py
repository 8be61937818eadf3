"""Unseeded sampling under speculation draws from the target's distribution.

The tiny Llama (fp32) samples 3 tokens with top_k=3, so the target's joint distribution has 27
outcomes, each known exactly from 13 greedy runs that report the top-3 logprobs. Every decode
row drafts the most likely continuation (so drafts are accepted about half the time and
rejected the rest); 3,000 requests are sampled from the engine's own generator, and their
first three tokens are tested against the exact distribution with Pearson's chi-squared test
(cells expected below 5 merged). The engine's seed is fixed, so the test is deterministic: it
passes at p > 0.001 and, as a check of its power, rejects the distribution that keeps every
draft at p < 1e-6.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
import torch

from nanoserve.core.draft_budget import DraftCost
from nanoserve.runtime.engine.config.speculative_config import SpeculativeConfig
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from tests.runtime.capture_helpers import speculator_of

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PROMPT = (17, 40, 9, 71, 33, 17, 40, 9)
TOP_K, TEMPERATURE, SAMPLES = 3, 1.3, 3000


def chi_squared_p(
    observed: Mapping[tuple[int, ...], int], expected: Mapping[tuple[int, ...], float], total: int
) -> float:
    cells: list[tuple[float, float]] = []
    rest_o, rest_e = 0.0, 0.0
    for outcome, p in expected.items():
        if total * p < 5:
            rest_o, rest_e = rest_o + observed.get(outcome, 0), rest_e + total * p
        else:
            cells.append((observed.get(outcome, 0), total * p))
    if rest_e > 0:
        cells.append((rest_o, rest_e))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = torch.tensor((len(cells) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


def test_unseeded_sampling_with_speculation_draws_from_the_target(make_tiny_engine) -> None:
    # The exact distribution: each prefix's top-3 log-probabilities, renormalised at TEMPERATURE.
    exact = make_tiny_engine()
    prefixes: list[tuple[int, ...]] = [()]
    step: dict[tuple[int, ...], dict[int, float]] = {}
    for depth in range(3):
        for i, prefix in enumerate(prefixes):
            exact.add_request(
                f"{depth}/{i}",
                PROMPT + prefix,
                SamplingParams(max_tokens=1, temperature=0.0, logprobs=TOP_K, ignore_eos=True),
            )
        tops = {d.request_id: d.top_logprobs[0] for d in exact.run_until_done() if d.top_logprobs}
        for i, prefix in enumerate(prefixes):
            scaled = {t: lp / TEMPERATURE for t, lp in tops[f"{depth}/{i}"]}
            norm = math.log(sum(math.exp(v) for v in scaled.values()))
            step[prefix] = {t: math.exp(v - norm) for t, v in scaled.items()}
        prefixes = [(*p, t) for p in prefixes for t in step[p]]
    target: dict[tuple[int, ...], float] = {
        (a, b, c): step[()][a] * step[(a,)][b] * step[(a, b)][c] for a, b, c in prefixes
    }
    assert math.isclose(sum(target.values()), 1.0, rel_tol=1e-9)

    def likeliest(prefix: tuple[int, ...]) -> int:
        return max(step[prefix], key=step[prefix].__getitem__)

    def drafts(rows: list, budget: int) -> dict[int, tuple[int, ...]]:
        chosen = {}
        for seq in rows:
            prefix, draft = tuple(seq.output_ids), list[int]()
            while len(prefix) < 3 and len(draft) < 2:
                draft.append(likeliest(prefix))
                prefix += (draft[-1],)
            if draft and len(seq.output_ids) + len(draft) < seq.params.max_tokens:
                chosen[seq.seq_id] = tuple(draft)
        return chosen

    engine = make_tiny_engine(
        speculative=SpeculativeConfig(num_speculative_tokens=2),
        max_batch=32,
        max_waiting=SAMPLES,
        seed=11,
    )
    assert engine.speculator is not None
    speculator_of(engine).cost = DraftCost(base_s=1.0, per_row_s=0.0, switch_s=0.0, per_draft_s=0.0)
    engine.speculator.calibrate = False
    engine.scheduler.drafter = drafts
    params = SamplingParams(max_tokens=4, temperature=TEMPERATURE, top_k=TOP_K, ignore_eos=True)
    for i in range(SAMPLES):
        engine.add_request(str(i), PROMPT, params)
    outputs: dict[str, list[int]] = {}
    for delta in engine.run_until_done():
        outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
    observed: dict[tuple[int, ...], int] = {}
    for tokens in outputs.values():
        observed[tuple(tokens[:3])] = observed.get(tuple(tokens[:3]), 0) + 1

    stats = speculator_of(engine).stats
    assert stats.drafts > SAMPLES  # rows verified drafts ...
    assert 0.2 < stats.acceptance_rate < 0.9  # ... and kept some, not all
    assert chi_squared_p(observed, target, SAMPLES) > 1e-3

    # Power: the distribution that keeps every draft is refused by the same test.
    greedy_after_first = {
        (a, b, c): step[()][a] * (b == likeliest((a,))) * (c == likeliest((a, b)))
        for a, b, c in prefixes
    }
    skewed: dict[tuple[int, ...], float] = {
        k: 0.5 * v + 0.5 * target[k] for k, v in greedy_after_first.items()
    }
    assert chi_squared_p(observed, skewed, SAMPLES) < 1e-6

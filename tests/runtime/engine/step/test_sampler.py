"""The sampler on tiny vocabularies: masks, biases and penalties to exact values."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step.sampler import SampleRow, sample

pytestmark = pytest.mark.usefixtures("single_torch_thread")

GREEDY = SamplingParams(temperature=0.0)
# A 4-token distribution whose cumulative masses (0.4, 0.7, 0.9, 1.0) sit well clear of the
# thresholds used below, so float rounding cannot move a token across a mask's edge.
PROBS = (0.4, 0.3, 0.2, 0.1)
LOGITS = [math.log(p) for p in PROBS]


def row(
    params: SamplingParams,
    output_ids: tuple[int, ...] = (),
    prompt_ids: tuple[int, ...] = (0,),
    seed: int | None = None,
) -> SampleRow:
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return SampleRow(params, prompt_ids, output_ids, generator)


def support(logits: list[float], params: SamplingParams, draws: int = 4000) -> set[int]:
    """Every token drawn in `draws` rows of the same logits (seeded: the test is deterministic)."""
    torch.manual_seed(1234)
    batch = torch.tensor([logits] * draws)
    return set(sample(batch, [row(params)] * draws).token_ids)


def frequencies(logits: list[float], params: SamplingParams, draws: int) -> list[float]:
    torch.manual_seed(99)
    batch = torch.tensor([logits] * draws)
    counts = Counter(sample(batch, [row(params)] * draws).token_ids)
    return [counts[t] / draws for t in range(len(logits))]


# -- greedy ----------------------------------------------------------------------------------------


def test_greedy_is_argmax() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [5.0, 4.0, 3.0, 2.0], [-3.0, -2.0, -1.5, -1.6]])
    result = sample(logits, [row(GREEDY)] * 3)
    assert result.token_ids == [1, 0, 2]
    assert result.logprobs is None and result.top_logprobs is None


def test_greedy_ignores_top_k_top_p_min_p() -> None:
    params = SamplingParams(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9)
    assert sample(torch.tensor([LOGITS[::-1]]), [row(params)]).token_ids == [3]


def test_greedy_rows_stay_greedy_in_a_sampled_batch() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([LOGITS[::-1]] * 64)
    rows = [row(GREEDY) if i % 2 else row(SamplingParams(temperature=1.0)) for i in range(64)]
    tokens = sample(logits, rows).token_ids
    assert tokens[1::2] == [3] * 32
    assert len(set(tokens[0::2])) > 1  # the sampled rows really sampled


def test_input_logits_are_not_modified() -> None:
    logits = torch.tensor([LOGITS])
    before = logits.clone()
    params = SamplingParams(
        temperature=0.5, top_k=2, min_p=0.1, logit_bias={3: 4.0}, repetition_penalty=1.5
    )
    sample(logits, [row(params, output_ids=(0, 0))])
    assert torch.equal(logits, before)


# -- temperature and the filters -------------------------------------------------------------------


def test_temperature_one_draws_from_softmax() -> None:
    freq = frequencies(LOGITS, SamplingParams(temperature=1.0), draws=20000)
    assert freq == pytest.approx(PROBS, abs=0.015)


def test_temperature_sharpens_and_flattens() -> None:
    # At T the probabilities are softmax(logits / T) = p^(1/T), renormalised.
    for temperature in (0.5, 2.0):
        powered = [p ** (1 / temperature) for p in PROBS]
        expected = [p / sum(powered) for p in powered]
        freq = frequencies(LOGITS, SamplingParams(temperature=temperature), draws=20000)
        assert freq == pytest.approx(expected, abs=0.015)


def test_low_temperature_is_near_greedy() -> None:
    assert support(LOGITS, SamplingParams(temperature=0.01), draws=500) == {0}


@pytest.mark.parametrize(
    ("kwargs", "allowed"),
    [
        ({}, {0, 1, 2, 3}),
        ({"top_k": 1}, {0}),
        ({"top_k": 2}, {0, 1}),
        ({"top_k": 3}, {0, 1, 2}),
        ({"top_k": 4}, {0, 1, 2, 3}),
        ({"top_k": 50}, {0, 1, 2, 3}),  # larger than the vocabulary: off
        ({"top_p": 0.35}, {0}),  # the top token always stays
        ({"top_p": 0.6}, {0, 1}),  # masses before each token: 0, 0.4, 0.7, 0.9
        ({"top_p": 0.8}, {0, 1, 2}),
        ({"top_p": 0.95}, {0, 1, 2, 3}),
        ({"min_p": 0.2}, {0, 1, 2, 3}),  # floor 0.08
        ({"min_p": 0.3}, {0, 1, 2}),  # floor 0.12
        ({"min_p": 0.6}, {0, 1}),  # floor 0.24
        ({"min_p": 0.9}, {0}),  # floor 0.36
        # top_p applies to the top-k renormalised mass: 0.444, 0.333, 0.222 -> before 0, .44, .78
        ({"top_k": 3, "top_p": 0.75}, {0, 1}),
        ({"top_k": 3, "top_p": 0.8}, {0, 1, 2}),
        # min_p after top_k: of 0.571, 0.429 the floor 0.4 * 0.571 = 0.229 keeps both
        ({"top_k": 2, "min_p": 0.4}, {0, 1}),
    ],
)
def test_filter_masks_are_exact(kwargs: dict, allowed: set[int]) -> None:
    # Shuffle the token order so the masks cannot lean on ids being sorted by probability.
    order = [2, 0, 3, 1]  # token order[i] has probability PROBS[i]
    logits = [0.0] * 4
    for rank, token in enumerate(order):
        logits[token] = LOGITS[rank]
    drawn = support(logits, SamplingParams(temperature=1.0, **kwargs))
    assert drawn == {order[rank] for rank in allowed}


def test_top_k_with_temperature_keeps_the_same_set() -> None:
    assert support(LOGITS, SamplingParams(temperature=1.7, top_k=2)) == {0, 1}
    assert support(LOGITS, SamplingParams(temperature=0.3, top_k=3), draws=20000) == {0, 1, 2}


def test_top_p_applies_after_temperature() -> None:
    # At T=2 the masses are .325, .282, .230, .163 (before each: 0, .33, .61, .84); at T=1 the
    # masses before each token are 0, .4, .7, .9. top_p=0.65 keeps three tokens at T=2, two at T=1.
    assert support(LOGITS, SamplingParams(temperature=2.0, top_p=0.65)) == {0, 1, 2}
    assert support(LOGITS, SamplingParams(temperature=1.0, top_p=0.65)) == {0, 1}


def test_filters_are_per_row() -> None:
    torch.manual_seed(5)
    draws = 2000
    logits = torch.tensor([LOGITS] * (2 * draws))
    rows = [row(SamplingParams(top_k=1))] * draws + [row(SamplingParams(top_p=0.8))] * draws
    tokens = sample(logits, rows).token_ids
    assert set(tokens[:draws]) == {0}
    assert set(tokens[draws:]) == {0, 1, 2}


# -- logit bias and penalties ----------------------------------------------------------------------


def test_logit_bias_moves_the_greedy_choice() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]])
    rows = [row(SamplingParams(temperature=0.0, logit_bias={0: 2.5})), row(GREEDY)]
    assert sample(logits, rows).token_ids == [0, 2]
    # 0 + 1.9 < 2: not enough
    assert sample(
        logits[:1], [row(SamplingParams(temperature=0.0, logit_bias={0: 1.9}))]
    ).token_ids == [2]


def test_logit_bias_minus_100_bans_a_token() -> None:
    params = SamplingParams(temperature=1.0, logit_bias={0: -100.0, 1: -100.0})
    assert support(LOGITS, params) == {2, 3}


def two_token_choice(logits: list[float], params: SamplingParams, **kwargs) -> int:
    return sample(torch.tensor([logits]), [row(params, **kwargs)]).token_ids[0]


@pytest.mark.parametrize(
    ("penalty", "expected"),
    # Token 0 (logit 3.0) was generated; token 1 (logit 2.0) was not. 3 / p vs 2: the edge is 1.5.
    [(1.0, 0), (1.45, 0), (1.55, 1), (2.0, 1)],
)
def test_repetition_penalty_divides_positive_logits(penalty: float, expected: int) -> None:
    params = SamplingParams(temperature=0.0, repetition_penalty=penalty)
    assert two_token_choice([3.0, 2.0], params, output_ids=(0,)) == expected


@pytest.mark.parametrize(
    ("penalty", "expected"),
    # Token 0 (logit -1.0) was seen; token 1 (-1.8) was not. -1 * p vs -1.8: the edge is 1.8.
    [(1.75, 0), (1.85, 1)],
)
def test_repetition_penalty_multiplies_negative_logits(penalty: float, expected: int) -> None:
    params = SamplingParams(temperature=0.0, repetition_penalty=penalty)
    assert two_token_choice([-1.0, -1.8], params, output_ids=(0,)) == expected


def test_repetition_penalty_counts_the_prompt_and_not_the_count() -> None:
    params = SamplingParams(temperature=0.0, repetition_penalty=1.6)
    # In the prompt only: 3 / 1.6 = 1.875 < 2.
    assert two_token_choice([3.0, 2.0], params, prompt_ids=(0,)) == 1
    # Seen five times is penalised once, like once: 3 / 1.4 = 2.14 > 2.
    params = SamplingParams(temperature=0.0, repetition_penalty=1.4)
    assert two_token_choice([3.0, 2.0], params, output_ids=(0,) * 5) == 0


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    # Token 0 (logit 1.0) was generated 3 times; token 1 has logit 0.
    [
        ({"frequency_penalty": 0.3}, 0),  # 1 - 0.9 = 0.1
        ({"frequency_penalty": 0.36}, 1),  # 1 - 1.08 < 0
        ({"presence_penalty": 0.95}, 0),  # 1 - 0.95 = 0.05: once, not per count
        ({"presence_penalty": 1.05}, 1),
        ({"presence_penalty": 0.5, "frequency_penalty": 0.15}, 0),  # 1 - 0.5 - 0.45 = 0.05
        ({"presence_penalty": 0.5, "frequency_penalty": 0.2}, 1),  # 1 - 0.5 - 0.6 < 0
        ({"frequency_penalty": -0.5}, 0),  # a negative penalty encourages repeats
    ],
)
def test_presence_and_frequency_penalties(kwargs: dict, expected: int) -> None:
    params = SamplingParams(temperature=0.0, **kwargs)
    assert two_token_choice([1.0, 0.0], params, output_ids=(0, 0, 0)) == expected


def test_negative_frequency_penalty_exact_edge() -> None:
    # Token 1 (logit 0.0) was generated twice; token 0 has 1.0. 0 + 2 * 0.45 < 1 < 2 * 0.55.
    assert (
        two_token_choice(
            [1.0, 0.0], SamplingParams(temperature=0.0, frequency_penalty=-0.45), output_ids=(1, 1)
        )
        == 0
    )
    assert (
        two_token_choice(
            [1.0, 0.0], SamplingParams(temperature=0.0, frequency_penalty=-0.55), output_ids=(1, 1)
        )
        == 1
    )


def test_presence_and_frequency_ignore_the_prompt() -> None:
    params = SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=2.0)
    assert two_token_choice([1.0, 0.0], params, prompt_ids=(0, 0, 0)) == 0


def test_penalties_are_per_row() -> None:
    logits = torch.tensor([[3.0, 2.0]] * 2)
    rows = [
        row(SamplingParams(temperature=0.0, repetition_penalty=2.0), output_ids=(0,)),
        row(GREEDY, output_ids=(0,)),
    ]
    assert sample(logits, rows).token_ids == [1, 0]


# -- seeds -----------------------------------------------------------------------------------------


def test_seeded_row_ignores_its_batch() -> None:
    """Same seed, same logits: the same tokens, whatever shares the batch and however many
    unseeded draws happen around it."""
    vocab = 16
    target = torch.linspace(-1.0, 1.0, vocab)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    others = [
        SamplingParams(temperature=1.0),
        GREEDY,
        SamplingParams(temperature=0.7, top_k=3, seed=8),
        SamplingParams(temperature=1.3, min_p=0.1),
    ]

    def draws(neighbours: int, position: int) -> list[int]:
        assert params.seed is not None
        generator = torch.Generator().manual_seed(params.seed)
        tokens = []
        for step in range(60):
            torch.manual_seed(1000 + 17 * step + neighbours)  # the unseeded rows' noise varies
            batch_params = [others[i % len(others)] for i in range(neighbours)]
            batch_params.insert(position, params)
            rows = [SampleRow(p, (0,), (), None) for p in batch_params]
            rows[position] = SampleRow(params, (0,), (), generator)
            logits = torch.randn(len(rows), vocab)
            logits[position] = target
            tokens.append(sample(logits, rows).token_ids[position])
        return tokens

    alone = draws(0, 0)
    assert len(set(alone)) > 4  # it really samples
    assert draws(1, 1) == alone
    assert draws(5, 0) == alone
    assert draws(9, 4) == alone
    # And a different seed gives a different stream (the seed is what decides).
    generator = torch.Generator().manual_seed(8)
    other = [
        sample(target[None], [SampleRow(params, (0,), (), generator)]).token_ids[0]
        for _ in range(60)
    ]
    assert other != alone


# -- logprobs --------------------------------------------------------------------------------------


def test_logprobs_are_log_softmax_of_raw_logits() -> None:
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.0, 0.0], [1.2, 1.0, 1.5, -2.0, 0.5]])
    params = [
        SamplingParams(temperature=0.0, logprobs=3, logit_bias={0: 10.0}),
        SamplingParams(temperature=0.0, logprobs=0, repetition_penalty=2.0),
    ]
    result = sample(logits, [row(params[0]), row(params[1], output_ids=(2,), prompt_ids=(3,))])
    expected = torch.log_softmax(logits.double(), dim=-1)
    # The bias picked token 0, and the penalty (1.5 / 2 < 1.2) token 0; logprobs still describe the raw logits.
    assert result.token_ids == [0, 0]
    assert result.logprobs == pytest.approx(
        [expected[0, 0].item(), expected[1, 0].item()], abs=1e-6
    )
    assert result.top_logprobs is not None
    top = result.top_logprobs[0]
    assert [t for t, _ in top] == [1, 3, 0]  # raw ranks: the +10 bias on 0 is not seen
    assert [lp for _, lp in top] == pytest.approx(
        [expected[0, 1].item(), expected[0, 3].item(), expected[0, 0].item()], abs=1e-6
    )
    assert result.top_logprobs[1] == []  # logprobs=0: the chosen token's only


def test_logprobs_only_for_rows_that_ask() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]] * 3)
    rows = [row(GREEDY), row(SamplingParams(temperature=0.0, logprobs=2)), row(GREEDY)]
    result = sample(logits, rows)
    assert result.top_logprobs is not None
    assert [len(t) for t in result.top_logprobs] == [0, 2, 0]
    assert [t for t, _ in result.top_logprobs[1]] == [2, 1]


def test_top_logprobs_width_is_per_row() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 2)
    rows = [
        row(SamplingParams(temperature=0.0, logprobs=1)),
        row(SamplingParams(temperature=0.0, logprobs=4)),
    ]
    result = sample(logits, rows)
    assert result.top_logprobs is not None
    assert [t for t, _ in result.top_logprobs[0]] == [3]
    assert [t for t, _ in result.top_logprobs[1]] == [3, 2, 1, 0]
    # log-probabilities of a 4-token distribution sum (as probabilities) to one
    assert sum(math.exp(lp) for _, lp in result.top_logprobs[1]) == pytest.approx(1.0, abs=1e-6)


def test_sampled_token_logprob_matches_its_token() -> None:
    torch.manual_seed(3)
    logits = torch.randn(32, 10)
    result = sample(logits, [row(SamplingParams(temperature=1.0, logprobs=0))] * 32)
    expected = torch.log_softmax(logits, dim=-1)
    assert result.logprobs == pytest.approx(
        [expected[i, t].item() for i, t in enumerate(result.token_ids)], abs=1e-6
    )

"""SamplingParams: every out-of-range field is refused at construction, naming the field."""

from __future__ import annotations

import math

import pytest

from nanoserve.runtime.engine.requests.sampling_params import (
    MAX_TOP_LOGPROBS,
    SamplingParams,
    SamplingParamsError,
)


def test_defaults_are_valid_and_sampled() -> None:
    params = SamplingParams()
    assert params.max_tokens == 16
    assert params.temperature == 1.0
    assert not params.greedy
    assert params.n == 1
    assert params.logprobs is None


def test_temperature_zero_is_greedy() -> None:
    assert SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=1e-3).greedy


def test_fields_are_kept_as_given() -> None:
    """Frozen and never rewritten: lists stay lists, -1 stays -1 (off, like 0)."""
    params = SamplingParams(stop=["###"], stop_token_ids=[7, 9], top_k=-1)
    assert (params.stop, params.stop_token_ids, params.top_k) == (["###"], [7, 9], -1)
    assert SamplingParams(stop=("a", "bc")).stop == ("a", "bc")
    with pytest.raises(SamplingParamsError, match="a list of one"):
        SamplingParams(stop="###")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 2.0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.01}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": "0.7"}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_p": None}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"min_p": -0.01}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"seed": 1.0}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
        ({"frequency_penalty": -2.1}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 2.5}, "repetition_penalty"),
        ({"repetition_penalty": "1.1"}, "repetition_penalty"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": MAX_TOP_LOGPROBS + 1}, "logprobs"),
        ({"logprobs": 2.0}, "logprobs"),
        ({"n": 0}, "n"),
        ({"n": -1}, "n"),
        ({"n": 65}, "n"),
        ({"stop": [""]}, "stop"),
        ({"stop": [3]}, "stop"),
        ({"stop": [f"s{i}" for i in range(17)]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": [1.0]}, "stop_token_ids"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"logit_bias": {5: 100.5}}, "logit_bias"),
        ({"logit_bias": {5: -101.0}}, "logit_bias"),
        ({"logit_bias": {5: math.nan}}, "logit_bias"),
        ({"logit_bias": {5: "high"}}, "logit_bias"),
        ({"logit_bias": [(5, 1.0)]}, "logit_bias"),
        ({"logit_bias": {i: 1.0 for i in range(301)}}, "logit_bias"),  # past MAX_LOGIT_BIAS
    ],
)
def test_invalid_value_names_its_field(kwargs: dict, field: str) -> None:
    with pytest.raises(SamplingParamsError) as caught:
        SamplingParams(**kwargs)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert isinstance(caught.value, ValueError)  # callers may catch it as a ValueError


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 1},
        {"temperature": 0.0},
        {"temperature": 2.0},
        {"top_p": 1.0},
        {"top_p": 1e-6},
        {"top_k": 1},
        {"min_p": 1.0},
        {"seed": 0},
        {"seed": -5},
        {"presence_penalty": -2.0, "frequency_penalty": 2.0},
        {"repetition_penalty": 2.0},
        {"logprobs": 0},
        {"logprobs": MAX_TOP_LOGPROBS},
        {"n": 64},
        {"stop": [f"s{i}" for i in range(16)]},
        {"logit_bias": {0: -100.0, 319: 100}},
    ],
)
def test_boundary_values_are_accepted(kwargs: dict) -> None:
    SamplingParams(**kwargs)


def test_check_vocab_names_the_field() -> None:
    SamplingParams(logit_bias={319: 1.0}, stop_token_ids=[319]).check_vocab(320)
    with pytest.raises(SamplingParamsError) as caught:
        SamplingParams(logit_bias={320: 1.0}).check_vocab(320)
    assert caught.value.field == "logit_bias"
    with pytest.raises(SamplingParamsError) as caught:
        SamplingParams(stop_token_ids=[400]).check_vocab(320)
    assert caught.value.field == "stop_token_ids"


def test_frozen() -> None:
    params = SamplingParams()
    with pytest.raises(AttributeError):
        params.max_tokens = 3  # type: ignore[misc]

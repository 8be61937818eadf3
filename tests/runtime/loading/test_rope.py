"""Phi-3's longrope (the divisors chosen by the context served, and the attention factor) and
YaRN (the blend of each frequency, and its attention factor), as transformers computes them."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from nanoserve.runtime.errors import ConfigError
from nanoserve.runtime.loading.hf_config import config_to_hf
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.loading.rope import LongRope, Yarn
from nanoserve.runtime.model.rotary import rope_attention_factor, rope_inv_freq

SHORT = [1.0, 1.1, 1.3, 1.7, 2.0, 2.5, 3.0, 4.0]
LONG = [1.0, 2.0, 4.0, 8.0, 16.0, 16.0, 32.0, 32.0]


def phi3(**changes: Any) -> dict[str, Any]:
    return {
        "model_type": "phi3",
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "original_max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": SHORT,
            "long_factor": LONG,
        },
        **changes,
    }


@pytest.mark.parametrize(("served", "factors"), [(4096, SHORT), (4097, LONG)])
def test_the_served_context_picks_the_divisors_transformers_uses_past_it(
    served: int, factors: list[float]
) -> None:
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = ModelConfig.from_hf(phi3())
    expected, attention = ROPE_INIT_FUNCTIONS["longrope"](Phi3Config(**phi3()), "cpu", served)
    ours = rope_inv_freq(config, positions=served)
    assert torch.equal(ours, expected)
    assert torch.equal(
        ours, 1.0 / (torch.tensor(factors) * 10000.0 ** (torch.arange(0, 16, 2) / 16))
    )
    assert rope_attention_factor(config) == pytest.approx(attention)
    assert rope_attention_factor(config) == pytest.approx(
        math.sqrt(1 + math.log(2) / math.log(4096))
    )


def test_longrope_round_trips_and_is_checked() -> None:
    config = ModelConfig.from_hf(phi3())
    assert isinstance(config.rope_scaling, LongRope)
    assert ModelConfig.from_hf(config_to_hf(config)) == config
    bad = phi3(rope_parameters={**phi3()["rope_parameters"], "short_factor": SHORT[:3]})
    with pytest.raises(
        ConfigError, match="longrope short_factor must be 8 positive numbers, got 3"
    ):
        ModelConfig.from_hf(bad)


def qwen3_yarn(**params: Any) -> dict[str, Any]:
    return {
        "model_type": "qwen3",
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, **params},
    }


@pytest.mark.parametrize(
    "params",
    [
        # gpt-oss's: bounds not rounded
        {
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        {"factor": 4.0, "original_max_position_embeddings": 32768},  # Qwen3's, rounded
        # DeepSeek's mscale pair sets the attention factor
        {
            "factor": 40.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
        },
    ],
)
def test_yarn_is_transformers_bit_for_bit(params: dict[str, Any]) -> None:
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = qwen3_yarn(**params)
    expected, attention = ROPE_INIT_FUNCTIONS["yarn"](Qwen3Config(**raw), "cpu")
    config = ModelConfig.from_hf(raw)
    assert isinstance(config.rope_scaling, Yarn)
    assert torch.equal(rope_inv_freq(config), expected)
    assert rope_attention_factor(config) == attention
    assert config.rope_scaling.truncate is params.get("truncate", True)
    assert ModelConfig.from_hf(config_to_hf(config)) == config


def test_yarn_attention_factor_is_the_papers() -> None:
    config = ModelConfig.from_hf(qwen3_yarn(factor=32.0, original_max_position_embeddings=4096))
    assert rope_attention_factor(config) == pytest.approx(0.1 * math.log(32.0) + 1.0, rel=1e-12)
    with pytest.raises(ConfigError, match="original_max_position_embeddings=None"):
        ModelConfig.from_hf(qwen3_yarn(factor=4.0))

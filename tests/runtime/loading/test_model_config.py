from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError
from nanoserve.runtime.loading.hf_config import config_to_hf
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.loading.rope import LinearRope, RopeScaling
from nanoserve.runtime.model.rotary import rope_inv_freq
from tests.tiny_models import tiny_model_config

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _tiny_json(**changes: Any) -> dict[str, Any]:
    """A transformers 5 style config.json dict for a tiny Llama."""
    base: dict[str, Any] = {
        "model_type": "llama",
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    return {**base, **changes}


def _read(model_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((model_dir / name).read_text())


def test_from_hf_reads_a_saved_llama_config(tiny_llama_dir: Path) -> None:
    config = ModelConfig.from_hf(
        _read(tiny_llama_dir, "config.json"), _read(tiny_llama_dir, "generation_config.json")
    )
    assert config == ModelConfig(
        architecture="llama",
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rope_scaling=None,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        max_position_embeddings=256,
        eos_token_ids=(2,),
        bos_token_id=1,
    )
    assert (config.q_size, config.kv_size) == (64, 32)
    assert config == tiny_model_config()  # the shared tiny geometry is this model's


def test_qwen2_has_qkv_bias_although_its_config_does_not_say(tiny_qwen2_dir: Path) -> None:
    raw = _read(tiny_qwen2_dir, "config.json")
    assert "attention_bias" not in raw
    config = ModelConfig.from_hf(raw)
    assert (config.architecture, config.attention_bias, config.tie_word_embeddings) == (
        "qwen2",
        True,
        False,
    )


def test_transformers4_layout_with_llama3_scaling() -> None:
    raw = _tiny_json(rope_theta=500000.0)
    del raw["rope_parameters"]
    raw["rope_scaling"] = {**LLAMA3_SCALING, "type": "llama3"}
    del raw["rope_scaling"]["rope_type"]
    config = ModelConfig.from_hf(raw)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
    )


def test_head_dim_given_explicitly_is_kept() -> None:
    config = ModelConfig.from_hf(_tiny_json(head_dim=32))
    assert (config.head_dim, config.q_size, config.kv_size) == (32, 128, 64)


@pytest.mark.parametrize(
    ("generation", "config_eos", "expected"),
    [
        ({"eos_token_id": [2, 0, 2]}, 7, (2, 0)),  # generation_config wins; duplicates dropped
        ({"eos_token_id": 0}, 7, (0,)),
        (None, 7, (7,)),
        ({}, [3, 4], (3, 4)),
        (None, None, ()),
    ],
)
def test_eos_ids(
    generation: dict[str, Any] | None, config_eos: Any, expected: tuple[int, ...]
) -> None:
    config = ModelConfig.from_hf(_tiny_json(eos_token_id=config_eos), generation)
    assert config.eos_token_ids == expected


def test_unknown_architecture_is_named() -> None:
    with pytest.raises(UnsupportedModelError, match=r"^models/x/config.json: model_type 'gemma'"):
        ModelConfig.from_hf(_tiny_json(model_type="gemma"), source="models/x/config.json")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_key_value_heads": 3}, "num_kv_heads=3 does not divide num_heads=4"),
        ({"hidden_size": -64, "head_dim": 16}, "hidden_size=-64 must be a positive integer"),
        ({"hidden_size": 66}, "hidden_size=66 is not a multiple of num_attention_heads=4"),
        ({"intermediate_size": 128.0}, "intermediate_size=128.0 must be a positive integer"),
        ({"num_hidden_layers": True}, "num_layers=True must be a positive integer"),
        ({"vocab_size": None}, "required field 'vocab_size' is missing"),
        ({"head_dim": 15}, "head_dim=15 must be even"),
        ({"rms_norm_eps": 0}, "rms_norm_eps=0.0 must be a positive finite float"),
        ({"eos_token_id": 320}, "token id 320 is outside vocab_size=320"),
        ({"eos_token_id": "2"}, "eos_token_id='2' must be an integer or a list of integers"),
        (
            {"rope_parameters": {**LLAMA3_SCALING, "rope_theta": 1e4, "high_freq_factor": 1.0}},
            "high_freq_factor=1.0 must exceed low_freq_factor=1.0",
        ),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "lacks 'low_freq_factor'"),
    ],
)
def test_invalid_values_name_field_and_value(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ModelConfig.from_hf(_tiny_json(**changes), source="m/config.json")
    assert str(caught.value).startswith("m/config.json: ")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 4.0}}, "rope_type='dynamic'"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"mlp_bias": True}, "mlp_bias=True"),
        ({"model_type": "phi4"}, "model_type 'phi4' is not supported"),
        ({"model_type": "gemma3"}, "Gemma 3 with its vision tower"),
        ({"model_type": "gemma3_text", "final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ({"layer_types": ["full_attention", "linear_attention"]}, "'linear_attention'"),
    ],
)
def test_unsupported_variants_are_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf(_tiny_json(**changes))


def test_mistral_without_a_window_is_llama_shaped() -> None:
    config = ModelConfig.from_hf(_tiny_json(model_type="mistral", sliding_window=None))
    assert (config.architecture, config.attention_bias) == ("mistral", False)


def test_constructor_validates_too() -> None:
    config = ModelConfig.from_hf(_tiny_json())
    with pytest.raises(ConfigError, match="num_kv_heads=0 must be a positive integer"):
        dataclasses.replace(config, num_kv_heads=0)


@pytest.mark.parametrize("scaling", [None, LLAMA3_SCALING])
def test_to_hf_round_trips(scaling: dict[str, Any] | None) -> None:
    rope = {"rope_theta": 10000.0, **(scaling or {"rope_type": "default"})}
    config = ModelConfig.from_hf(_tiny_json(rope_parameters=rope, eos_token_id=[2, 0]))
    assert ModelConfig.from_hf(config_to_hf(config)) == config


def test_default_inv_freq_matches_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    raw = _tiny_json(rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    expected = LlamaRotaryEmbedding(LlamaConfig(**raw)).inv_freq
    ours = rope_inv_freq(ModelConfig.from_hf(raw))
    assert ours.dtype == torch.float32 and ours.shape == (8,)
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("factor", [8.0, 32.0])
def test_llama3_inv_freq_matches_transformers(factor: float) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # head_dim 64 and a 64-token original context put frequencies in all three bands
    rope = {**LLAMA3_SCALING, "factor": factor, "rope_theta": 10000.0}
    raw = _tiny_json(hidden_size=256, num_attention_heads=4, rope_parameters=rope)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**raw))
    ours = rope_inv_freq(ModelConfig.from_hf(raw))
    unscaled = rope_inv_freq(ModelConfig.from_hf(_tiny_json(hidden_size=256)))
    assert torch.equal(ours, expected)
    # all three bands are exercised: untouched, divided by factor, and blended
    assert bool((ours == unscaled).any())
    assert bool((ours == unscaled / factor).any())
    assert bool(((ours != unscaled) & (ours != unscaled / factor)).any())


def test_windows_of_mistral_and_qwen2_are_served_per_layer() -> None:
    mistral = ModelConfig.from_hf(_tiny_json(model_type="mistral", sliding_window=128))
    assert (mistral.sliding_window, mistral.sliding_layers) == (128, (0, 1))
    qwen2 = ModelConfig.from_hf(
        _tiny_json(
            model_type="qwen2", use_sliding_window=True, sliding_window=64, max_window_layers=1
        )
    )
    assert (qwen2.sliding_window, qwen2.sliding_layers) == (64, (1,))
    assert [qwen2.layer_window(i) for i in range(2)] == [None, 64]
    # A window no narrower than the context is no window (Mistral's 4096 at 4k).
    wide = ModelConfig.from_hf(_tiny_json(model_type="mistral", sliding_window=256))
    assert wide.sliding_window is None and wide.sliding_layers == ()


def test_gemma3_text_config_reads_every_delta() -> None:
    config = ModelConfig.from_hf(
        _tiny_json(
            model_type="gemma3_text",
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=4,
            num_hidden_layers=7,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        )
    )
    assert config.architecture == "gemma3" and config.hidden_act == "gelu_tanh"
    assert config.qk_norm and config.sandwich_norm and config.norm_offset == 1.0
    assert config.embedding_multiplier == 8.0  # sqrt(64)
    assert config.attention_scale == 24**-0.5
    assert (config.sliding_window, config.sliding_layers) == (4, (0, 1, 2, 3, 4, 6))
    assert (config.rope_theta, config.sliding_rope_theta) == (1e6, 1e4)
    assert config.rope_scaling == LinearRope(8.0)
    # The global layers' rotary is scaled, the sliding layers' is not.
    base = rope_inv_freq(config, sliding=True)
    assert torch.equal(base, 1.0 / 1e4 ** (torch.arange(0, 16, 2).float() / 16))
    assert torch.equal(
        rope_inv_freq(config), 1.0 / 1e6 ** (torch.arange(0, 16, 2).float() / 16) / 8
    )
    assert ModelConfig.from_hf(config_to_hf(config)) == config


def test_qwen3_and_smollm3_deltas() -> None:
    qwen3 = ModelConfig.from_hf(_tiny_json(model_type="qwen3", head_dim=32))
    assert qwen3.qk_norm and not qwen3.attention_bias and qwen3.head_dim == 32
    assert ModelConfig.from_hf(config_to_hf(qwen3)) == qwen3
    smol = ModelConfig.from_hf(_tiny_json(model_type="smollm3", num_hidden_layers=8))
    assert smol.no_rope_layers == (3, 7)  # every fourth layer, transformers' default
    given = ModelConfig.from_hf(
        _tiny_json(model_type="smollm3", no_rope_layers=[1, 0], num_hidden_layers=2)
    )
    assert given.no_rope_layers == (1,)
    assert ModelConfig.from_hf(config_to_hf(smol)) == smol


def test_phi3_reads_its_fused_projections_and_window() -> None:
    config = ModelConfig.from_hf(_tiny_json(model_type="phi3", sliding_window=64))
    assert config.fused_projections and config.hidden_act == "silu"
    assert (config.sliding_window, config.sliding_layers) == (64, (0, 1))
    assert ModelConfig.from_hf(config_to_hf(config)) == config


def test_a_partial_rotary_turns_the_first_dims_of_each_head() -> None:
    config = ModelConfig.from_hf(_tiny_json(model_type="phi3", partial_rotary_factor=0.75))
    assert (config.head_dim, config.rotary_dim, config.rope_dim) == (16, 12, 12)
    assert rope_inv_freq(config).shape == (6,)
    assert ModelConfig.from_hf(config_to_hf(config)) == config
    with pytest.raises(ConfigError, match=r"partial_rotary_factor=1.5 must be in \(0, 1\]"):
        ModelConfig.from_hf(_tiny_json(model_type="phi3", partial_rotary_factor=1.5))


def test_lfm2_reads_its_convolution_layers_and_mlp_width() -> None:
    """LFM2-1.2B's config: conv layers named by the attention ones (`full_attn_idxs`, the older
    form), `block_ff_dim` taken to 2/3, times its multiplier, up to a multiple of 256 (as its
    modules build it), `norm_eps` and a tied embedding (`tie_embedding`)."""
    raw = _tiny_json(
        model_type="lfm2",
        num_hidden_layers=6,
        full_attn_idxs=[2, 5],
        block_ff_dim=12288,
        block_ffn_dim_multiplier=1.0,
        block_multiple_of=256,
        conv_L_cache=3,
        norm_eps=1e-5,
        tie_embedding=True,
    )
    del raw["intermediate_size"], raw["rms_norm_eps"], raw["tie_word_embeddings"]
    config = ModelConfig.from_hf(raw)
    assert config.short_conv is not None
    assert (config.short_conv.layers, config.short_conv.kernel) == ((0, 1, 3, 4), 3)
    assert config.attention_layers == (2, 5)
    assert config.intermediate_size == 8192  # 12288 * 2/3, a multiple of 256 already
    assert config.qk_norm and config.tie_word_embeddings and config.rms_norm_eps == 1e-5
    assert config.state_shapes == ((64, 2),) * 4  # one [hidden, taps - 1] window a layer
    assert config.rope_theta == 10000.0  # the file's; LFM2's default would be 1e6
    assert ModelConfig.from_hf(config_to_hf(config)) == config


def test_lfm2_layer_types_name_the_convolutions() -> None:
    kinds = ["conv", "full_attention", "conv", "conv"]
    config = ModelConfig.from_hf(
        _tiny_json(model_type="lfm2", num_hidden_layers=4, layer_types=kinds, block_multiple_of=32)
    )
    assert config.short_conv is not None and config.short_conv.layers == (0, 2, 3)
    assert config.intermediate_size == 96  # int(128 * 2/3) = 85, up to a multiple of 32


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"layer_types": ["conv", "conv"]}, UnsupportedModelError, "all 2 layers are convolutions"),
        ({"conv_L_cache": 1}, ConfigError, "conv_L_cache=1 must be an integer >= 2"),
        ({"layer_types": ["conv", "mamba"]}, UnsupportedModelError, "layer type 'mamba'"),
    ],
)
def test_lfm2_configs_that_cannot_run_are_named(
    changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ModelConfig.from_hf(_tiny_json(model_type="lfm2", **changes))


QWEN3_5_TEXT: dict[str, Any] = {  # the shape of Qwen3.5-0.8B's text_config
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "num_hidden_layers": 24,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
    },
    "tie_word_embeddings": True,
    "eos_token_id": 248044,
}


def test_qwen3_5_reads_its_linear_attention_layers_and_gated_attention() -> None:
    """Its checkpoint with the vision tower: the text_config read, every fourth layer attends,
    the rest run gated DeltaNet with a [16, 128, 128] state and a window over q, k and v."""
    text = {**QWEN3_5_TEXT, "layer_types": QWEN3_5_TEXT["layer_types"] * 6}
    config = ModelConfig.from_hf({"model_type": "qwen3_5", "text_config": text})
    assert config.architecture == "qwen3_5"
    assert config.attention_layers == (3, 7, 11, 15, 19, 23)
    assert config.delta_net is not None and len(config.delta_net.layers) == 18
    assert config.state_shapes[:2] == ((6144, 3), (16, 128, 128))  # 2 * 2048 + 2048 channels
    assert (config.rotary_dim, config.rope_theta) == (64, 10_000_000.0)  # mrope as plain rope
    assert config.attn_output_gate and config.qk_norm and config.norm_offset == 1.0
    assert ModelConfig.from_hf(config_to_hf(config)) == config


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"layer_types": ["linear_attention"] * 4}, UnsupportedModelError, "all 4 layers are"),
        ({"linear_num_value_heads": 24}, ConfigError, "linear_num_value_heads=24 is not a mult"),
        ({"linear_conv_kernel_dim": 1}, ConfigError, "kernel=1 is not a size"),
        ({"layer_types": ["mamba"] * 4}, UnsupportedModelError, "layer type 'mamba'"),
    ],
)
def test_qwen3_5_configs_that_cannot_run_are_named(
    changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    text = {**QWEN3_5_TEXT, "num_hidden_layers": 4, **changes}
    with pytest.raises(error, match=message):
        ModelConfig.from_hf(text)


def test_qwen3_5_without_a_text_config_is_named() -> None:
    with pytest.raises(ConfigError, match="model_type 'qwen3_5' without a text_config object"):
        ModelConfig.from_hf({"model_type": "qwen3_5"})


GRANITE_4_H: dict[str, Any] = {  # a Granite 4.0-H Micro-like config.json
    "model_type": "granitemoehybrid",
    "vocab_size": 100352,
    "hidden_size": 2048,
    "shared_intermediate_size": 8192,
    "intermediate_size": 8192,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "layer_types": (["mamba"] * 9 + ["attention"]) * 4,
    "mamba_n_heads": 64,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "num_local_experts": 0,
    "position_embedding_type": "nope",
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "attention_multiplier": 0.0078125,
    "logits_scaling": 8.0,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "eos_token_id": 100257,
}


def test_granite_4_h_reads_its_mamba2_layers_and_multipliers() -> None:
    """Its own layer names ("mamba", "attention"), no rotary, the dense shared MLP's width."""
    config = ModelConfig.from_hf(GRANITE_4_H)
    assert config.architecture == "granitemoehybrid"
    assert config.attention_layers == (9, 19, 29, 39)
    assert config.mamba is not None and len(config.mamba.layers) == 36
    assert config.state_shapes[:2] == ((4096 + 2 * 128, 3), (64, 64, 128))
    assert config.no_rope_layers == tuple(range(40)) and config.intermediate_size == 8192
    assert (config.embedding_multiplier, config.residual_multiplier) == (12.0, 0.22)
    assert (config.attention_scale, config.logits_scaling) == (0.0078125, 8.0)
    assert ModelConfig.from_hf(config_to_hf(config)) == config


def test_granite_4_h_tiny_reads_its_experts_beside_the_mlp() -> None:
    """Tiny's shape: 64 experts of 512, 6 a token, beside the 1024-wide dense MLP."""
    tiny = {**GRANITE_4_H, "num_local_experts": 64, "num_experts_per_tok": 6,
            "intermediate_size": 512, "shared_intermediate_size": 1024}  # fmt: skip
    config = ModelConfig.from_hf(tiny)
    experts = config.experts
    assert experts is not None and experts.layers == tuple(range(40))
    assert (experts.num_experts, experts.experts_per_token, experts.intermediate_size) == (
        64,
        6,
        512,
    )
    assert (experts.scoring, experts.shared_size, experts.shared_is_mlp) == (
        "topk_softmax",
        1024,
        True,
    )
    assert config.intermediate_size == 1024
    assert ModelConfig.from_hf(config_to_hf(config)) == config


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (
            {"num_local_experts": 4, "num_experts_per_tok": 6},
            ConfigError,
            "num_experts_per_tok=6 exceeds num_experts=4",
        ),
        ({"layer_types": ["mamba"] * 40}, UnsupportedModelError, "all 40 layers are Mamba2"),
        ({"mamba_n_groups": 3}, ConfigError, "mamba_n_groups=3 does not divide mamba_n_heads=64"),
        ({"mamba_d_head": 32}, ConfigError, "mamba_n_heads=64 x mamba_d_head=32 is not"),
        ({"time_step_limit": [0.0, "x"]}, ConfigError, "time_step_limit holds 'x'"),
    ],
)
def test_granite_configs_that_cannot_run_are_named(
    changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ModelConfig.from_hf({**GRANITE_4_H, **changes})

"""The fields of a ModelConfig as a Hugging Face `config.json` spells them (transformers 4.x or
5.x layout): each family's names, defaults and deltas read into the one set of fields the
forward knows. `ModelConfig.from_hf` builds from these and checks them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError
from nanoserve.runtime.loading.architectures import HF_MODEL_TYPES
from nanoserve.runtime.loading.config_fields import (
    DEFAULT_MAX_POSITIONS,
    DEFAULT_RMS_NORM_EPS,
    activation,
    check_unbuilt_fields,
    granite_number,
    or_default,
    text_config,
    token_ids,
)
from nanoserve.runtime.loading.encoder_layers import ENCODER_MODEL_TYPES, encoder_fields
from nanoserve.runtime.loading.expert_layers import hf_experts
from nanoserve.runtime.loading.layer_pattern import (
    bidirectional_window,
    layer_types,
    no_rope_layers,
    sliding_window,
)
from nanoserve.runtime.loading.per_layer_inputs import gemma4_fields
from nanoserve.runtime.loading.recurrent_layers import (
    granite_mamba,
    lfm2_intermediate_size,
    lfm2_short_conv,
    qwen3_5_delta_net,
)
from nanoserve.runtime.loading.rope import number, parse_rope


def hf_model_fields(
    config_json: Mapping[str, Any],
    generation_config: Mapping[str, Any] | None = None,
    source: str = "config.json",
) -> dict[str, Any]:
    """ModelConfig's fields from a `config.json` dict. End-of-sequence ids come from
    `generation_config.json` when it names them (what `generate()` stops on), else from
    `config.json`."""
    model_type = config_json.get("model_type")
    if model_type in ENCODER_MODEL_TYPES:  # BERT, RoBERTa/XLM-R, NomicBERT
        return encoder_fields(config_json, source)
    if model_type in ("qwen3_5", "qwen3_5_moe"):  # with the vision tower: the text is read
        config_json = text_config(config_json, "qwen3_5_text", source)
        model_type = config_json.get("model_type")
    if model_type == "gemma4":  # with its vision and audio towers: the text is read
        config_json = text_config(config_json, "gemma4_text", source)
        model_type = config_json.get("model_type")
    if model_type == "gemma3":  # the multimodal checkpoint: a vision tower beside the text
        raise UnsupportedModelError(
            source,
            "model_type 'gemma3' (Gemma 3 with its vision tower) is not supported; the"
            " text-only checkpoints (model_type 'gemma3_text': 270M, 1B) are",
        )
    if model_type not in HF_MODEL_TYPES:
        supported = ", ".join((*HF_MODEL_TYPES, *ENCODER_MODEL_TYPES))
        raise UnsupportedModelError(
            source, f"model_type {model_type!r} is not supported (supported: {supported})"
        )
    arch = HF_MODEL_TYPES[model_type]
    lfm2, qwen3_5, granite = arch == "lfm2", arch == "qwen3_5", arch == "granitemoehybrid"
    moe = arch in ("qwen3_moe", "olmoe", "qwen3_5", "lfm2", "granitemoehybrid", "gpt_oss", "gemma4")
    gpt_oss = arch == "gpt_oss"
    check_unbuilt_fields(arch, config_json, source)
    defaults = {
        "max_position_embeddings": DEFAULT_MAX_POSITIONS[arch],
        "rms_norm_eps": config_json.get("norm_eps", 1e-5) if lfm2 else DEFAULT_RMS_NORM_EPS,
    }
    act = activation(arch, config_json, source)

    def field(name: str) -> Any:
        if name in config_json and config_json[name] is not None:
            return config_json[name]
        if name in defaults:
            return defaults[name]
        raise ConfigError(source, f"required field {name!r} is missing")

    num_heads = field("num_attention_heads")
    hidden_size = field("hidden_size")
    num_layers = field("num_hidden_layers")
    head_dim: Any = config_json.get("head_dim")  # checked with the rest by check()
    if head_dim is None and isinstance(hidden_size, int) and isinstance(num_heads, int):
        if num_heads <= 0 or hidden_size % num_heads:
            problem = (
                f"hidden_size={hidden_size} is not a multiple of num_attention_heads={num_heads}"
            )
            raise ConfigError(source, problem)
        head_dim = hidden_size // num_heads
    kinds = layer_types(arch, config_json, num_layers, source)
    rope = parse_rope(arch, config_json, source)
    window = sliding_window(arch, config_json, kinds, field("max_position_embeddings"))
    bidirectional = bool(config_json.get("use_bidirectional_attention"))
    if bidirectional and window is not None:
        window = bidirectional_window(window)
    eos = (generation_config or {}).get("eos_token_id")
    if eos is None:
        eos = config_json.get("eos_token_id")
    bos = (generation_config or {}).get("bos_token_id", config_json.get("bos_token_id"))
    gemma4 = arch == "gemma4"
    gemma = arch in ("gemma3", "gemma4")
    extra = gemma4_fields(config_json, num_layers, kinds, source) if gemma4 else {}

    return dict(
        architecture=arch,
        vocab_size=field("vocab_size"),
        hidden_size=hidden_size,
        intermediate_size=lfm2_intermediate_size(config_json, source)
        if lfm2
        else config_json.get("intermediate_size") or field("moe_intermediate_size")
        if qwen3_5 and "moe_intermediate_size" in config_json
        else field("shared_intermediate_size" if granite else "intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=or_default(config_json.get("num_key_value_heads"), num_heads),
        head_dim=head_dim,
        rope_theta=number(rope.theta, "rope_theta", source),
        rope_scaling=rope.scaling,
        rotary_dim=int(head_dim * rope.partial)
        if rope.partial != 1.0 and isinstance(head_dim, int)
        else None,
        rms_norm_eps=number(field("rms_norm_eps"), "rms_norm_eps", source),
        tie_word_embeddings=bool(
            config_json.get("tie_word_embeddings", config_json.get("tie_embedding", gemma))
        ),
        attention_bias=arch == "qwen2" or bool(config_json.get("attention_bias", gpt_oss)),
        max_position_embeddings=field("max_position_embeddings"),
        eos_token_ids=token_ids(eos, "eos_token_id", source),
        bos_token_id=bos,
        hidden_act=act,
        qk_norm=arch in ("qwen3", "gemma3", "gemma4", "lfm2", "qwen3_5", "qwen3_moe"),
        projection_qk_norm=arch == "olmoe",
        sandwich_norm=gemma,
        norm_offset=1.0 if arch == "gemma3" or qwen3_5 else 0.0,
        embedding_multiplier=float(hidden_size) ** 0.5
        if gemma
        else granite_number(config_json, "embedding_multiplier", granite, source),
        query_scale=1.0  # Gemma 4: its q and k norms set the scale
        if gemma4
        else float(config_json.get("query_pre_attn_scalar", 256)) ** -0.5
        if gemma
        else granite_number(config_json, "attention_multiplier", granite, source)
        if granite
        else None,
        no_rope_layers=no_rope_layers(arch, config_json, num_layers),
        sliding_window=window,
        sliding_layers=tuple(i for i, t in enumerate(kinds) if t == "sliding")
        if window is not None
        else (),
        sliding_rope_theta=rope.sliding_theta,
        short_conv=lfm2_short_conv(config_json, kinds) if lfm2 else None,
        delta_net=qwen3_5_delta_net(config_json, kinds) if qwen3_5 else None,
        attn_output_gate=qwen3_5,
        attention_sinks=gpt_oss,
        output_bias=gpt_oss and bool(config_json.get("attention_bias", True)),
        fused_mlp=arch in ("phi3", "granitemoehybrid"),
        mamba=granite_mamba(config_json, kinds, source) if granite else None,
        experts=hf_experts(arch, config_json, num_layers) if moe else None,
        residual_multiplier=granite_number(config_json, "residual_multiplier", granite, source),
        logits_scaling=granite_number(config_json, "logits_scaling", granite, source),
        bidirectional=bidirectional,
        **extra,
    )

"""A ModelConfig written back as a transformers 5 `config.json` dict: what `from_hf` (and
transformers) reads back as the same model. The converter writes it beside the weights, and the
tests build their tiny checkpoints from it."""

from __future__ import annotations

from typing import Any

from nanoserve.runtime.loading.config_fields import HF_ACTIVATIONS
from nanoserve.runtime.loading.expert_layers import experts_to_hf
from nanoserve.runtime.loading.model_config import Architecture, ModelConfig
from nanoserve.runtime.loading.recurrent_layers import granite_to_hf, lfm2_to_hf, qwen3_5_to_hf
from nanoserve.runtime.loading.rope import rope_to_hf

# The class each architecture is saved as (what `architectures` names in config.json)
HF_CLASS_NAMES: dict[Architecture, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "gemma4": "Gemma4ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "qwen3_5": "Qwen3_5ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "bert": "BertModel",
    "nomic_bert": "NomicBertModel",
}


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """A transformers 5 `config.json` dict that `from_hf` (and transformers) reads back as-is."""
    rope = rope_to_hf(config.rope_theta, config.rope_scaling)
    if config.rotary_dim is not None:
        rope["partial_rotary_factor"] = config.rotary_dim / config.head_dim
    eos: int | list[int] | None = list(config.eos_token_ids) or None
    if isinstance(eos, list) and len(eos) == 1:
        eos = eos[0]
    gemma = config.architecture == "gemma3"
    model_type = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen3_5": "qwen3_5_text"}.get(
        config.architecture, config.architecture
    )
    class_name = HF_CLASS_NAMES[config.architecture]
    if config.architecture == "qwen3_5" and config.experts is not None:  # Qwen3.5-MoE
        model_type, class_name = "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"
    if config.architecture == "lfm2" and config.experts is not None:  # LFM2-MoE
        model_type, class_name = "lfm2_moe", "Lfm2MoeForCausalLM"
    out: dict[str, Any] = {
        "architectures": [class_name],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_activation" if gemma else "hidden_act": HF_ACTIVATIONS[config.hidden_act],
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": rope,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": None,  # not transformers' per-class default (SmolLM3's is 128004)
    }
    if config.short_conv is not None:
        out.update(lfm2_to_hf(config.short_conv, config.num_layers, config.rms_norm_eps))
    if config.delta_net is not None:
        out.update(qwen3_5_to_hf(config.delta_net, config.num_layers))
    if config.mamba is not None:
        out.update(granite_to_hf(config.mamba, config.num_layers, config.hidden_size))
        out["shared_intermediate_size"] = config.intermediate_size
        out["position_embedding_type"] = "rope" if not config.no_rope_layers else "nope"
        for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
            out[name] = getattr(config, name)
        out["attention_multiplier"] = config.attention_scale
    if config.experts is not None:
        out.update(experts_to_hf(config.architecture, config.experts, config.num_layers))
    if config.architecture != "qwen2":  # qwen2's bias is implied by its architecture
        out["attention_bias"] = config.attention_bias
    if config.architecture == "gemma4":
        del out["hidden_act"]
        return out | gemma4_to_hf(config)
    if config.architecture == "smollm3":
        out["no_rope_layers"] = [
            int(i not in config.no_rope_layers) for i in range(config.num_layers)
        ]
    kinds = ["sliding" if config.layer_window(i) else "full" for i in range(config.num_layers)]
    if gemma:
        local = {
            "rope_type": "default",
            "rope_theta": config.sliding_rope_theta or config.rope_theta,
        }
        out["rope_parameters"] = {"full_attention": rope, "sliding_attention": local}
        scalar = config.attention_scale**-2
        # transformers takes an int (every Gemma 3's is: 256, or head_dim)
        out["query_pre_attn_scalar"] = (
            round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar
        )
        out["sliding_window"] = config.sliding_window
        out["layer_types"] = [f"{kind}_attention" for kind in kinds]
    elif config.sliding_window is not None:
        out["sliding_window"] = config.sliding_window
        out["layer_types"] = [f"{kind}_attention" for kind in kinds]
        if config.architecture in ("qwen2", "qwen3", "smollm3"):
            out["use_sliding_window"] = True
    elif config.architecture in ("mistral", "phi3"):
        out["sliding_window"] = None
    return out


def gemma4_to_hf(config: ModelConfig) -> dict[str, Any]:
    """Gemma 4's fields of a transformers 5 `config.json` (the full layers' shape as the
    `per_layer_config` transformers itself writes)."""
    kinds = ["sliding" if config.layer_window(i) else "full" for i in range(config.num_layers)]
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.full_rope_fraction is not None:
        full |= {"rope_type": "proportional", "partial_rotary_factor": config.full_rope_fraction}
    own = {
        str(i): {
            "head_dim": config.layer_head_dim(i),
            "num_key_value_heads": config.layer_kv_heads(i),
        }
        for i in range(config.num_layers)
        if kinds[i] == "full"
    }
    inputs = config.per_layer_inputs
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": config.sliding_rope_theta or config.rope_theta,
            },
            "full_attention": full,
        },
        "sliding_window": config.sliding_window,
        "layer_types": [f"{kind}_attention" for kind in kinds],
        "per_layer_config": own,
        "attention_k_eq_v": config.k_eq_v,
        "num_kv_shared_layers": len(config.shared_kv_layers),
        "use_double_wide_mlp": config.double_wide_mlp,
        "hidden_size_per_layer_input": inputs.width if inputs is not None else 0,
        "vocab_size_per_layer_input": inputs.vocab_size
        if inputs is not None
        else config.vocab_size,
        "final_logit_softcapping": config.final_logit_softcap,
        "enable_moe_block": config.experts is not None,  # its fields: experts_to_hf
    }

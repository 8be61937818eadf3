"""Tiny models written by the tests themselves: random-weight Hugging Face checkpoints, the GGUF
files llama.cpp's converter would make of them, and GGUF files of random but valid blocks of any
type. Shared by the runtime and api suites (their conftests hand these out as fixtures).

Tiny models are real Hugging Face checkpoints, written by transformers' own `save_pretrained`:
hidden 64, 2 layers, 4 heads, 2 KV heads, and a 320-token byte-level BPE trained here.
`write_tiny_gguf` turns one into a GGUF the way llama.cpp's converter does (names, reversed
shapes, Q/K row permutation, quantization); `write_mixed_gguf` writes one of every weight type.
Heavy packages (transformers, gguf) are imported where used: the GPU machine has no gguf.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from benchmarks.shape_gguf import random_blocks
from nanoserve.runtime.loading.model_config import ModelConfig

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_VOCAB_SIZE = 320  # 256 byte tokens + 3 special + 61 merges
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are tiny.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_TINY_CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog",
    "def main():\n    return 42\n",
    "héllo wörld 你好 🤗 naïve café",
    "<|im_start|>user\nwhat is 2 + 2?<|im_end|>\n",
]
_TINY_GEOMETRY: dict[str, Any] = {
    "vocab_size": TINY_VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# Hugging Face name pieces -> llama.cpp's, the reverse of what gguf_file.py maps.
_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.qkv_proj": "attn_qkv",  # Phi-3's fused projections
    "mlp.gate_up_proj": "ffn_up",
    "mlp.gate": "ffn_gate_inp",  # a mixture of experts' router
}
# Each expert's linear -> llama.cpp's stacked tensor of them all
_EXPERT_TO_GGUF = {
    "gate_proj": "ffn_gate_exps",
    "up_proj": "ffn_up_exps",
    "down_proj": "ffn_down_exps",
    "w1": "ffn_gate_exps",  # LFM2-MoE's names
    "w3": "ffn_up_exps",
    "w2": "ffn_down_exps",
}
# Gemma 3's four norms, as llama.cpp names them.
_TO_GGUF_GEMMA3 = _TO_GGUF | {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
# The hybrids' layer pattern: a recurrent layer, one that attends, two recurrent ones
ONE_ATTENTION_IN_FOUR = [
    "linear_attention",
    "full_attention",
    "linear_attention",
    "linear_attention",
]
# Granite 4.0-H's hybrid: Mamba2 on three of four layers, the last among them (8 heads of 16
# in 2 groups of B and C, a 16-wide state), no rotary (as every Granite 4.0-H), its multipliers
TINY_GRANITE: dict[str, Any] = {
    "num_hidden_layers": 4,
    "layer_types": ONE_ATTENTION_IN_FOUR,
    "mamba_n_heads": 8,
    "mamba_n_groups": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "position_embedding_type": "nope",
    "embedding_multiplier": 2.0,
    "residual_multiplier": 0.5,
    "attention_multiplier": 0.2,
    "logits_scaling": 4.0,
    "pad_token_id": None,
}
# Qwen3.5's hybrid: gated DeltaNet on three of four layers, the last among them (2 key
# heads serving 4 value heads of 16), gated attention with rotary on a quarter of each head
TINY_QWEN3_5: dict[str, Any] = {
    "num_hidden_layers": 4,
    "layer_types": ONE_ATTENTION_IN_FOUR,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "pad_token_id": None,
}
# The newer architectures' tiny geometry: what each needs to show its delta in 2 layers.
TINY_ARCH_OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen3": {"head_dim": 16},
    # five layers slide over 4 tokens (prompts of 20 cross it), the sixth is global: the
    # pattern of every Gemma 3, which llama.cpp assumes rather than reads
    "gemma3": {
        "head_dim": 16,
        "query_pre_attn_scalar": 16,  # head_dim, as every size but 27B (a GGUF cannot say)
        "sliding_window": 4,
        "num_hidden_layers": 6,
    },
    "smollm3": {"num_hidden_layers": 4, "pad_token_id": None},  # the fourth layer: no rotary
    # Phi-3-mini's window of 2047 scaled down, and Phi-4-mini's rotary of part of each head
    "phi3": {"pad_token_id": None, "sliding_window": 6, "partial_rotary_factor": 0.5},
    # LFM2's hybrid: short convolutions (3 taps) on three of four layers, the last one among
    # them; its MLP width adjusted as its config asks (2/3 of 128, up to a multiple of 32: 96)
    "lfm2": {
        "num_hidden_layers": 4,
        "layer_types": ["conv", "full_attention", "conv", "conv"],
        "norm_eps": 1e-5,
        "block_multiple_of": 32,
        "pad_token_id": None,
    },
    "qwen3_5": TINY_QWEN3_5,
    # Granite 4.0-H Micro's form: the hybrid with a dense MLP and no experts
    "granitemoehybrid": {**TINY_GRANITE, "num_local_experts": 0, "shared_intermediate_size": 128},
    # Granite 4.0-H Tiny's form: the hybrid with 4 experts of 32 on every layer (2 a token,
    # weighed by a softmax over the two), beside the dense MLP
    "granite_moe": {
        **TINY_GRANITE,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 32,
        "shared_intermediate_size": 64,
    },
    # Qwen3-MoE: 4 experts of 32 on every layer, 2 a token, their weights rescaled to sum to one
    "qwen3_moe": {
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
        "pad_token_id": None,
    },
    # Qwen3.5-MoE: Qwen3.5's hybrid with Qwen3-MoE's experts on every layer, and a shared
    # expert of 64 behind a sigmoid gate
    "qwen3_5_moe": {
        **TINY_QWEN3_5,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
    },
    # LFM2-MoE: LFM2's hybrid with a dense first layer, then 4 experts of 32 chosen by sigmoid
    # scores plus a bias (drawn at random too), 2 a token
    "lfm2_moe": {
        "num_hidden_layers": 4,
        "layer_types": ["conv", "full_attention", "conv", "conv"],
        "norm_eps": 1e-5,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "num_dense_layers": 1,
        "pad_token_id": None,
    },
    # Gemma 4: sliding layers (a window of 4, heads of 16) and full ones (one K/V head of 32
    # whose V is its K, proportional rotary on a quarter of it) alternating; the last two
    # layers read layers 2's and 3's K/V and run an MLP twice as wide; per-layer inputs of 32
    # a layer; logits soft-capped at 5 (they reach 9 uncapped)
    "gemma4": {
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "num_hidden_layers": 6,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
        "sliding_window": 4,
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "hidden_size_per_layer_input": 32,
        "vocab_size_per_layer_input": TINY_VOCAB_SIZE,
        "final_logit_softcapping": 5.0,
        "pad_token_id": None,
    },
    # Gemma 4 26B-A4B's form: sliding and full layers alternating as above, no per-layer inputs
    # and no shared K/V, each layer's dense MLP (64) beside 4 experts of 32, 2 a token
    "gemma4_moe": {
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "sliding_window": 4,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "intermediate_size": 64,
        "enable_moe_block": True,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
        "final_logit_softcapping": 5.0,
        "pad_token_id": None,
    },
    # OLMoE: the same experts, their weights as the softmax gave them, q and k normed whole
    "olmoe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 32,
        "pad_token_id": None,
    },
    # gpt-oss: sliding (a window of 4) and full layers alternating, sinks, biases everywhere,
    # YaRN over a pretraining context of 64, 4 biased experts of 32 (2 a token) whose clamped
    # gate bites (N(0, 0.5²) weights give gates past 7). Its bounds rounded (`truncate`): a GGUF
    # always is (ggml's rule), so the two files agree; the released config's unrounded YaRN is
    # test_rope.py's
    "gpt_oss": {
        "num_hidden_layers": 4,
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 32,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": True,
            "original_max_position_embeddings": 64,
        },
        "pad_token_id": None,
    },
}


def tiny_model_config(**overrides: Any) -> ModelConfig:
    """The tiny llama's ModelConfig (what make_tiny_model_dir's config.json reads as), with
    `overrides`: the one tiny geometry the runtime tests share."""
    geometry = _TINY_GEOMETRY
    fields: dict[str, Any] = {
        "architecture": "llama",
        "vocab_size": geometry["vocab_size"],
        "hidden_size": geometry["hidden_size"],
        "intermediate_size": geometry["intermediate_size"],
        "num_layers": geometry["num_hidden_layers"],
        "num_heads": geometry["num_attention_heads"],
        "num_kv_heads": geometry["num_key_value_heads"],
        "head_dim": geometry["hidden_size"] // geometry["num_attention_heads"],
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rms_norm_eps": geometry["rms_norm_eps"],
        "tie_word_embeddings": True,
        "attention_bias": False,
        "max_position_embeddings": geometry["max_position_embeddings"],
        "eos_token_ids": (geometry["eos_token_id"],),
        "bos_token_id": geometry["bos_token_id"],
    }
    return ModelConfig(**{**fields, **overrides})


def _make_tiny_tokenizer() -> Tokenizer:
    """A 320-token byte-level BPE shaped like SmolLM2's: specials at ids 0-2, digits split."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TINY_CORPUS * 3, trainer)  # deterministic for a fixed corpus
    return tokenizer


def make_tiny_model_dir(
    tmp_path: Path, arch: str = "llama", tie: bool = True, seed: int = 0, **overrides: Any
) -> Path:
    """Write a random-weight Hugging Face checkpoint (+ tokenizer files) into `tmp_path/<arch>`.

    `overrides` go to the transformers config (`num_key_value_heads=4`, `rope_scaling={...}`).
    Every parameter, norms included, is drawn from N(0, 0.5²), so a swapped tensor is visible.
    """
    import transformers  # heavy: imported only by the tests that need it

    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "smollm3": (transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "lfm2": (transformers.Lfm2Config, transformers.Lfm2ForCausalLM),
        "qwen3_5": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM),
        "granitemoehybrid": (
            transformers.GraniteMoeHybridConfig,
            transformers.GraniteMoeHybridForCausalLM,
        ),
        "granite_moe": (
            transformers.GraniteMoeHybridConfig,
            transformers.GraniteMoeHybridForCausalLM,
        ),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
        "lfm2_moe": (transformers.Lfm2MoeConfig, transformers.Lfm2MoeForCausalLM),
        "qwen3_5_moe": (transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM),
        "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM),
        "gpt_oss": (transformers.GptOssConfig, transformers.GptOssForCausalLM),
        "gemma4": (transformers.Gemma4TextConfig, transformers.Gemma4ForCausalLM),
        "gemma4_moe": (transformers.Gemma4TextConfig, transformers.Gemma4ForCausalLM),
    }[arch]
    geometry = {**_TINY_GEOMETRY, **TINY_ARCH_OVERRIDES.get(arch, {})}
    config = config_cls(**{**geometry, "tie_word_embeddings": tie, **overrides})
    model = randomized(model_cls(config), seed)
    out = tmp_path / f"{arch}-{'tied' if tie else 'untied'}-{seed}"
    model.save_pretrained(out)
    _make_tiny_tokenizer().save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "chat_template": TINY_CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return out


def randomized(model: Any, seed: int) -> Any:
    """model with every parameter, norms included, drawn from N(0, 0.5²) (so that a swapped
    tensor is visible)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        for name, buffer in model.named_buffers():  # LFM2-MoE's choosing bias: learned, saved
            if name.endswith("expert_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator) * 0.5)
            if name.endswith("layer_scalar"):  # Gemma 4's, learned and saved: 0.5 to 1.5
                buffer.copy_(torch.rand(buffer.shape, generator=generator) + 0.5)
    return model


def hf_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """The weights as transformers loads them from `model_dir` (tied lm_head dropped)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]
    return state


def llamacpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute`, applied to Llama's Q and K rows."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_tiny_gguf(
    model_dir: Path,
    out: Path,
    *,
    qtype: GGMLQuantizationType | None = None,
    raw_tensors: Mapping[str, tuple[np.ndarray, GGMLQuantizationType | None]] | None = None,
    arch: str | None = None,
    pre: str = "smollm",
    mtp_blocks: int = 0,
    pooling_type: int | None = None,
    uint32_keys: Mapping[str, int] | None = None,
) -> Path:
    """Convert a tiny HF checkpoint to GGUF as llama.cpp would; matrices stored as `qtype`
    (None: F32).

    `raw_tensors` replaces tensors (by GGUF name) with pre-encoded bytes of any type, to build
    files llama.cpp could write but nanoserve must refuse. `arch` overrides the written architecture.
    `mtp_blocks` appends that many multi-token-prediction blocks (Qwen3.5's converter's: the last
    attention layer's tensors again, counted in block_count and nextn_predict_layers).
    `pooling_type` writes `{arch}.pooling_type` (llama.cpp's: 1 mean, 2 CLS, 3 last, 4 rank);
    `uint32_keys` more keys, `{arch}.` prefixed.
    """
    import gguf  # only GGUF-writing tests need it; the GPU machine's runtime tests do not
    from safetensors.torch import load_file

    if qtype is None:
        qtype = gguf.GGMLQuantizationType.F32

    config = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    arch_name = arch or {
        "gemma3_text": "gemma3",
        "gemma4_text": "gemma4",
        "qwen3_moe": "qwen3moe",
        "qwen3_5_text": "qwen35",
        "qwen3_5_moe_text": "qwen35moe",
        "lfm2_moe": "lfm2moe",
        "granitemoehybrid": "granitehybrid",
        "gpt_oss": "gpt-oss",
    }.get(config["model_type"], config["model_type"])
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(out), arch_name)
    gemma = arch_name in ("gemma3", "gemma-embedding")
    if pooling_type is not None:
        writer.add_pooling_type(gguf.PoolingType(pooling_type))
    for key, number in (uint32_keys or {}).items():
        writer.add_uint32(f"{arch_name}.{key}", number)
    writer.add_block_count(config["num_hidden_layers"] + mtp_blocks)
    if mtp_blocks:
        writer.add_nextn_predict_layers(mtp_blocks)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    lfm2 = arch_name in ("lfm2", "lfm2moe")
    if lfm2:  # as llama.cpp's LFM2 converter: the MLP width as built, no K/V heads on convs
        from nanoserve.runtime.loading.recurrent_layers import lfm2_intermediate_size

        writer.add_feed_forward_length(lfm2_intermediate_size(config, "config.json"))
        writer.add_head_count_kv([0 if t == "conv" else kv_heads for t in config["layer_types"]])
        writer.add_shortconv_l_cache(config["conv_L_cache"])
    gemma4 = arch_name == "gemma4"
    if gemma4:  # each layer's own widths, K/V heads and window (_gemma4_gguf_keys)
        raw_tensors = {**_gemma4_gguf_keys(writer, config), **(raw_tensors or {})}
    elif not lfm2:
        writer.add_feed_forward_length(config["intermediate_size"])
    granite = arch_name == "granitehybrid"
    experts = config.get("num_experts", config.get("num_local_experts"))  # 5.x: the latter
    if experts and arch_name != "granitehybrid":  # as llama.cpp's Qwen3-MoE, OLMoE converters
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config.get("num_experts_per_tok", config.get("top_k_experts")))
        if "moe_intermediate_size" in config:
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        if "num_dense_layers" in config:  # LFM2-MoE's dense prefix, sigmoid scores
            writer.add_leading_dense_block_count(config["num_dense_layers"])
            writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if "shared_expert_intermediate_size" in config:
            writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    gpt_oss = arch_name == "gpt-oss"
    if gpt_oss:  # as llama.cpp's gpt-oss converter: the window, the experts' width, YaRN
        writer.add_sliding_window(config["sliding_window"])
        writer.add_expert_feed_forward_length(config["intermediate_size"])
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        rope = config["rope_parameters"]
        writer.add_rope_freq_base(rope["rope_theta"])
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if not lfm2 and not granite and not gemma4:
        writer.add_head_count_kv(kv_heads)
    if granite:  # as llama.cpp's Granite hybrid converter: Mamba2's sizes as ssm.*
        mamba = [t == "linear_attention" for t in config["layer_types"]]
        writer.add_head_count_kv([0 if m else kv_heads for m in mamba])
        writer.add_expert_shared_feed_forward_length(config["shared_intermediate_size"])
        if experts:  # Tiny, Small: llama.cpp writes the counts, the experts' width as the MLP's
            writer.add_expert_count(experts)
            writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_ssm_conv_kernel(config["mamba_d_conv"])
        writer.add_ssm_state_size(config["mamba_d_state"])
        writer.add_ssm_group_count(config["mamba_n_groups"])
        writer.add_ssm_inner_size(config["mamba_expand"] * config["hidden_size"])
        writer.add_ssm_time_step_rank(config["mamba_n_heads"])
        writer.add_attention_scale(config["attention_multiplier"])
        writer.add_embedding_scale(config["embedding_multiplier"])
        writer.add_residual_scale(config["residual_multiplier"])
        writer.add_logit_scale(config["logits_scaling"])
        writer.add_rope_scaling_finetuned(config.get("position_embedding_type") == "rope")
    qwen35 = arch_name in ("qwen35", "qwen35moe")
    if qwen35:  # as llama.cpp's Qwen3.5 converter: DeltaNet's sizes as ssm.*
        writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
        writer.add_ssm_state_size(config["linear_key_head_dim"])
        writer.add_ssm_group_count(config["linear_num_key_heads"])
        writer.add_ssm_time_step_rank(config["linear_num_value_heads"])
        v_size = config["linear_value_head_dim"] * config["linear_num_value_heads"]
        writer.add_ssm_inner_size(v_size)
        writer.add_full_attention_interval(4)
        writer.add_array(
            f"{arch_name}.attention.recurrent_layers",
            [t == "linear_attention" for t in config["layer_types"]],
        )
        writer.add_rope_dimension_sections([11, 11, 10, 0])
    writer.add_head_count(heads)
    rope = config["rope_parameters"]
    writer.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])
    writer.add_layer_norm_rms_eps(config["norm_eps"] if lfm2 else config["rms_norm_eps"])
    if not gemma4:
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if (gemma or arch_name == "phi3") and config.get("sliding_window"):
        writer.add_sliding_window(config["sliding_window"])
    writer.add_vocab_size(config["vocab_size"])
    # The tokenizer, as llama.cpp stores a byte-level BPE.
    vocab = {**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(
        [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    )
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(TINY_CHAT_TEMPLATE)

    raw_tensors = dict(raw_tensors or {})  # None: the array's own type
    if rope.get("rope_type") == "llama3":  # as llama.cpp's converter stores Llama 3.1+ scaling
        raw_tensors.setdefault("rope_freqs.weight", (_llama3_rope_factors(rope, head_dim), None))
    if rope.get("rope_type") == "longrope":  # as its Phi-3 converter stores longrope
        import math

        original = config["original_max_position_embeddings"]
        scale = config["max_position_embeddings"] / original
        attention = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(attention)
        for kind in ("long", "short"):
            factors = np.array(rope[f"{kind}_factor"], dtype=np.float32)
            raw_tensors.setdefault(f"rope_factors_{kind}.weight", (factors, None))

    def put(gguf_name: str, values: np.ndarray) -> None:
        if gguf_name in raw_tensors:
            data, raw_type = raw_tensors.pop(gguf_name)
            writer.add_tensor(gguf_name, data, raw_dtype=raw_type)
        # norms, biases and the taps (a few to a row, no block) stay F32
        elif (
            values.ndim == 1
            or gguf_name.endswith(".bias")
            or qtype == gguf.GGMLQuantizationType.F32
            or values.shape[-1] < 32
        ):
            writer.add_tensor(gguf_name, values)
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    stacks: dict[str, dict[int, np.ndarray]] = {}  # llama.cpp's stacked experts, by GGUF name
    for name, tensor in load_file(model_dir / "model.safetensors").items():
        values = tensor.float().numpy()
        if gpt_oss and (stored := _gpt_oss_gguf(name, values)) is not None:
            for stored_name, stored_values in stored:
                put(stored_name, stored_values)
            continue
        if gemma4 and (gemma4_name := _gemma4_gguf_name(name)) is not None:
            put(gemma4_name, values)
            continue
        if ".experts." in name:  # `model.layers.{i}.{mlp|feed_forward}.experts.{e}.{part}.weight`
            _, _, layer, _, _, expert, part, _ = name.split(".")
            stacks.setdefault(f"blk.{layer}.{_EXPERT_TO_GGUF[part]}.weight", {})[int(expert)] = (
                values
            )
            continue
        if arch_name in ("llama", "smollm3") and ".q_proj." in name:
            values = llamacpp_permute(values, heads)
        elif arch_name in ("llama", "smollm3") and ".k_proj." in name:
            values = llamacpp_permute(values, kv_heads)
        elif gemma and name.endswith("norm.weight"):
            values = values + 1.0  # llama.cpp's Gemma converter stores 1 + w
        elif lfm2 and "conv.conv" in name:
            values = values.squeeze(1)  # llama.cpp's LFM2 converter: the taps as a matrix
        elif qwen35:
            values = _qwen35_gguf_values(name, values, config)
        elif granite:
            values = _granite_gguf_values(name, values, config)
            blk = f"blk.{name.split('.')[2]}"
            shexp = "_shexp" if experts else ""  # the dense MLP beside experts is `_shexp`
            if ".shared_mlp.input_linear." in name:  # split, as llama.cpp's converter does
                gate, up = np.split(values, 2)
                put(f"{blk}.ffn_gate{shexp}.weight", gate)
                put(f"{blk}.ffn_up{shexp}.weight", up)
                continue
            if ".shared_mlp.output_linear." in name:
                put(f"{blk}.ffn_down{shexp}.weight", values)
                continue
            if ".block_sparse_moe.input_linear." in name:  # [experts, 2 * width, hidden]
                gate, up = np.split(values, 2, axis=1)
                put(f"{blk}.ffn_gate_exps.weight", gate)
                put(f"{blk}.ffn_up_exps.weight", up)
                continue
            if ".block_sparse_moe.output_linear." in name:
                put(f"{blk}.ffn_down_exps.weight", values)
                continue
            if ".block_sparse_moe.router." in name:
                put(f"{blk}.ffn_gate_inp.weight", values)
                continue
        gguf_name = _gguf_name(name, arch_name)
        attends = mtp_blocks and gguf_name.startswith("blk.") and "layer_types" in config
        if attends and config["layer_types"][int(gguf_name.split(".")[1])] == "full_attention":
            for extra in range(mtp_blocks):  # an MTP block: the attention layer's tensors again
                layer = config["num_hidden_layers"] + extra
                renamed = ".".join(["blk", str(layer), *gguf_name.split(".")[2:]])
                raw_tensors.setdefault(renamed, (values, None))
        put(gguf_name, values)
    for gguf_name, experts in stacks.items():
        put(gguf_name, np.stack([experts[e] for e in sorted(experts)]))
    for gguf_name, (data, raw_type) in raw_tensors.items():  # extra tensors
        if raw_type is None:
            writer.add_tensor(gguf_name, data)
        else:
            writer.add_tensor(gguf_name, data, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _gemma4_gguf_keys(writer: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    """As llama.cpp's Gemma 4 converter: the full layers' head_dim as `key_length` and the
    sliding ones' as `key_length_swa`, K/V heads and MLP widths per layer, the pattern as one
    bool a layer, and proportional rotary as `rope_freqs` (1 for a pair that turns, 1e30 for one
    that stands still); returns that tensor."""
    arch, layers = "gemma4", config["num_hidden_layers"]
    sliding = [t == "sliding_attention" for t in config["layer_types"]]
    first_full = str(sliding.index(False))  # transformers 5 writes the full layers' shape so
    own = config["per_layer_config"][first_full]
    full_dim, dim = own["head_dim"], config["head_dim"]
    full_kv = own.get("num_key_value_heads") or config["num_key_value_heads"]
    shared = config["num_kv_shared_layers"]
    inter = config["intermediate_size"]
    wide = config.get("use_double_wide_mlp")
    widths = [inter * 2 if wide and i >= layers - shared else inter for i in range(layers)]
    writer.add_array(f"{arch}.feed_forward_length", widths)
    writer.add_array(
        f"{arch}.attention.head_count_kv",
        [config["num_key_value_heads"] if s else full_kv for s in sliding],
    )
    writer.add_key_length(full_dim)
    writer.add_value_length(full_dim)
    writer.add_uint32(f"{arch}.attention.key_length_swa", dim)
    writer.add_uint32(f"{arch}.attention.value_length_swa", dim)
    writer.add_rope_dimension_count(full_dim)
    writer.add_uint32(f"{arch}.rope.dimension_count_swa", dim)
    rope = config["rope_parameters"]
    writer.add_float32(f"{arch}.rope.freq_base_swa", rope["sliding_attention"]["rope_theta"])
    writer.add_sliding_window(config["sliding_window"])
    writer.add_array(f"{arch}.attention.sliding_window_pattern", sliding)
    writer.add_uint32(f"{arch}.attention.shared_kv_layers", shared)
    writer.add_uint32(
        f"{arch}.embedding_length_per_layer_input", config["hidden_size_per_layer_input"]
    )
    writer.add_float32(f"{arch}.final_logit_softcapping", config["final_logit_softcapping"])
    turned = int(full_dim * rope["full_attention"]["partial_rotary_factor"] / 2)
    factors = np.array([1.0] * turned + [1e30] * (full_dim // 2 - turned), dtype=np.float32)
    return {"rope_freqs.weight": (factors, None)}


# Gemma 4's experts block as llama.cpp's converter names it: the stacks (gate and up fused),
# the router's input scale, each expert's weight scale
_GEMMA4_GGUF = {
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
}


def _gemma4_gguf_name(name: str) -> str | None:
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[3] in _GEMMA4_GGUF:
        return f"blk.{parts[2]}.{_GEMMA4_GGUF[parts[3]]}"
    return None


def _llama3_rope_factors(rope: Mapping[str, Any], head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's `rope_freqs` for Llama 3.1+ scaling: a divisor per frequency."""
    import math

    base, factor = rope["rope_theta"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old_context = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _gpt_oss_gguf(name: str, values: np.ndarray) -> list[tuple[str, np.ndarray]] | None:
    """What llama.cpp's gpt-oss converter stores for a tensor of transformers' (None: the
    common names): the stacked experts transposed to [experts, out, in] with gate and up
    de-interleaved, their biases likewise, the router as ffn_gate_inp, the sinks, the norm
    before the MLP as post_attention_norm."""
    blk = f"blk.{name.split('.')[2]}" if name.startswith("model.layers.") else ""
    if ".mlp.experts.gate_up_proj_bias" in name:
        return [(f"{blk}.ffn_gate_exps.bias", values[..., ::2]),
                (f"{blk}.ffn_up_exps.bias", values[..., 1::2])]  # fmt: skip
    if ".mlp.experts.gate_up_proj" in name:
        turned = values.swapaxes(-1, -2)
        return [(f"{blk}.ffn_gate_exps.weight", np.ascontiguousarray(turned[:, ::2])),
                (f"{blk}.ffn_up_exps.weight", np.ascontiguousarray(turned[:, 1::2]))]  # fmt: skip
    if ".mlp.experts.down_proj_bias" in name:
        return [(f"{blk}.ffn_down_exps.bias", values)]
    if ".mlp.experts.down_proj" in name:
        return [(f"{blk}.ffn_down_exps.weight", np.ascontiguousarray(values.swapaxes(-1, -2)))]
    if ".mlp.router." in name:
        return [(f"{blk}.ffn_gate_inp.{name.rsplit('.', 1)[1]}", values)]
    if name.endswith(".self_attn.sinks"):
        return [(f"{blk}.attn_sinks.weight", values)]
    if ".post_attention_layernorm." in name:
        return [(f"{blk}.post_attention_norm.weight", values)]
    return None


def _granite_gguf_values(name: str, values: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """What llama.cpp's Granite hybrid converter stores: Q and K rows permuted as Llama's,
    -exp(A_log) and D as [heads, 1], the norm as [groups, width], the taps as a matrix."""
    if ".q_proj." in name:
        return llamacpp_permute(values, config["num_attention_heads"])
    if ".k_proj." in name:
        return llamacpp_permute(values, config["num_key_value_heads"])
    if name.endswith(".A_log"):
        return -np.exp(values)[:, None]
    if name.endswith(".D"):
        return values[:, None]
    if name.endswith(".mamba.norm.weight"):
        return values.reshape(config["mamba_n_groups"], -1)
    if "conv1d.weight" in name:
        return values.squeeze(1)
    return values


def _qwen35_gguf_values(name: str, values: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """What llama.cpp's Qwen3.5 converter stores for a tensor: 1 + w for every norm but
    DeltaNet's, -exp(A_log), the taps as a matrix, and the value heads in tiled order (value
    head v * k_heads + k holds the checkpoint's head k * per_key + v)."""
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return values + 1.0
    if name.endswith(".A_log"):
        values = -np.exp(values)
    if "conv1d" in name:
        values = values.squeeze(1)
    if ".linear_attn." not in name:
        return values
    k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    per_key, k_size = v_heads // k_heads, k_heads * config["linear_key_head_dim"]

    def tiled(x: np.ndarray, axis: int) -> np.ndarray:
        x = np.moveaxis(x, axis, 0)
        heads = x.reshape(k_heads, per_key, -1, *x.shape[1:]).swapaxes(0, 1)
        return np.moveaxis(heads.reshape(x.shape), 0, axis)

    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):  # the value rows only
        return np.concatenate((values[: 2 * k_size], tiled(values[2 * k_size :], 0)))
    if name.endswith("out_proj.weight"):
        return tiled(values, 1)
    if name.endswith("norm.weight"):  # one weight shared by every head
        return values
    return tiled(values, 0)  # z, b, a, A_log, dt_bias


_WHOLE_GGUF_NAMES = {".A_log": "ssm_a", ".D": "ssm_d", ".dt_bias": "ssm_dt.bias"}
_GGUF_ARCHS = {
    "lfm2": "LFM2",
    "lfm2moe": "LFM2MOE",
    "qwen35": "QWEN35",
    "qwen35moe": "QWEN35MOE",
    "granitehybrid": "GRANITE_HYBRID",
    "gemma4": "GEMMA4",
}


def _gguf_name(hf_name: str, arch: str = "llama") -> str:
    if hf_name.endswith(".layer_scalar"):  # Gemma 4's, a buffer: its converter adds `.weight`
        return f"blk.{hf_name.split('.')[2]}.layer_output_scale.weight"
    if hf_name.endswith(".expert_bias"):  # LFM2-MoE's choosing bias, not a module's weight
        return f"blk.{hf_name.split('.')[2]}.exp_probs_b.bias"
    whole = next((v for k, v in _WHOLE_GGUF_NAMES.items() if hf_name.endswith(k)), None)
    if arch in ("qwen35", "qwen35moe", "granitehybrid") and whole:  # no .weight of a module
        return f"blk.{hf_name.split('.')[2]}.{whole}"
    if arch in _GGUF_ARCHS:  # the gguf package's own table, from the names stored
        import gguf

        stem, kind = hf_name.rsplit(".", 1)
        table = gguf.get_tensor_name_map(gguf.MODEL_ARCH[_GGUF_ARCHS[arch]], 64)
        return f"{table.get_name(stem)}.{kind}"
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    names = _TO_GGUF_GEMMA3 if arch in ("gemma3", "gemma-embedding") else _TO_GGUF
    return f"blk.{layer}.{names[part]}.{kind}"


# -- a tiny GGUF of every weight type, the way a Q4_K_M file mixes them ------------------------------

# Hidden 256 and intermediate 512 so that 256-input K blocks fit every linear; each layer mixes
# types as llama.cpp's K-quant mixes do, one tensor is F16 (served re-quantized: a fallback),
# and the embedding (Q6_K) is untied from the output projection (Q5_0).
MIXED_GEOMETRY: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
MIXED_TYPES: dict[str, str] = {
    "token_embd.weight": "Q6_K",
    "output.weight": "Q5_0",
    "blk.0.attn_q.weight": "Q4_K",
    "blk.0.attn_k.weight": "Q6_K",
    "blk.0.attn_v.weight": "Q8_0",
    "blk.0.attn_output.weight": "Q5_K",
    "blk.0.ffn_gate.weight": "Q5_0",
    "blk.0.ffn_up.weight": "Q4_0",
    "blk.0.ffn_down.weight": "Q3_K",
    "blk.1.attn_q.weight": "Q5_1",
    "blk.1.attn_k.weight": "Q4_1",
    "blk.1.attn_v.weight": "Q2_K",
    "blk.1.attn_output.weight": "F16",
    "blk.1.ffn_gate.weight": "Q4_K",
    "blk.1.ffn_up.weight": "Q8_0",
    "blk.1.ffn_down.weight": "Q6_K",
}


def write_mixed_gguf(tmp_path: Path) -> Path:
    """The tiny Llama's shape at hidden 256, every matrix random valid blocks of its type."""
    import gguf

    model_dir = make_tiny_model_dir(tmp_path, tie=False, **MIXED_GEOMETRY)
    shapes = {"token_embd.weight": (TINY_VOCAB_SIZE, 256), "output.weight": (TINY_VOCAB_SIZE, 256)}
    for layer in range(2):
        shapes |= {
            f"blk.{layer}.attn_q.weight": (256, 256),
            f"blk.{layer}.attn_k.weight": (128, 256),
            f"blk.{layer}.attn_v.weight": (128, 256),
            f"blk.{layer}.attn_output.weight": (256, 256),
            f"blk.{layer}.ffn_gate.weight": (512, 256),
            f"blk.{layer}.ffn_up.weight": (512, 256),
            f"blk.{layer}.ffn_down.weight": (256, 512),
        }
    raw = {}
    for i, (name, kind) in enumerate(MIXED_TYPES.items()):
        rows, cols = shapes[name]
        # K sub-scales multiply d by up to 127: smaller superblock scales keep weights O(1).
        scale = 0.0005 if kind.endswith("_K") else 0.02
        raw[name] = (
            random_blocks(kind, rows, cols, seed=i, scale=scale),
            gguf.GGMLQuantizationType[kind],
        )
    return write_tiny_gguf(model_dir, tmp_path / "mixed.gguf", raw_tensors=raw)


def make_tiny_embedder_dir(
    tmp_path: Path, pooling: str = "lasttoken", *, dense: int | None = None, seed: int = 0
) -> Path:
    """A tiny Qwen3 embedder as sentence-transformers saves one: the base model's weights (names
    without `model.`, no LM head), `modules.json` with a Pooling module (`pooling`: lasttoken,
    mean_tokens or cls_token), a Dense projection to `dense` values (tanh) if asked, Normalize."""
    import transformers
    from safetensors.torch import save_file

    causal = make_tiny_model_dir(tmp_path, "qwen3", seed=seed)
    out = tmp_path / f"qwen3-embed-{pooling}-{dense}-{seed}"
    transformers.AutoModelForCausalLM.from_pretrained(causal).model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_text((causal / name).read_text())
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (out / "1_Pooling").mkdir()
    modes = {f"pooling_mode_{m}": m == pooling for m in ("lasttoken", "mean_tokens", "cls_token")}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(modes))
    if dense is not None:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
        )
        (out / "2_Dense").mkdir()
        config = {"in_features": 64, "out_features": dense, "bias": True,
                  "activation_function": "torch.nn.modules.activation.Tanh"}  # fmt: skip
        (out / "2_Dense" / "config.json").write_text(json.dumps(config))
        generator = torch.Generator().manual_seed(seed + 1)
        weights = {"linear.weight": torch.randn(dense, 64, generator=generator) * 0.2,
                   "linear.bias": torch.randn(dense, generator=generator) * 0.2}  # fmt: skip
        save_file(weights, str(out / "2_Dense" / "model.safetensors"))
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": "Normalize",
                    "type": "sentence_transformers.models.Normalize"})  # fmt: skip
    (out / "modules.json").write_text(json.dumps(modules))
    return out


def make_tiny_classifier_dir(tmp_path: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A tiny Qwen3ForSequenceClassification (a reranker's classification head, `score.weight`),
    with the tiny tokenizer (its pad token set, as a sequence classifier needs)."""
    import transformers

    # 512 positions: the reranker prompt alone is ~250 of the tiny tokenizer's tokens
    geometry = {
        **_TINY_GEOMETRY,
        "num_labels": num_labels,
        "pad_token_id": 0,
        "max_position_embeddings": 512,
    }
    config = transformers.Qwen3Config(**geometry)
    model = randomized(transformers.Qwen3ForSequenceClassification(config), seed)
    out = tmp_path / f"qwen3-classifier-{num_labels}-{seed}"
    model.save_pretrained(out)
    _make_tiny_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return out

"""A GGUF's model config: its metadata keys (`{arch}.embedding_length`, ...) read as a
ModelConfig, with what llama.cpp's loader fixes rather than stores (Gemma 3's sliding pattern
and local rotary base, SmolLM3's rotary-free layers, a Granite hybrid's unused rotary) and the
rotary scaling the converter keeps as tensors (Llama 3.1's `rope_freqs`, Phi-3's longrope
factors).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError, WeightsError
from nanoserve.runtime.loading.encoder_layers import gguf_encoder_fields
from nanoserve.runtime.loading.expert_layers import gguf_experts
from nanoserve.runtime.loading.gguf_reader import GgufReader
from nanoserve.runtime.loading.gguf_recurrent import (
    granite_mamba,
    lfm2_short_conv,
    qwen35_delta_net,
    text_layers,
)
from nanoserve.runtime.loading.gguf_types import GGML_TYPES
from nanoserve.runtime.loading.layer_pattern import bidirectional_window
from nanoserve.runtime.loading.model_config import Architecture, ModelConfig
from nanoserve.runtime.loading.per_layer_inputs import gemma4_gguf_fields
from nanoserve.runtime.loading.rope import (
    FreqFactors,
    LinearRope,
    LongRope,
    Yarn,
    yarn_attention_factor,
)
from nanoserve.runtime.text.tokenizer import Tokenizer

_GEMMA3_SLIDING_PATTERN = 6  # llama.cpp's: five sliding layers, then one global
_GEMMA3_LOCAL_ROPE_THETA = 10000.0
_SMOLLM3_NO_ROPE_INTERVAL = 4  # llama.cpp's: every fourth layer without rotary


def gguf_config(
    metadata: Mapping[str, Any],
    arch: Architecture,
    stored_arch: str,
    gguf_names: frozenset[str],
    tokenizer: Tokenizer,
    path: Path,
    stored_scaling: FreqFactors | LongRope | None = None,
) -> ModelConfig:
    """The ModelConfig of a GGUF's metadata: `arch` the family, `stored_arch` the file's name
    for it (its keys' prefix), `gguf_names` its tensors' names, and the rotary scaling it
    stores as tensors (`rope_scaling_tensors`)."""
    missing = object()

    def key(name: str, default: Any = missing) -> Any:
        value = metadata.get(f"{stored_arch}.{name}", default)
        if value is missing:
            raise ConfigError(path, f"GGUF metadata has no {stored_arch}.{name!r}")
        return value

    if arch in ("bert", "nomic_bert"):  # an encoder: encoder_layers.py reads its keys
        vocab = len(metadata["tokenizer.ggml.tokens"])
        types = metadata.get("tokenizer.ggml.token_type_count")
        nomic = arch == "nomic_bert"
        fields = gguf_encoder_fields(key, gguf_names, vocab, nomic=nomic, type_count=types)
        try:
            return ModelConfig(**fields)
        except ConfigError as error:
            raise ConfigError(path, error.problem) from None
    hidden_size = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    if arch == "gemma4":  # per-layer shapes of its own (per_layer_inputs.py)
        return _gemma4_config(key, metadata, gguf_names, tokenizer, path, stored_scaling)
    num_kv_heads = key("attention.head_count_kv", num_heads)
    short_conv = None
    num_layers = text_layers(metadata, stored_arch)
    qwen3_5 = arch == "qwen3_5"
    delta_net = qwen35_delta_net(key, num_layers, path) if qwen3_5 else None
    granite = arch == "granitemoehybrid"
    mamba = None
    if isinstance(num_kv_heads, list):  # some files list it per layer
        if arch == "lfm2":  # none on a convolution layer
            short_conv = lfm2_short_conv(num_kv_heads, int(key("shortconv.l_cache")), gguf_names)
        if granite:  # none on a Mamba2 layer
            mamba = granite_mamba(key, num_kv_heads[:num_layers], gguf_names)
        num_kv_heads = [n for n in num_kv_heads[:num_layers] if n] or num_kv_heads
        if len(set(num_kv_heads)) != 1:
            raise UnsupportedModelError(path, f"per-layer head_count_kv {num_kv_heads} differs")
        num_kv_heads = num_kv_heads[0]
    head_dim = int(key("attention.key_length", hidden_size // max(num_heads, 1)))
    rope_dim = int(key("rope.dimension_count", head_dim))
    scaling = key("rope.scaling.type", "none")
    rope_scaling: LinearRope | FreqFactors | LongRope | Yarn | None = stored_scaling
    if scaling == "linear" and arch == "gemma3":  # the global layers of Gemma 3 4B and up
        rope_scaling = LinearRope(float(key("rope.scaling.factor")))
    elif scaling == "yarn":  # bounds rounded out (ggml's rule), its scale times attn_factor
        factor = float(key("rope.scaling.factor"))
        rope_scaling = Yarn(
            factor=factor,
            original_max_position_embeddings=int(key("rope.scaling.original_context_length")),
            attention_factor=float(key("rope.scaling.attn_factor", 1.0))
            * yarn_attention_factor(factor),
            beta_fast=float(key("rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(key("rope.scaling.yarn_beta_slow", 1.0)),
        )
    elif scaling not in ("none", "llama3"):  # llama3: the factors are the rope_freqs tensor
        raise UnsupportedModelError(path, f"{arch}.rope.scaling.type={scaling!r} is not supported")
    windowed = ("gemma3", "phi3", "gpt_oss")
    window = key("attention.sliding_window", None) if arch in windowed else None
    if window is not None and (not window or window >= int(key("context_length"))):
        window = None  # a window no narrower than the context is none
    gemma, gpt_oss = arch == "gemma3", arch == "gpt_oss"
    bidirectional = stored_arch == "gemma-embedding"  # EmbeddingGemma
    if bidirectional and window is not None:
        window = bidirectional_window(int(window))
    try:
        return ModelConfig(
            architecture=arch,
            vocab_size=int(key("vocab_size", len(metadata["tokenizer.ggml.tokens"]))),
            hidden_size=hidden_size,
            # Granite's dense MLP is its "shared expert": its width is stored as such
            intermediate_size=int(
                key("expert_shared_feed_forward_length")
                if granite and key("expert_shared_feed_forward_length", None)
                else key("feed_forward_length", None) or key("expert_feed_forward_length")
            ),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(num_kv_heads),
            head_dim=head_dim,
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_scaling=rope_scaling,
            rotary_dim=rope_dim if rope_dim != head_dim else None,
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            # llama.cpp writes `output.weight` only when the output projection is not the embedding
            tie_word_embeddings="output.weight" not in gguf_names,
            attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in gguf_names,
            max_position_embeddings=int(key("context_length")),
            eos_token_ids=tokenizer.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,
            hidden_act="gelu_tanh" if gemma else "silu",
            qk_norm=arch in ("qwen3", "gemma3", "lfm2", "qwen3_5", "qwen3_moe"),
            projection_qk_norm=arch == "olmoe",
            sandwich_norm=gemma,
            embedding_multiplier=float(hidden_size) ** 0.5
            if gemma
            else float(key("embedding_scale", 1.0)),
            # llama.cpp scales Gemma 3's queries by 1/sqrt(head_dim) (query_pre_attn_scalar is
            # head_dim for every size but 27B, which llama.cpp special-cases the same way)
            query_scale=head_dim**-0.5
            if gemma
            else float(key("attention.scale"))
            if granite and key("attention.scale", None)
            else None,
            no_rope_layers=_no_rope_layers(arch, num_layers, key),
            sliding_window=None if window is None else int(window),
            sliding_layers=_sliding_layers(arch, num_layers) if window is not None else (),
            sliding_rope_theta=_GEMMA3_LOCAL_ROPE_THETA if gemma else None,
            short_conv=short_conv,
            delta_net=delta_net,
            attn_output_gate=qwen3_5,
            attention_sinks=gpt_oss,
            output_bias="blk.0.attn_output.bias" in gguf_names,
            mamba=mamba,
            experts=gguf_experts(arch, key, num_layers, gguf_names)
            if arch in ("qwen3_moe", "olmoe", "qwen3_5", "lfm2", "granitemoehybrid", "gpt_oss")
            else None,
            residual_multiplier=float(key("residual_scale", 1.0)) if granite else 1.0,
            logits_scaling=float(key("logit_scale", 1.0)) if granite else 1.0,
            fused_mlp=arch == "phi3",  # llama.cpp splits Granite's shared MLP in two
            bidirectional=bidirectional,
        )
    except ConfigError as error:  # re-raised naming the file rather than the class
        raise ConfigError(path, error.problem) from None


def _gemma4_config(
    key: Any,
    metadata: Mapping[str, Any],
    gguf_names: frozenset[str],
    tokenizer: Tokenizer,
    path: Path,
    stored_scaling: FreqFactors | LongRope | None,
) -> ModelConfig:
    num_layers = text_layers(metadata, "gemma4")
    vocab = int(key("vocab_size", len(metadata["tokenizer.ggml.tokens"])))
    factors = stored_scaling.factors if isinstance(stored_scaling, FreqFactors) else None
    try:
        return ModelConfig(
            architecture="gemma4",
            vocab_size=vocab,
            hidden_size=int(key("embedding_length")),
            num_layers=num_layers,
            num_heads=int(key("attention.head_count")),
            rope_theta=float(key("rope.freq_base", 1_000_000.0)),
            rope_scaling=None,
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            tie_word_embeddings="output.weight" not in gguf_names,
            attention_bias=False,
            max_position_embeddings=int(key("context_length")),
            eos_token_ids=tokenizer.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,
            experts=gguf_experts("gemma4", key, num_layers, gguf_names),  # 26B-A4B's block
            **gemma4_gguf_fields(key, num_layers, gguf_names, factors, vocab),
        )
    except ConfigError as error:  # re-raised naming the file rather than the class
        raise ConfigError(path, error.problem) from None


def _sliding_layers(arch: str, num_layers: int) -> tuple[int, ...]:
    """The layers a GGUF's window applies to, as llama.cpp's loader fixes them: Gemma 3's five in
    six, gpt-oss's even layers (sliding, then full), every layer elsewhere."""
    if arch == "gemma3":
        return tuple(i for i in range(num_layers) if (i + 1) % _GEMMA3_SLIDING_PATTERN)
    if arch == "gpt_oss":
        return tuple(range(0, num_layers, 2))
    return tuple(range(num_layers))


def _no_rope_layers(arch: str, num_layers: int, key: Any) -> tuple[int, ...]:
    """SmolLM3's every fourth layer; every layer of a Granite hybrid whose file says its rotary
    is not used (`rope.scaling.finetuned` false, as the converter writes for a hybrid)."""
    if arch == "smollm3":
        return tuple(i for i in range(num_layers) if (i + 1) % _SMOLLM3_NO_ROPE_INTERVAL == 0)
    if arch == "granitemoehybrid" and not key("rope.scaling.finetuned", True):
        return tuple(range(num_layers))
    return ()


def rope_scaling_tensors(
    reader: GgufReader, arch: str, path: Path
) -> FreqFactors | LongRope | None:
    """Rotary scaling that llama.cpp's converter stores as tensors: Llama 3.1+'s one factor per
    frequency (`rope_freqs`), or Phi-3's longrope divisors (`rope_factors_long`/`_short`, with
    the attention factor and the pretraining context in the metadata); else None."""
    if "rope_freqs.weight" in reader.tensors:
        return FreqFactors(_f32_vector(reader, "rope_freqs.weight", path))
    if "rope_factors_long.weight" not in reader.tensors:
        return None
    metadata = reader.metadata
    original = metadata.get(f"{arch}.rope.scaling.original_context_length")
    if not isinstance(original, int):
        raise ConfigError(path, f"longrope without {arch}.rope.scaling.original_context_length")
    return LongRope(
        short_factor=_f32_vector(reader, "rope_factors_short.weight", path),
        long_factor=_f32_vector(reader, "rope_factors_long.weight", path),
        original_max_position_embeddings=original,
        attention_factor=float(metadata.get(f"{arch}.rope.scaling.attn_factor", 1.0)),
    )


def _f32_vector(reader: GgufReader, name: str, path: Path) -> tuple[float, ...]:
    info = reader.tensors.get(name)
    if info is None or GGML_TYPES[info.type_id].name != "F32" or len(info.dims) != 1:
        raise WeightsError(path, f"{name} must be a float32 vector")
    return tuple(float(v) for v in reader.tensor_bytes(info).clone().view(torch.float32))

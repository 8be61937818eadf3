"""An encoder's deltas on the shape a ModelConfig gives: BERT, RoBERTa/XLM-R and NomicBERT.

A BERT-family encoder attends bidirectionally over its whole input and holds no K/V: its
config's `attention_layers` is empty, and it is served for embeddings and scores only (the
forward is model/encoder.py). What differs from the decoder's shape is here:

- positions: BERT and RoBERTa learn a table of them (RoBERTa's starts past its padding id,
  `position_offset`), NomicBERT turns q and k by rotary (the config's `rope_theta`);
- token types: a learned row added per segment, 0 up to the first separator and 1 after it,
  as the tokenizer writes a (query, document) pair;
- LayerNorms with a bias, after each residual (post-norm), and one on the embeddings;
- the MLP: GELU (erf) over one projection with biases (BERT), or SwiGLU without (NomicBERT);
- q, k and v stored apart (BERT) or as one projection (NomicBERT's `Wqkv`, GGUF's `attn_qkv`).

`encoder_config` reads a Hugging Face `config.json` (model_type `bert`, `roberta`,
`xlm-roberta`, `nomic_bert`, in transformers' names or nomic's own); gguf_config.py reads a
GGUF's `bert` and `nomic-bert` metadata into the same fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError

EncoderAct = Literal["gelu", "gelu_tanh", "silu"]
ENCODER_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "nomic_bert")
_ACTS: dict[str, EncoderAct] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swiglu": "silu",
}


@dataclass(frozen=True, slots=True)
class EncoderLayers:
    act: EncoderAct  # the MLP's activation (SwiGLU's gate is silu)
    layer_norm_eps: float
    type_vocab_size: int  # rows of the token-type table (0: none)
    learned_positions: bool  # a position table (BERT, RoBERTa); else rotary (NomicBERT)
    position_offset: int  # the table row of position 0 (RoBERTa: its padding id + 1)
    swiglu: bool  # a gate and an up projection (NomicBERT); else one up projection
    biases: bool  # every linear carries a bias (BERT, RoBERTa; not NomicBERT)
    fused_qkv: bool  # q, k and v stored as one projection (NomicBERT's `Wqkv`, as transformers
    # saves it too)
    sep_token_id: int | None = None  # where the second segment's token type begins

    def check(self, source: str) -> None:
        if self.act not in _ACTS.values():
            raise UnsupportedModelError(source, f"encoder activation {self.act!r}")
        eps = self.layer_norm_eps
        if not isinstance(eps, float) or not math.isfinite(eps) or eps <= 0:
            raise ConfigError(source, f"layer_norm_eps={eps!r} must be a positive finite float")
        for name in ("type_vocab_size", "position_offset"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ConfigError(source, f"{name}={value!r} must be a non-negative integer")


def encoder_fields(config_json: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The ModelConfig fields of an encoder's `config.json` (its `encoder` among them)."""
    model_type = config_json.get("model_type")
    nomic = model_type == "nomic_bert"
    hub = nomic and "n_embd" in config_json  # nomic's own config (trust_remote_code)

    def field(*names: str, default: Any = None) -> Any:
        for name in names:
            if config_json.get(name) is not None:
                return config_json[name]
        if default is not None:
            return default
        raise ConfigError(source, f"required field {names[0]!r} is missing")

    kind = config_json.get("position_embedding_type", "absolute")
    if not nomic and kind != "absolute":
        raise UnsupportedModelError(source, f"position_embedding_type={kind!r}")
    act_name = str(field("hidden_act", "activation_function", default="gelu"))
    if act_name not in _ACTS:
        raise UnsupportedModelError(source, f"hidden_act={act_name!r}")
    hidden = field("hidden_size", "n_embd")
    heads = field("num_attention_heads", "n_head")
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0 or hidden % heads:
        raise ConfigError(source, f"hidden_size={hidden!r} is not a multiple of heads={heads!r}")
    pad = config_json.get("pad_token_id")
    offset = int(pad) + 1 if model_type in ("roberta", "xlm-roberta") and pad is not None else 0
    stored_positions = int(field("max_position_embeddings", "n_positions", default=512))
    if nomic and hub:
        if config_json.get("rotary_emb_fraction", 1.0) != 1.0 or config_json.get(
            "rotary_emb_interleaved", False
        ):
            raise UnsupportedModelError(source, "a partial or interleaved rotary (nomic)")
        if config_json.get("prenorm", False):
            raise UnsupportedModelError(source, "prenorm=true (nomic)")
    rope = config_json.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", config_json.get("rotary_emb_base", 1000.0)))
    encoder = EncoderLayers(
        act=_ACTS[act_name],
        layer_norm_eps=float(field("layer_norm_eps", "layer_norm_epsilon", default=1e-12)),
        type_vocab_size=int(config_json.get("type_vocab_size", 2)),
        learned_positions=not nomic,
        position_offset=offset,
        swiglu=nomic,
        biases=not nomic or bool(config_json.get("qkv_proj_bias", False)),
        fused_qkv=False,  # as the file stores them (encoder_names.with_fused_qkv)
        sep_token_id=config_json.get("sep_token_id"),
    )
    encoder.check(source)
    return {
        "architecture": "nomic_bert" if nomic else "bert",
        "vocab_size": field("vocab_size"),
        "hidden_size": hidden,
        "intermediate_size": field("intermediate_size", "n_inner", default=4 * hidden),
        "num_layers": field("num_hidden_layers", "n_layer"),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "rope_theta": theta if nomic else 10000.0,
        "rope_scaling": None,
        "rms_norm_eps": encoder.layer_norm_eps,
        "tie_word_embeddings": True,
        "attention_bias": encoder.biases,
        "max_position_embeddings": stored_positions - offset,
        "eos_token_ids": (),
        "bos_token_id": None,
        "encoder": encoder,
    }


def gguf_encoder_fields(
    key: Callable[..., Any],
    gguf_names: frozenset[str],
    vocab_size: int,
    *,
    nomic: bool,
    type_count: int | None,
) -> dict[str, Any]:
    """The ModelConfig fields of a `bert` or `nomic-bert` GGUF (`key(name, default)` reads
    `{arch}.name`; `type_count` is the tokenizer's token-type count): llama.cpp's converter trims RoBERTa's position table to start at 0, stores
    NomicBERT's q, k and v as one `attn_qkv`, and its MLP as SwiGLU."""
    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    types = int(type_count or 2)  # `tokenizer.ggml.token_type_count`
    encoder = EncoderLayers(
        act="silu" if nomic else "gelu",
        layer_norm_eps=float(key("attention.layer_norm_epsilon", 1e-12)),
        type_vocab_size=types if "token_types.weight" in gguf_names else 0,
        learned_positions="position_embd.weight" in gguf_names,
        position_offset=0,
        swiglu="blk.0.ffn_gate.weight" in gguf_names,
        biases="blk.0.attn_output.bias" in gguf_names,
        fused_qkv="blk.0.attn_qkv.weight" in gguf_names,
    )
    return {
        "architecture": "nomic_bert" if nomic else "bert",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_layers": int(key("block_count")),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // max(heads, 1),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "rms_norm_eps": encoder.layer_norm_eps,
        "tie_word_embeddings": True,
        "attention_bias": encoder.biases,
        "max_position_embeddings": int(key("context_length")),
        "eos_token_ids": (),
        "bos_token_id": None,
        "encoder": encoder,
    }

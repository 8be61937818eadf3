"""How a Hugging Face config.json spells what ModelConfig holds, where families spell it their
own way: the MLP's activation, token ids, Granite's multipliers, Qwen3.5's text_config nested
in its multimodal checkpoint; and the fields that describe something not built, refused in one
line rather than served wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError
from nanoserve.runtime.loading.rope import number

Activation = Literal["silu", "gelu_tanh"]
ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
}
HF_ACTIVATIONS: dict[Activation, str] = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}
# transformers' defaults for the fields a config.json may leave out
DEFAULT_MAX_POSITIONS: dict[str, int] = {
    "llama": 2048,
    "qwen2": 32768,
    "qwen3": 32768,
    "mistral": 131072,
    "gemma3": 131072,
    "gemma4": 131072,
    "smollm3": 32768,
    "phi3": 4096,
    "lfm2": 128_000,
    "qwen3_5": 32768,
    "granitemoehybrid": 2048,
    "qwen3_moe": 32768,
    "olmoe": 4096,
    "gpt_oss": 131072,
}
DEFAULT_RMS_NORM_EPS = 1e-6


def activation(arch: str, config_json: Mapping[str, Any], source: str) -> Activation:
    """The MLP's gate: SiLU, or tanh-approximate GELU (Gemma's `hidden_activation`)."""
    gemma = arch in ("gemma3", "gemma4")
    act = config_json.get("hidden_activation" if gemma else "hidden_act")
    act = act or ("gelu_pytorch_tanh" if gemma else "silu")
    if act not in ACTIVATIONS:
        raise UnsupportedModelError(
            source, f"hidden_act={act!r} (supported: {', '.join(ACTIVATIONS)})"
        )
    return ACTIVATIONS[act]


def check_unbuilt_fields(arch: str, config_json: Mapping[str, Any], source: str) -> None:
    """Refuse, naming it, a field whose model the forward does not compute."""
    if config_json.get("mlp_bias", False):
        raise UnsupportedModelError(source, "mlp_bias=True is not supported")
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if arch == "gemma4" and name == "final_logit_softcapping":
            continue  # Gemma 4's is built (ModelConfig.final_logit_softcap)
        if config_json.get(name) is not None:
            raise UnsupportedModelError(source, f"{name}={config_json[name]!r} is not supported")
    if config_json.get("use_bidirectional_attention") and arch != "gemma3":
        raise UnsupportedModelError(
            source, "use_bidirectional_attention=True is supported for Gemma 3 (EmbeddingGemma)"
        )
    if arch == "olmoe" and config_json.get("clip_qkv") is not None:
        raise UnsupportedModelError(
            source, f"clip_qkv={config_json['clip_qkv']!r} is not supported"
        )


def granite_number(config_json: Mapping[str, Any], name: str, granite: bool, source: str) -> float:
    """One of Granite's multipliers (1.0 for every other family, and where it leaves it out)."""
    if not granite or config_json.get(name) is None:
        return 1.0
    return number(config_json[name], name, source)


def text_config(config_json: Mapping[str, Any], text_type: str, source: str) -> dict[str, Any]:
    """The language model's config of a checkpoint with its towers (Qwen3.5's vision tower,
    Gemma 4's vision and audio): its `text_config` as `text_type`, with the top level's token
    ids and tying where it leaves them out."""
    text = config_json.get("text_config")
    if not isinstance(text, Mapping):
        model_type = config_json.get("model_type")
        raise ConfigError(source, f"model_type {model_type!r} without a text_config object")
    merged = {"model_type": text_type, **text}
    for name in ("tie_word_embeddings", "eos_token_id", "bos_token_id"):
        if name not in merged and name in config_json:
            merged[name] = config_json[name]
    return merged


def or_default(value: Any, default: Any) -> Any:
    return default if value is None else value


def token_ids(value: Any, name: str, source: str) -> tuple[int, ...]:
    """One id or a list of them, de-duplicated in order (None: none)."""
    if value is None:
        return ()
    values = value if isinstance(value, list | tuple) else [value]
    if any(type(v) is not int for v in values):
        raise ConfigError(source, f"{name}={value!r} must be an integer or a list of integers")
    return tuple(dict.fromkeys(values))

"""Which layers of a `config.json` attend within a sliding window and which turn no rotary:
`layer_types` where the config lists them, else each family's own rule (Gemma 3's five in six,
Qwen's `max_window_layers`, SmolLM3's every fourth without rotary)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError
from nanoserve.runtime.loading.recurrent_layers import (
    LFM2_CONV,
    LINEAR_ATTENTION,
    MAMBA,
    lfm2_layer_types,
)

GEMMA3_SLIDING_PATTERN = 6  # five sliding layers, then one global


def layer_types(
    arch: str, config_json: Mapping[str, Any], num_layers: Any, source: str
) -> list[str]:
    """Each layer's mixer: "sliding" or "full" attention, LFM2's "conv", Qwen3.5's
    "linear_attention" or Granite 4.0-H's "mamba" (an unknown kind is refused: a recurrent layer
    must never run as softmax attention)."""
    if type(num_layers) is not int or num_layers <= 0:
        return []
    given = (
        lfm2_layer_types(config_json, num_layers)
        if arch == "lfm2"
        else config_json.get("layer_types")
    )
    if given is None:
        if arch == "granitemoehybrid":  # transformers' default: every layer Mamba2
            return [MAMBA] * num_layers
        if arch in ("gemma3", "gemma4"):
            pattern = config_json.get("sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
            return ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers)]
        if arch in ("qwen2", "qwen3", "qwen3_moe") and config_json.get("use_sliding_window"):
            first = config_json.get("max_window_layers", num_layers)
            return ["sliding" if i >= first else "full" for i in range(num_layers)]
        return ["sliding"] * num_layers  # a window (if any) applies to every layer
    if not isinstance(given, list) or len(given) != num_layers:
        raise ConfigError(source, f"layer_types must list {num_layers} layers, got {given!r}")
    kinds = {"sliding_attention": "sliding", "full_attention": "full"}
    if arch == "lfm2":
        kinds[LFM2_CONV] = LFM2_CONV
    if arch == "qwen3_5":
        kinds[LINEAR_ATTENTION] = LINEAR_ATTENTION
    if arch == "granitemoehybrid":  # its own names, and the ones transformers 5 writes
        kinds |= {MAMBA: MAMBA, LINEAR_ATTENTION: MAMBA, "attention": "full"}
    if unknown := next((t for t in given if t not in kinds), None):
        known = ", ".join(kinds)
        raise UnsupportedModelError(
            source, f"layer type {unknown!r} is not supported here (supported: {known})"
        )
    return [kinds[t] for t in given]


def sliding_window(
    arch: str, config_json: Mapping[str, Any], layer_types: list[str], max_pos: Any
) -> int | None:
    window = config_json.get("sliding_window")
    if window is None or "sliding" not in layer_types:
        return None
    qwens = ("qwen2", "qwen3", "qwen3_moe", "smollm3")
    if arch in qwens and not config_json.get("use_sliding_window"):
        return None  # these configs carry a window size but use it only when told to
    if isinstance(max_pos, int) and isinstance(window, int) and window >= max_pos:
        return None  # wider than any context (Phi-4-mini's 262144, Mistral's 4096 at 4k)
    return window


def bidirectional_window(window: int) -> int:
    """A bidirectional model's sliding window as ModelConfig holds it (`|i - j| < result`) from
    the one its files store: transformers halves it (`window // 2 + 1`, exclusive), and
    llama.cpp's symmetric window reads the same pairs (`|i - j| <= window / 2`)."""
    return window // 2 + 1


def no_rope_layers(arch: str, config_json: Mapping[str, Any], num_layers: Any) -> tuple[int, ...]:
    if arch == "granitemoehybrid" and type(num_layers) is int:  # rotary only when it says "rope"
        return (
            () if config_json.get("position_embedding_type") == "rope" else tuple(range(num_layers))
        )
    if arch != "smollm3" or type(num_layers) is not int:
        return ()
    flags = config_json.get("no_rope_layers")
    if flags is None:
        interval = config_json.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    return tuple(i for i, uses_rope in enumerate(flags[:num_layers]) if not uses_rope)

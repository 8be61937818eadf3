"""Rotary position embeddings as a config names them: the scalings (Llama 3's blend, linear,
GGUF frequency factors, Phi-3's longrope, YaRN), their parsing from and writing to `config.json`.
The maths the forward makes of them is model/rotary.py."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError

DEFAULT_ROPE_THETA: dict[str, float] = {
    "llama": 10000.0,
    "qwen2": 10000.0,
    "qwen3": 10000.0,
    "mistral": 10000.0,
    "gemma3": 1_000_000.0,
    "gemma4": 1_000_000.0,
    "smollm3": 2_000_000.0,
    "phi3": 10000.0,
    "lfm2": 1_000_000.0,
    "qwen3_5": 10_000_000.0,
    "granitemoehybrid": 10000.0,
    "qwen3_moe": 10000.0,
    "olmoe": 10000.0,
    "gpt_oss": 150000.0,
}
_GEMMA3_LOCAL_ROPE_THETA = 10000.0
GEMMA3_LOCAL_ROPE_THETA = 10000.0


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama-3 style rotary scaling: long wavelengths slowed by `factor`, short ones untouched."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True)
class LinearRope:
    """Positions divided by `factor` (Gemma 3's global layers from 4B up)."""

    factor: float


@dataclass(frozen=True, slots=True)
class FreqFactors:
    """Llama-3 scaling as a GGUF stores it (llama.cpp's `rope_freqs` tensor): frequency i
    divided by factors[i], the converter's float32 rounding of the same blend."""

    factors: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class LongRope:
    """Phi-3's "longrope": a divisor per frequency, short or long, and cos and sin scaled by
    `attention_factor`. Which set applies is fixed per deployment, as llama.cpp fixes it: the
    long one when the served context exceeds the pretraining context (transformers re-picks per
    call by the longest sequence, which would turn a cached key differently mid-sequence)."""

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    attention_factor: float


@dataclass(frozen=True, slots=True)
class Yarn:
    """YaRN (gpt-oss, Qwen3's long contexts): each frequency a blend of itself (fast ones,
    `beta_fast` rotations and more over the pretraining context) and itself over `factor` (slow
    ones, `beta_slow` and fewer), linear in the dimension between; cos and sin times
    `attention_factor` (0.1·ln(factor) + 1 unless the config gives it). `truncate`: the blend's
    bounds rounded out to whole dimensions (transformers' default, and llama.cpp's rule)."""

    factor: float
    original_max_position_embeddings: int
    attention_factor: float
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True


Scaling = RopeScaling | LinearRope | FreqFactors | LongRope | Yarn


@dataclass(frozen=True, slots=True)
class Rope:
    theta: Any
    scaling: Scaling | None
    sliding_theta: float | None
    partial: float  # the fraction of a head rotary turns


def parse_rope(arch: str, config_json: Mapping[str, Any], source: str) -> Rope:
    # transformers 5 writes `rope_parameters` (theta inside; Gemma 3 one per layer type); 4.x
    # wrote `rope_theta` + `rope_scaling` (+ Gemma's `rope_local_base_freq`).
    params: Any = config_json.get("rope_parameters") or config_json.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(source, f"rope_parameters={params!r} must be an object")
    sliding_theta = None
    if arch in ("gemma3", "gemma4"):
        local = params.get("sliding_attention") or {}
        params = params.get("full_attention", params)
        if config_json.get("rope_scaling"):  # 4.x: the global layers' scaling only
            params = config_json["rope_scaling"]
        sliding_theta = number(
            local.get(
                "rope_theta", config_json.get("rope_local_base_freq", GEMMA3_LOCAL_ROPE_THETA)
            ),
            "rope_local_base_freq",
            source,
        )
        if local.get("rope_type", "default") != "default":
            raise UnsupportedModelError(source, f"sliding layers' rope_type={local['rope_type']!r}")
    theta = params.get("rope_theta", config_json.get("rope_theta", DEFAULT_ROPE_THETA[arch]))
    partial = params.get("partial_rotary_factor", config_json.get("partial_rotary_factor", 1.0))
    if isinstance(partial, bool) or not isinstance(partial, int | float) or not 0 < partial <= 1:
        raise ConfigError(source, f"partial_rotary_factor={partial!r} must be in (0, 1]")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if arch == "gemma4" and rope_type == "proportional":  # ModelConfig.full_rope_fraction
        rope_type, partial = "default", 1.0
    if rope_type == "su":  # Phi-3's first name for longrope
        rope_type = "longrope"
    scaling: Scaling | None
    try:
        if rope_type == "default":
            scaling = None
        elif rope_type == "linear":
            scaling = LinearRope(factor=number(params["factor"], "rope factor", source))
        elif rope_type == "llama3":
            scaling = RopeScaling(
                factor=number(params["factor"], "rope factor", source),
                low_freq_factor=number(params["low_freq_factor"], "low_freq_factor", source),
                high_freq_factor=number(params["high_freq_factor"], "high_freq_factor", source),
                original_max_position_embeddings=params["original_max_position_embeddings"],
            )
        elif rope_type == "longrope":
            scaling = _long_rope(params, config_json, source)
        elif rope_type == "yarn":
            scaling = _yarn(params, config_json, source)
        else:
            raise UnsupportedModelError(
                source,
                f"rope_type={rope_type!r} is not supported (supported: default, linear, llama3,"
                " longrope, yarn)",
            )
    except KeyError as missing:
        raise ConfigError(source, f"{rope_type} rope scaling lacks {missing.args[0]!r}") from None
    return Rope(theta, scaling, sliding_theta, float(partial))


def rope_to_hf(theta: float, s: Scaling | None) -> dict[str, Any]:
    if isinstance(s, FreqFactors):  # the blend's parameters are not in a GGUF, only its result
        raise UnsupportedModelError(
            "config", "rope_freqs factors (a Llama 3.x GGUF) have no config.json form"
        )
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if isinstance(s, RopeScaling):
        rope |= {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    elif isinstance(s, LinearRope):
        rope |= {"rope_type": "linear", "factor": s.factor}
    elif isinstance(s, Yarn):
        rope |= {
            "rope_type": "yarn",
            "factor": s.factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
            "attention_factor": s.attention_factor,
            "beta_fast": s.beta_fast,
            "beta_slow": s.beta_slow,
            "truncate": s.truncate,
        }
    elif isinstance(s, LongRope):
        rope |= {
            "rope_type": "longrope",
            "short_factor": list(s.short_factor),
            "long_factor": list(s.long_factor),
            "attention_factor": s.attention_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    return rope


def check_rope_scaling(s: Scaling, rope_dim: int, source: str) -> None:
    if isinstance(s, Yarn):
        for name in ("factor", "attention_factor", "beta_fast", "beta_slow"):
            value = getattr(s, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(source, f"yarn {name}={value!r} must be positive")
        if (
            type(s.original_max_position_embeddings) is not int
            or s.original_max_position_embeddings <= 0
        ):
            raise ConfigError(
                source,
                f"yarn original_max_position_embeddings={s.original_max_position_embeddings!r}"
                " must be a positive integer",
            )
        return
    if isinstance(s, LinearRope):
        if not math.isfinite(s.factor) or s.factor <= 0:
            raise ConfigError(source, f"linear rope factor={s.factor!r} must be positive")
        return
    if isinstance(s, LongRope):
        half = rope_dim // 2
        for name in ("short_factor", "long_factor"):
            values = getattr(s, name)
            if len(values) != half or not all(math.isfinite(v) and v > 0 for v in values):
                raise ConfigError(
                    source, f"longrope {name} must be {half} positive numbers, got {len(values)}"
                )
        if not math.isfinite(s.attention_factor) or s.attention_factor <= 0:
            raise ConfigError(source, f"longrope attention_factor={s.attention_factor!r}")
        return
    if isinstance(s, FreqFactors):
        half = rope_dim // 2
        if len(s.factors) != half or not all(math.isfinite(f) and f > 0 for f in s.factors):
            raise ConfigError(
                source, f"rope_freqs must be {half} positive factors, got {len(s.factors)}"
            )
        return
    for name in ("factor", "low_freq_factor", "high_freq_factor"):
        value = getattr(s, name)
        if not isinstance(value, float) or not math.isfinite(value) or value <= 0:
            raise ConfigError(
                source, f"rope scaling {name}={value!r} must be a positive finite float"
            )
    if s.high_freq_factor <= s.low_freq_factor:  # the blend divides by their difference
        raise ConfigError(
            source,
            f"rope scaling high_freq_factor={s.high_freq_factor} must exceed low_freq_factor={s.low_freq_factor}",
        )
    value = s.original_max_position_embeddings
    if type(value) is not int or value <= 0:
        raise ConfigError(
            source, f"original_max_position_embeddings={value!r} must be a positive integer"
        )


def _long_rope(params: Mapping[str, Any], config_json: Mapping[str, Any], source: str) -> LongRope:
    """transformers' longrope parameters: the pretraining context from the config (Phi-3 keeps
    it beside a raised max_position_embeddings), and the attention factor from their ratio
    where none is given."""
    original = params.get(
        "original_max_position_embeddings", config_json.get("original_max_position_embeddings")
    )
    if type(original) is not int or original <= 0:
        raise ConfigError(source, f"original_max_position_embeddings={original!r} (longrope)")
    factor = config_json.get("max_position_embeddings", original) / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))

    def factors(name: str) -> tuple[float, ...]:
        values = params[name]
        if not isinstance(values, list | tuple) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values
        ):
            raise ConfigError(source, f"longrope {name} must be a list of numbers")
        return tuple(float(v) for v in values)

    return LongRope(
        short_factor=factors("short_factor"),
        long_factor=factors("long_factor"),
        original_max_position_embeddings=original,
        attention_factor=number(attention, "attention_factor", source),
    )


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's cos/sin scale for a context stretched by `factor` (the paper's 0.1·ln(s) + 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(params: Mapping[str, Any], config_json: Mapping[str, Any], source: str) -> Yarn:
    """transformers' yarn parameters: the factor (else the ratio of the two contexts), the
    attention factor (else from the factor, or DeepSeek's `mscale` / `mscale_all_dim`)."""
    original = params.get(
        "original_max_position_embeddings", config_json.get("original_max_position_embeddings")
    )
    if type(original) is not int or original <= 0:
        raise ConfigError(source, f"original_max_position_embeddings={original!r} (yarn)")
    factor = params.get("factor")
    if factor is None:
        factor = config_json.get("max_position_embeddings", original) / original
    factor = number(factor, "rope factor", source)
    attention = params.get("attention_factor")
    mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
    if attention is None and mscale and mscale_all:
        attention = yarn_attention_factor(factor, mscale) / yarn_attention_factor(
            factor, mscale_all
        )
    elif attention is None:
        attention = yarn_attention_factor(factor)
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ConfigError(source, f"yarn truncate={truncate!r} must be a bool")
    return Yarn(
        factor=factor,
        original_max_position_embeddings=original,
        attention_factor=number(attention, "attention_factor", source),
        beta_fast=number(params.get("beta_fast") or 32, "beta_fast", source),
        beta_slow=number(params.get("beta_slow") or 1, "beta_slow", source),
        truncate=truncate,
    )


def number(value: Any, name: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(source, f"{name}={value!r} must be a number")
    return float(value)

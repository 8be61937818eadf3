"""The shape of a decoder-only model, and the rotary frequencies it implies.

One frozen `ModelConfig` describes every architecture nanoserve runs (Llama, Qwen2, Mistral): they
differ only in the fields here. It is built from a Hugging Face `config.json` (`from_hf`) or from
GGUF metadata (`gguf_file.py`), and validated on construction, so a config that exists is usable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError

Architecture = Literal["llama", "qwen2", "mistral"]
ARCHITECTURES: tuple[Architecture, ...] = ("llama", "qwen2", "mistral")
HF_CLASS_NAMES: dict[Architecture, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
# transformers' defaults for the fields a config.json may leave out
_DEFAULT_MAX_POSITIONS: dict[Architecture, int] = {"llama": 2048, "qwen2": 32768, "mistral": 131072}
_DEFAULT_RMS_NORM_EPS = 1e-6
_DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama-3 style rotary scaling: long wavelengths slowed by `factor`, short ones untouched."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: Architecture
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rope_scaling: RopeScaling | None
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (always for qwen2)
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    def __post_init__(self) -> None:
        self.check("ModelConfig")  # `from_hf` re-raises naming the file it read

    @property
    def q_size(self) -> int:
        """Width of the query projection's output: num_heads * head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (and of the value) projection's output: num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    def check(self, source: str) -> None:
        """Raise `ConfigError` naming the first field whose value cannot describe a model."""
        if self.architecture not in ARCHITECTURES:
            raise UnsupportedModelError(
                source, f"architecture {self.architecture!r} is not one of {ARCHITECTURES}"
            )
        for name in (f.name for f in fields(self) if f.type == "int"):  # every int is a size
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(source, f"{name}={value!r} must be a positive integer")
        if self.num_heads % self.num_kv_heads != 0:
            raise ConfigError(
                source,
                f"num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}",
            )
        if self.head_dim % 2 != 0:  # rotary embeddings rotate pairs of dimensions
            raise ConfigError(source, f"head_dim={self.head_dim} must be even")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, float) or not math.isfinite(value) or value <= 0:
                raise ConfigError(source, f"{name}={value!r} must be a positive finite float")
        for name in ("tie_word_embeddings", "attention_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(source, f"{name}={getattr(self, name)!r} must be a bool")
        for token_id in (*self.eos_token_ids, self.bos_token_id):
            if token_id is not None and (
                type(token_id) is not int or not 0 <= token_id < self.vocab_size
            ):
                raise ConfigError(
                    source, f"token id {token_id!r} is outside vocab_size={self.vocab_size}"
                )
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling, source)

    @classmethod
    def from_hf(
        cls,
        config_json: Mapping[str, Any],
        generation_config: Mapping[str, Any] | None = None,
        *,
        source: str = "config.json",
    ) -> ModelConfig:
        """Build from a Hugging Face `config.json` dict (transformers 4.x or 5.x layout).

        End-of-sequence ids come from `generation_config.json` when it names them (that is what
        `generate()` stops on), else from `config.json`.
        """
        model_type = config_json.get("model_type")
        if model_type not in ARCHITECTURES:
            raise UnsupportedModelError(
                source,
                f"model_type {model_type!r} is not supported (supported: {', '.join(ARCHITECTURES)})",
            )
        arch: Architecture = model_type
        defaults = {
            "max_position_embeddings": _DEFAULT_MAX_POSITIONS[arch],
            "rms_norm_eps": _DEFAULT_RMS_NORM_EPS,
        }
        if config_json.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                source, f"hidden_act={config_json['hidden_act']!r} (only 'silu')"
            )
        if config_json.get("mlp_bias", False):
            raise UnsupportedModelError(source, "mlp_bias=True is not supported")
        if _uses_sliding_window(arch, config_json):
            raise UnsupportedModelError(
                source,
                f"sliding_window={config_json.get('sliding_window')!r} attention is not supported",
            )

        def field(name: str) -> Any:
            if name in config_json and config_json[name] is not None:
                return config_json[name]
            if name in defaults:
                return defaults[name]
            raise ConfigError(source, f"required field {name!r} is missing")

        num_heads = field("num_attention_heads")
        hidden_size = field("hidden_size")
        head_dim: Any = config_json.get("head_dim")  # checked with the rest by check()
        if head_dim is None and isinstance(hidden_size, int) and isinstance(num_heads, int):
            if num_heads <= 0 or hidden_size % num_heads:
                problem = f"hidden_size={hidden_size} is not a multiple of num_attention_heads={num_heads}"
                raise ConfigError(source, problem)
            head_dim = hidden_size // num_heads
        rope_theta, rope_scaling = _parse_rope(config_json, source)
        eos = (generation_config or {}).get("eos_token_id")
        if eos is None:
            eos = config_json.get("eos_token_id")
        bos = (generation_config or {}).get("bos_token_id", config_json.get("bos_token_id"))

        try:
            return cls(
                architecture=arch,
                vocab_size=field("vocab_size"),
                hidden_size=hidden_size,
                intermediate_size=field("intermediate_size"),
                num_layers=field("num_hidden_layers"),
                num_heads=num_heads,
                num_kv_heads=_or(config_json.get("num_key_value_heads"), num_heads),
                head_dim=head_dim,
                rope_theta=_float(rope_theta, "rope_theta", source),
                rope_scaling=rope_scaling,
                rms_norm_eps=_float(field("rms_norm_eps"), "rms_norm_eps", source),
                tie_word_embeddings=bool(config_json.get("tie_word_embeddings", False)),
                attention_bias=arch == "qwen2" or bool(config_json.get("attention_bias", False)),
                max_position_embeddings=field("max_position_embeddings"),
                eos_token_ids=_token_ids(eos, "eos_token_id", source),
                bos_token_id=bos,
            )
        except ConfigError as error:  # re-raised naming the file rather than the class
            raise ConfigError(source, error.problem) from None

    def to_hf(self) -> dict[str, Any]:
        """A transformers 5 `config.json` dict that `from_hf` (and transformers) reads back as-is."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            s = self.rope_scaling
            rope |= {
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }
        eos: int | list[int] | None = list(self.eos_token_ids) or None
        if isinstance(eos, list) and len(eos) == 1:
            eos = eos[0]
        out: dict[str, Any] = {
            "architectures": [HF_CLASS_NAMES[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
        }
        if self.architecture != "qwen2":  # qwen2's bias is implied by its architecture
            out["attention_bias"] = self.attention_bias
        return out


def rope_inv_freq(config: ModelConfig, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rotary inverse frequencies, `[head_dim // 2]` float32, exactly as transformers computes them."""
    dim = config.head_dim
    # Same op order as transformers (int64 arange, then float32 division and power), so the bits agree.
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    s = config.rope_scaling
    if s is None:
        return inv_freq
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (beyond the original context) are slowed by `factor`; short ones untouched;
    # in between, a linear blend in 1/wavelength.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _parse_rope(config_json: Mapping[str, Any], source: str) -> tuple[Any, RopeScaling | None]:
    # transformers 5 writes `rope_parameters` (theta inside); 4.x wrote `rope_theta` + `rope_scaling`.
    params = config_json.get("rope_parameters") or config_json.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(source, f"rope_parameters={params!r} must be an object")
    theta = params.get("rope_theta", config_json.get("rope_theta", _DEFAULT_ROPE_THETA))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise UnsupportedModelError(
            source, f"rope_type={rope_type!r} is not supported (only 'default', 'llama3')"
        )
    try:
        scaling = RopeScaling(
            factor=_float(params["factor"], "rope factor", source),
            low_freq_factor=_float(params["low_freq_factor"], "low_freq_factor", source),
            high_freq_factor=_float(params["high_freq_factor"], "high_freq_factor", source),
            original_max_position_embeddings=params["original_max_position_embeddings"],
        )
    except KeyError as missing:
        raise ConfigError(source, f"llama3 rope scaling lacks {missing.args[0]!r}") from None
    return theta, scaling


def _check_rope_scaling(s: RopeScaling, source: str) -> None:
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


def _uses_sliding_window(arch: Architecture, config_json: Mapping[str, Any]) -> bool:
    window = config_json.get("sliding_window")
    if arch == "qwen2":  # qwen2 configs carry a window size but only use it when told to
        return bool(config_json.get("use_sliding_window", False))
    if arch == "mistral":  # Mistral v0.1 attends within 4096; later versions set null
        return window is not None and window < config_json.get(
            "max_position_embeddings", window + 1
        )
    return False


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _float(value: Any, name: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(source, f"{name}={value!r} must be a number")
    return float(value)


def _token_ids(value: Any, name: str, source: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list | tuple) else [value]
    if any(type(v) is not int for v in values):
        raise ConfigError(source, f"{name}={value!r} must be an integer or a list of integers")
    return tuple(dict.fromkeys(values))  # de-duplicated, order kept

"""The shape of a model, and the rotary frequencies it implies.

One frozen `ModelConfig` describes every architecture nanoserve runs (Llama, Qwen2, Qwen3,
Mistral, Gemma 3, SmolLM3, Phi-3, LFM2, Qwen3.5, Granite 4.0-H, Qwen3-MoE, OLMoE): they differ
only in the fields here, each a delta on the Llama forward (per-head q/k norms, sandwich norms, GeGLU, sliding-window
layers, layers without rotary, scaled or partial rotary, a gate on attention's output, scaled
residual branches and logits, and a hybrid's recurrent layers: LFM2's short convolutions,
Qwen3.5's gated DeltaNet, Granite's Mamba2; recurrent_layers.py), a mixture of experts in place
of the MLP (Qwen3-MoE, OLMoE; expert_layers.py), and attention both ways over
whole inputs (EmbeddingGemma; the BERT family's encoder, encoder_layers.py). It is built from a
Hugging Face `config.json` (`from_hf`) or from GGUF metadata (`gguf_file.py`), and validated on
construction, so a config that exists is usable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError
from nanoserve.runtime.loading.architectures import (
    ARCHITECTURES,
    HF_MODEL_TYPES,
    Architecture,
)
from nanoserve.runtime.loading.config_fields import (
    DEFAULT_MAX_POSITIONS,
    DEFAULT_RMS_NORM_EPS,
    Activation,
    activation,
    check_unbuilt_fields,
    granite_number,
    or_default,
    qwen3_5_text_config,
    token_ids,
)
from nanoserve.runtime.loading.encoder_layers import (
    ENCODER_MODEL_TYPES,
    EncoderLayers,
    encoder_fields,
)
from nanoserve.runtime.loading.expert_layers import ExpertLayers, hf_experts
from nanoserve.runtime.loading.layer_pattern import (
    bidirectional_window,
    layer_types,
    no_rope_layers,
    sliding_window,
)
from nanoserve.runtime.loading.recurrent_layers import (
    DeltaNetLayers,
    Mamba2Layers,
    ShortConvLayers,
    granite_mamba,
    lfm2_intermediate_size,
    lfm2_short_conv,
    qwen3_5_delta_net,
)
from nanoserve.runtime.loading.rope import Scaling, check_rope_scaling, number, parse_rope


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
    rope_scaling: Scaling | None
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (always for qwen2)
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    # -- the deltas on Llama's forward; the defaults are Llama's -----------------------------
    hidden_act: Activation = "silu"  # the MLP's gate: SiLU, or tanh-approximate GELU (GeGLU)
    qk_norm: bool = False  # an RMSNorm per head on q and k before rotary (Qwen3, Gemma 3)
    projection_qk_norm: bool = False  # an RMSNorm over all of q, and of k, before rotary (OLMoE)
    sandwich_norm: bool = False  # RMSNorm on attention's and the MLP's outputs too (Gemma 3)
    norm_offset: float = 0.0  # added to every RMSNorm weight at load (Gemma's `1 + w`)
    embedding_multiplier: float = 1.0  # the embeddings times this (Gemma: sqrt(hidden))
    query_scale: float | None = None  # attention's score scale; None: head_dim ** -0.5
    rotary_dim: int | None = None  # dimensions rotary turns per head; None: all (Phi-4's 3/4)
    no_rope_layers: tuple[int, ...] = ()  # layers without rotary (SmolLM3's NoPE)
    sliding_window: int | None = None  # tokens a sliding layer sees, itself included
    sliding_layers: tuple[int, ...] = ()  # the layers that attend within the window
    sliding_rope_theta: float | None = None  # their rotary base, if not rope_theta (Gemma 3)
    short_conv: ShortConvLayers | None = None  # LFM2's gated short convolutions, in place of
    # attention on their layers
    delta_net: DeltaNetLayers | None = None  # Qwen3.5's gated DeltaNet, in place of attention
    mamba: Mamba2Layers | None = None  # Granite 4.0-H's Mamba2, in place of attention
    experts: ExpertLayers | None = None  # a mixture of experts, in place of the MLP on its layers
    attn_output_gate: bool = False  # attention's output times sigmoid of a second query half
    residual_multiplier: float = 1.0  # each layer's mixer and MLP outputs times this (Granite)
    logits_scaling: float = 1.0  # the logits divided by this (Granite)
    fused_mlp: bool = False  # the checkpoint stores gate and up as one `gate_up_proj` (Phi-3;
    # Granite's `shared_mlp.input_linear`; a Granite GGUF stores them apart)
    encoder: EncoderLayers | None = None  # a BERT-family encoder's deltas (encoder_layers.py)
    # Attention reads each whole input both ways and keeps no K/V (EmbeddingGemma's Gemma 3);
    # a sliding layer then sees `sliding_window` tokens on each side, itself included.
    bidirectional: bool = False

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

    @property
    def rope_dim(self) -> int:
        """Dimensions of a head that rotary turns (its first ones)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def fused_projections(self) -> bool:
        """The checkpoint stores q, k and v as one `qkv_proj`, gate and up as one `gate_up_proj`
        (Phi-3): the very layout the forward runs, so they are read whole."""
        return self.architecture == "phi3"

    @property
    def attention_scale(self) -> float:
        return self.head_dim**-0.5 if self.query_scale is None else self.query_scale

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        """A hybrid's layers that carry a state in place of K/V (none for a transformer)."""
        conv = self.short_conv.layers if self.short_conv is not None else ()
        delta = self.delta_net.layers if self.delta_net is not None else ()
        mamba = self.mamba.layers if self.mamba is not None else ()
        return tuple(sorted({*conv, *delta, *mamba}))

    @property
    def whole_inputs(self) -> bool:
        """Attention reads each input whole, both ways (a BERT-family encoder, EmbeddingGemma):
        an input is one step's chunk, nothing is kept after it, and nothing decodes."""
        return self.encoder is not None or self.bidirectional

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that attend and hold K/V: all but a hybrid's recurrent ones (none for a
        model that reads whole inputs, whose attention reads only its own input)."""
        if self.whole_inputs:
            return ()
        recurrent = set(self.recurrent_layers)
        return tuple(i for i in range(self.num_layers) if i not in recurrent)

    def layer_state_shapes(self, layer: int) -> tuple[tuple[int, ...], ...]:
        """What `layer` keeps per state slot: a convolution's window, and DeltaNet's matrix."""
        if self.short_conv is not None and layer in self.short_conv.layers:
            return (self.short_conv.state_shape(self.hidden_size),)
        if self.delta_net is not None and layer in self.delta_net.layers:
            return self.delta_net.state_shapes()
        if self.mamba is not None and layer in self.mamba.layers:
            return self.mamba.state_shapes()
        return ()

    @property
    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """One state slot's tensors, every recurrent layer's in layer order (none: no state)."""
        return tuple(s for layer in self.recurrent_layers for s in self.layer_state_shapes(layer))

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of `layer`, or None where it attends to its whole context."""
        return self.sliding_window if layer in self.sliding_layers else None

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
            check_rope_scaling(self.rope_scaling, self.rope_dim, source)
        self._check_deltas(source)

    def _check_deltas(self, source: str) -> None:
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise UnsupportedModelError(source, f"hidden_act={self.hidden_act!r}")
        for name in ("qk_norm", "projection_qk_norm", "sandwich_norm", "fused_mlp"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(source, f"{name}={getattr(self, name)!r} must be a bool")
        for name in (
            "norm_offset",
            "embedding_multiplier",
            "query_scale",
            "sliding_rope_theta",
            "residual_multiplier",
            "logits_scaling",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, float) or not math.isfinite(value)):
                raise ConfigError(source, f"{name}={value!r} must be a finite float")
        rotary = self.rotary_dim
        if rotary is not None and (
            type(rotary) is not int or not 0 < rotary <= self.head_dim or rotary % 2
        ):
            raise ConfigError(
                source, f"rotary_dim={rotary!r} must be even and in 2..head_dim={self.head_dim}"
            )
        for name in ("no_rope_layers", "sliding_layers"):
            layers = getattr(self, name)
            if any(type(i) is not int or not 0 <= i < self.num_layers for i in layers):
                raise ConfigError(
                    source, f"{name}={layers!r} names a layer outside 0..{self.num_layers - 1}"
                )
        window = self.sliding_window
        if window is not None and (type(window) is not int or window <= 0):
            raise ConfigError(source, f"sliding_window={window!r} must be a positive integer")
        if self.sliding_layers and window is None:
            raise ConfigError(
                source, f"sliding_layers={self.sliding_layers} without a sliding_window"
            )
        if self.short_conv is not None:
            self.short_conv.check(self.num_layers, source)
        if self.delta_net is not None:
            self.delta_net.check(self.num_layers, source)
        if self.mamba is not None:
            self.mamba.check(self.num_layers, source)
        if self.encoder is not None:
            self.encoder.check(source)
        if self.experts is not None:
            self.experts.check(self.num_layers, source)
        if not isinstance(self.attn_output_gate, bool):
            raise ConfigError(source, f"attn_output_gate={self.attn_output_gate!r} must be a bool")

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
        if model_type in ENCODER_MODEL_TYPES:  # BERT, RoBERTa/XLM-R, NomicBERT
            try:
                return cls(**encoder_fields(config_json, source))
            except ConfigError as error:
                raise ConfigError(source, error.problem) from None
        if model_type in ("qwen3_5", "qwen3_5_moe"):  # with the vision tower: the text is read
            config_json = qwen3_5_text_config(config_json, source)
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
        moe = arch in ("qwen3_moe", "olmoe", "qwen3_5", "lfm2", "granitemoehybrid")
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
                problem = f"hidden_size={hidden_size} is not a multiple of num_attention_heads={num_heads}"
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
        gemma = arch == "gemma3"

        try:
            return cls(
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
                attention_bias=arch == "qwen2" or bool(config_json.get("attention_bias", False)),
                max_position_embeddings=field("max_position_embeddings"),
                eos_token_ids=token_ids(eos, "eos_token_id", source),
                bos_token_id=bos,
                hidden_act=act,
                qk_norm=arch in ("qwen3", "gemma3", "lfm2", "qwen3_5", "qwen3_moe"),
                projection_qk_norm=arch == "olmoe",
                sandwich_norm=gemma,
                norm_offset=1.0 if gemma or qwen3_5 else 0.0,
                embedding_multiplier=float(hidden_size) ** 0.5
                if gemma
                else granite_number(config_json, "embedding_multiplier", granite, source),
                query_scale=float(config_json.get("query_pre_attn_scalar", 256)) ** -0.5
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
                fused_mlp=arch in ("phi3", "granitemoehybrid"),
                mamba=granite_mamba(config_json, kinds, source) if granite else None,
                experts=hf_experts(arch, config_json, num_layers) if moe else None,
                residual_multiplier=granite_number(
                    config_json, "residual_multiplier", granite, source
                ),
                logits_scaling=granite_number(config_json, "logits_scaling", granite, source),
                bidirectional=bidirectional,
            )
        except ConfigError as error:  # re-raised naming the file rather than the class
            raise ConfigError(source, error.problem) from None

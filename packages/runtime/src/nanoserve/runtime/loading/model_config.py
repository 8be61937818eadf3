"""The shape of a model, and the rotary frequencies it implies.

One frozen `ModelConfig` describes every architecture nanoserve runs (Llama, Qwen2, Qwen3,
Mistral, Gemma 3, SmolLM3, Phi-3, LFM2, Qwen3.5, Granite 4.0-H, Qwen3-MoE, OLMoE, gpt-oss): they
differ only in the fields here, each a delta on the Llama forward (per-head q/k norms, sandwich
norms, GeGLU, attention sinks and an output bias, sliding-window
layers, layers without rotary, scaled or partial rotary, a gate on attention's output, scaled
residual branches and logits, and a hybrid's recurrent layers: LFM2's short convolutions,
Qwen3.5's gated DeltaNet, Granite's Mamba2; recurrent_layers.py), a mixture of experts in place
of the MLP (Qwen3-MoE, OLMoE, gpt-oss...; expert_layers.py), and attention both ways over
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
    Architecture,
)
from nanoserve.runtime.loading.config_fields import (
    Activation,
)
from nanoserve.runtime.loading.encoder_layers import (
    EncoderLayers,
)
from nanoserve.runtime.loading.expert_layers import ExpertLayers
from nanoserve.runtime.loading.hf_fields import hf_model_fields
from nanoserve.runtime.loading.per_layer_inputs import PerLayerInputs
from nanoserve.runtime.loading.recurrent_layers import (
    DeltaNetLayers,
    Mamba2Layers,
    ShortConvLayers,
)
from nanoserve.runtime.loading.rope import Scaling, check_rope_scaling


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
    # A learned logit per head in attention's softmax denominator (gpt-oss's `sinks`): each
    # weight is exp(s_i) / (sum_j exp(s_j) + exp(sink)), and the sink takes no value.
    attention_sinks: bool = False
    output_bias: bool = False  # attention's output projection has a bias (gpt-oss)
    residual_multiplier: float = 1.0  # each layer's mixer and MLP outputs times this (Granite)
    logits_scaling: float = 1.0  # the logits divided by this (Granite)
    fused_mlp: bool = False  # the checkpoint stores gate and up as one `gate_up_proj` (Phi-3;
    # Granite's `shared_mlp.input_linear`; a Granite GGUF stores them apart)
    encoder: EncoderLayers | None = None  # a BERT-family encoder's deltas (encoder_layers.py)
    # Attention reads each whole input both ways and keeps no K/V (EmbeddingGemma's Gemma 3);
    # a sliding layer then sees `sliding_window` tokens on each side, itself included.
    bidirectional: bool = False
    # -- Gemma 4's deltas (per_layer_inputs.py reads them) ---------------------------------
    full_head_dim: int | None = None  # the full-attention layers' own head_dim (512)
    full_kv_heads: int | None = None  # and their own K/V heads, where they differ
    # Proportional rotary on the full layers: the first `fraction` of each head's frequency
    # pairs turn (at exponents of the whole head_dim), the rest stand still.
    full_rope_fraction: float | None = None
    # Layers that read the K/V of the last earlier layer of their kind and write none.
    shared_kv_layers: tuple[int, ...] = ()
    k_eq_v: bool = False  # a full layer's V is its K projection (no v_proj; `attention_k_eq_v`)
    v_norm: bool = False  # an RMSNorm without weight on each V head
    double_wide_mlp: bool = False  # the K/V-sharing layers' MLP is twice intermediate_size
    per_layer_inputs: PerLayerInputs | None = None  # a second embedding, a slice per layer
    layer_scalar: bool = False  # each layer's output times its learned scalar
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)

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

    def is_full_layer(self, layer: int) -> bool:
        """An attention layer that sees its whole context (not a sliding one)."""
        return layer not in self.sliding_layers and layer not in self.recurrent_layers

    def layer_head_dim(self, layer: int) -> int:
        """The head_dim of `layer`'s q, k and v: Gemma 4's full layers have their own."""
        if self.full_head_dim is not None and self.is_full_layer(layer):
            return self.full_head_dim
        return self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        """The K/V heads of `layer`: Gemma 4's full layers may have their own."""
        if self.full_kv_heads is not None and self.is_full_layer(layer):
            return self.full_kv_heads
        return self.num_kv_heads

    def kv_source(self, layer: int) -> int:
        """The layer whose K/V `layer` reads: itself, or for a K/V-sharing layer the last
        layer of its kind (sliding or full) before the sharing ones."""
        if layer not in self.shared_kv_layers:
            return layer
        first = min(self.shared_kv_layers)
        sliding = layer in self.sliding_layers
        return max(i for i in range(first) if (i in self.sliding_layers) == sliding)

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The attention layers that write K/V: each holds a layer of the pool."""
        return tuple(i for i in self.attention_layers if i not in self.shared_kv_layers)

    @property
    def kv_layer_shapes(self) -> tuple[tuple[int, int], ...]:
        """(kv_heads, head_dim) of each K/V-holding layer, where they differ; else ()."""
        shapes = tuple((self.layer_kv_heads(i), self.layer_head_dim(i)) for i in self.kv_layers)
        return shapes if len(set(shapes)) > 1 else ()

    def layer_intermediate_size(self, layer: int) -> int:
        """The MLP's width on `layer`: twice the config's on Gemma 4's K/V-sharing layers."""
        wide = self.double_wide_mlp and layer in self.shared_kv_layers
        return self.intermediate_size * (2 if wide else 1)

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
        for name in ("attn_output_gate", "attention_sinks", "output_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(source, f"{name}={getattr(self, name)!r} must be a bool")
        self._check_gemma4(source)

    def _check_gemma4(self, source: str) -> None:
        """Raise `ConfigError` where Gemma 4's fields cannot describe a model."""
        dim, heads = self.full_head_dim, self.full_kv_heads
        if dim is not None and (type(dim) is not int or dim <= 0 or dim % 2):
            raise ConfigError(source, f"full_head_dim={dim!r} must be an even positive integer")
        if heads is not None and (type(heads) is not int or heads <= 0):
            raise ConfigError(source, f"full_kv_heads={heads!r} must be a positive integer")
        if self.full_kv_heads is not None and self.num_heads % self.full_kv_heads:
            raise ConfigError(
                source,
                f"full_kv_heads={self.full_kv_heads} does not divide num_heads={self.num_heads}",
            )
        fraction = self.full_rope_fraction
        if fraction is not None and not 0 < fraction <= 1:
            raise ConfigError(source, f"full_rope_fraction={fraction!r} must be in (0, 1]")
        cap = self.final_logit_softcap
        if cap is not None and (not isinstance(cap, float) or not cap > 0):
            raise ConfigError(source, f"final_logit_softcap={cap!r} must be a positive float")
        p = self.per_layer_inputs
        if p is not None and (type(p.vocab_size) is not int or type(p.width) is not int
                              or p.vocab_size <= 0 or p.width <= 0):  # fmt: skip
            raise ConfigError(source, f"per-layer inputs {p} must have positive integer sizes")
        shared = self.shared_kv_layers
        if not shared:
            return
        if shared != tuple(range(shared[0], self.num_layers)) or shared[0] == 0:
            raise ConfigError(source, f"shared_kv_layers={shared} must be the last layers, not all")
        for sliding in (True, False):
            kind = "sliding" if sliding else "full"
            reads = [i for i in shared if (i in self.sliding_layers) == sliding]
            if reads and not any((i in self.sliding_layers) == sliding for i in range(shared[0])):
                raise ConfigError(
                    source,
                    f"K/V-sharing {kind} layers {reads} have no earlier {kind} layer to read",
                )

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
        fields_ = hf_model_fields(config_json, generation_config, source)
        try:
            return cls(**fields_)
        except ConfigError as error:
            raise ConfigError(source, error.problem) from None

"""The recurrent layers of a hybrid model's config: which layers carry a state instead of
K/V, and the shapes of that state.

LFM2 mixes attention with short gated convolutions: such a layer projects its input to three
parts (B, C, x), convolves B*x along time with a depthwise kernel of `kernel` taps, and gates
the result by C. Its state is the window of its last `kernel - 1` inputs per channel. The
config names them in `layer_types` ("conv" beside "full_attention") or, in older files, by
listing the attention layers (`full_attn_idxs`).

Qwen3.5 mixes attention with gated DeltaNet (linear attention): such a layer convolves its
q, k and v projections along time (a depthwise kernel, as above), then keeps per value head a
[k_dim, v_dim] matrix that each token decays and corrects by the delta rule. Its state is that
window and that matrix. `layer_types` names them "linear_attention".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError

LFM2_CONV = "conv"  # config.json's layer type of an LFM2 short-convolution layer
LINEAR_ATTENTION = "linear_attention"  # config.json's layer type of a gated DeltaNet layer


@dataclass(frozen=True, slots=True)
class ShortConvLayers:
    """LFM2's gated short convolutions: the layers that have one (in place of attention), the
    taps of its depthwise kernel, and whether its three linears and the kernel carry a bias."""

    layers: tuple[int, ...]
    kernel: int
    bias: bool

    def check(self, num_layers: int, source: str) -> None:
        if type(self.kernel) is not int or self.kernel < 2:
            raise ConfigError(source, f"conv_L_cache={self.kernel!r} must be an integer >= 2")
        if not isinstance(self.bias, bool):
            raise ConfigError(source, f"conv_bias={self.bias!r} must be a bool")
        if any(type(i) is not int or not 0 <= i < num_layers for i in self.layers):
            raise ConfigError(
                source, f"conv layers {self.layers} name a layer outside 0..{num_layers - 1}"
            )
        if len(set(self.layers)) >= num_layers:
            raise UnsupportedModelError(
                source, f"all {num_layers} layers are convolutions: no layer attends"
            )

    def state_shape(self, hidden_size: int) -> tuple[int, int]:
        """One slot's window of one layer: [channels, kernel - 1] (the inputs before a token)."""
        return (hidden_size, self.kernel - 1)


@dataclass(frozen=True, slots=True)
class DeltaNetLayers:
    """Qwen3.5's gated DeltaNet layers: which layers have one (in place of attention), the taps
    of the convolution before it, and its heads: `k_heads` query/key heads of `k_dim`, each
    serving `v_heads // k_heads` value heads of `v_dim`."""

    layers: tuple[int, ...]
    kernel: int
    k_heads: int
    k_dim: int
    v_heads: int
    v_dim: int

    @property
    def key_size(self) -> int:
        return self.k_heads * self.k_dim

    @property
    def value_size(self) -> int:
        return self.v_heads * self.v_dim

    @property
    def conv_size(self) -> int:
        """Channels convolved: q, k and v side by side."""
        return 2 * self.key_size + self.value_size

    @property
    def in_size(self) -> int:
        """The fused input projection's width: q, k, v, then the output gate z, then beta's
        and the decay's logits (one per value head each)."""
        return self.conv_size + self.value_size + 2 * self.v_heads

    def check(self, num_layers: int, source: str) -> None:
        for name in ("kernel", "k_heads", "k_dim", "v_heads", "v_dim"):
            value = getattr(self, name)
            if type(value) is not int or value < (2 if name == "kernel" else 1):
                raise ConfigError(source, f"linear attention's {name}={value!r} is not a size")
        if self.v_heads % self.k_heads:
            raise ConfigError(
                source,
                f"linear_num_value_heads={self.v_heads} is not a multiple of"
                f" linear_num_key_heads={self.k_heads}",
            )
        if any(type(i) is not int or not 0 <= i < num_layers for i in self.layers):
            raise ConfigError(
                source, f"linear layers {self.layers} name a layer outside 0..{num_layers - 1}"
            )
        if len(set(self.layers)) >= num_layers:
            raise UnsupportedModelError(
                source, f"all {num_layers} layers are linear attention: no layer attends"
            )

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """One slot of one layer: the convolution's window ([channels, kernel - 1]) and the
        recurrent state ([v_heads, k_dim, v_dim])."""
        return (self.conv_size, self.kernel - 1), (self.v_heads, self.k_dim, self.v_dim)


def qwen3_5_delta_net(config_json: Mapping[str, Any], kinds: list[str]) -> DeltaNetLayers:
    return DeltaNetLayers(
        layers=tuple(i for i, kind in enumerate(kinds) if kind == LINEAR_ATTENTION),
        kernel=config_json.get("linear_conv_kernel_dim", 4),
        k_heads=config_json.get("linear_num_key_heads", 16),
        k_dim=config_json.get("linear_key_head_dim", 128),
        v_heads=config_json.get("linear_num_value_heads", 32),
        v_dim=config_json.get("linear_value_head_dim", 128),
    )


def qwen3_5_to_hf(delta: DeltaNetLayers, num_layers: int) -> dict[str, Any]:
    """The DeltaNet fields of a transformers 5 Qwen3.5 text config.json."""
    return {
        "layer_types": [
            LINEAR_ATTENTION if i in delta.layers else "full_attention" for i in range(num_layers)
        ],
        "linear_conv_kernel_dim": delta.kernel,
        "linear_num_key_heads": delta.k_heads,
        "linear_key_head_dim": delta.k_dim,
        "linear_num_value_heads": delta.v_heads,
        "linear_value_head_dim": delta.v_dim,
    }


def lfm2_layer_types(config_json: Mapping[str, Any], num_layers: Any) -> list[str] | None:
    """LFM2's layer types as config.json gives them, or as its `full_attn_idxs` implies."""
    given = config_json.get("layer_types")
    if given is not None or type(num_layers) is not int:
        return given
    attention = config_json.get("full_attn_idxs")
    if attention is None:
        attention = range(num_layers)
    return ["full_attention" if i in attention else LFM2_CONV for i in range(num_layers)]


def lfm2_intermediate_size(config_json: Mapping[str, Any], source: str) -> Any:
    """The MLP width LFM2's modules build: `intermediate_size` (or `block_ff_dim`), taken to 2/3,
    times `block_ffn_dim_multiplier` and rounded up to `block_multiple_of` when
    `block_auto_adjust_ff_dim` is on (as transformers' Lfm2MLP does)."""
    size = config_json.get("intermediate_size", config_json.get("block_ff_dim"))
    if size is None:
        raise ConfigError(source, "required field 'intermediate_size' is missing")
    if not config_json.get("block_auto_adjust_ff_dim", True) or type(size) is not int:
        return size
    size = int(2 * size / 3)
    multiplier = config_json.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        multiple = config_json.get("block_multiple_of", 256)
        size = int(multiplier * size)
        size = multiple * ((size + multiple - 1) // multiple)
    return size


def lfm2_short_conv(config_json: Mapping[str, Any], kinds: list[str]) -> ShortConvLayers:
    return ShortConvLayers(
        layers=tuple(i for i, kind in enumerate(kinds) if kind == LFM2_CONV),
        kernel=config_json.get("conv_L_cache", 3),
        bias=config_json.get("conv_bias", False),
    )


def lfm2_to_hf(conv: ShortConvLayers, num_layers: int, rms_norm_eps: float) -> dict[str, Any]:
    """The LFM2 fields of a transformers 5 config.json (the MLP width as built: no re-adjust)."""
    return {
        "layer_types": [
            LFM2_CONV if i in conv.layers else "full_attention" for i in range(num_layers)
        ],
        "conv_L_cache": conv.kernel,
        "conv_bias": conv.bias,
        "block_auto_adjust_ff_dim": False,
        "norm_eps": rms_norm_eps,
    }

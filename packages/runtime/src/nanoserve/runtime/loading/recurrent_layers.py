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

Granite 4.0-H mixes attention with Mamba2: such a layer convolves x, B and C along time (a
depthwise kernel with a bias), then keeps per head a [head_dim, d_state] state that each token
decays by exp(dt * A) and writes dt * x B^T into. Its state is that window and that state.
`layer_types` names them "mamba" (or, as transformers 5 writes it, "linear_attention").
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
    serving `v_heads // k_heads` value heads of `v_dim` — consecutive ones (grouped, as the
    checkpoint), or with `tiled` every k_heads-th (value head h reads key head h mod k_heads:
    the order llama.cpp's converter writes)."""

    layers: tuple[int, ...]
    kernel: int
    k_heads: int
    k_dim: int
    v_heads: int
    v_dim: int
    tiled: bool = False

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


@dataclass(frozen=True, slots=True)
class Mamba2Layers:
    """Granite 4.0-H's Mamba2 layers: which layers have one, the taps of the convolution before
    it (with a bias, `conv_bias`), its `heads` of `head_dim` (x is heads * head_dim wide), its
    `groups` of B and C (each heads / groups heads share one) of `d_state`, whether its input
    and output projections carry a bias, and the range dt is clamped to."""

    layers: tuple[int, ...]
    kernel: int
    heads: int
    head_dim: int
    groups: int
    d_state: int
    conv_bias: bool
    proj_bias: bool
    dt_min: float = 0.0
    dt_max: float = float("inf")

    @property
    def inner_size(self) -> int:
        """x's width, and the output gate z's: heads * head_dim."""
        return self.heads * self.head_dim

    @property
    def conv_size(self) -> int:
        """Channels convolved: x, B and C side by side."""
        return self.inner_size + 2 * self.groups * self.d_state

    @property
    def in_size(self) -> int:
        """The input projection's width: z, then x, B and C, then dt (one per head)."""
        return self.inner_size + self.conv_size + self.heads

    def check(self, num_layers: int, source: str) -> None:
        for name in ("kernel", "heads", "head_dim", "groups", "d_state"):
            value = getattr(self, name)
            if type(value) is not int or value < (2 if name == "kernel" else 1):
                raise ConfigError(source, f"mamba's {name}={value!r} is not a size")
        if self.heads % self.groups:
            raise ConfigError(
                source, f"mamba_n_groups={self.groups} does not divide mamba_n_heads={self.heads}"
            )
        for name in ("conv_bias", "proj_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(source, f"mamba's {name}={getattr(self, name)!r} must be a bool")
        if not 0.0 <= self.dt_min <= self.dt_max:
            raise ConfigError(
                source, f"time_step_limit=({self.dt_min}, {self.dt_max}) is not a range"
            )
        if any(type(i) is not int or not 0 <= i < num_layers for i in self.layers):
            raise ConfigError(
                source, f"mamba layers {self.layers} name a layer outside 0..{num_layers - 1}"
            )
        if len(set(self.layers)) >= num_layers:
            raise UnsupportedModelError(
                source, f"all {num_layers} layers are Mamba2: no layer attends"
            )

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """One slot of one layer: the convolution's window ([channels, kernel - 1]) and the
        SSM state ([heads, head_dim, d_state])."""
        return (self.conv_size, self.kernel - 1), (self.heads, self.head_dim, self.d_state)


MAMBA = "mamba"  # Granite 4.0-H's own layer type of a Mamba2 layer (transformers 5 writes
# "linear_attention"), beside "attention" (or "full_attention")


def granite_mamba(config_json: Mapping[str, Any], kinds: list[str], source: str) -> Mamba2Layers:
    hidden = config_json.get("hidden_size")
    heads = config_json.get("mamba_n_heads", 128)
    expand = config_json.get("mamba_expand", 2)
    head_dim = config_json.get("mamba_d_head", "auto")
    if head_dim == "auto" and type(hidden) is int and type(heads) is int and heads > 0:
        head_dim = expand * hidden // heads
    limit = config_json.get("time_step_limit") or (0.0, float("inf"))
    if not isinstance(limit, list | tuple) or len(limit) != 2:
        raise ConfigError(source, f"time_step_limit={limit!r} must be two numbers")
    layers = Mamba2Layers(
        layers=tuple(i for i, kind in enumerate(kinds) if kind == MAMBA),
        kernel=config_json.get("mamba_d_conv", 4),
        heads=heads,
        head_dim=head_dim,
        groups=config_json.get("mamba_n_groups", 1),
        d_state=config_json.get("mamba_d_state", 256),
        conv_bias=config_json.get("mamba_conv_bias", True),
        proj_bias=config_json.get("mamba_proj_bias", False),
        dt_min=_float(limit[0], source),
        dt_max=_float(limit[1], source),
    )
    if type(hidden) is int and layers.inner_size != expand * hidden:
        raise ConfigError(
            source,
            f"mamba_n_heads={heads} x mamba_d_head={head_dim} is not mamba_expand={expand} x"
            f" hidden_size={hidden}",
        )
    return layers


def _float(value: Any, source: str) -> float:
    """A number of config.json; transformers 5 writes infinity as {"__float__": "Infinity"}."""
    if isinstance(value, Mapping) and isinstance(value.get("__float__"), str):
        value = value["__float__"]
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(source, f"time_step_limit holds {value!r}, not a number") from None


def granite_to_hf(mamba: Mamba2Layers, num_layers: int, hidden_size: int) -> dict[str, Any]:
    """The Mamba2 fields of a transformers 5 GraniteMoeHybrid config.json."""
    return {
        "layer_types": [
            LINEAR_ATTENTION if i in mamba.layers else "full_attention" for i in range(num_layers)
        ],
        "mamba_d_conv": mamba.kernel,
        "mamba_n_heads": mamba.heads,
        "mamba_d_head": mamba.head_dim,
        "mamba_expand": mamba.inner_size // hidden_size,
        "mamba_n_groups": mamba.groups,
        "mamba_d_state": mamba.d_state,
        "mamba_conv_bias": mamba.conv_bias,
        "mamba_proj_bias": mamba.proj_bias,
        "time_step_limit": [mamba.dt_min, mamba.dt_max],
        "num_local_experts": 0,
    }


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
    if delta.tiled:  # the heads would need putting back in order, in every tensor
        raise UnsupportedModelError(
            "config", "Qwen3.5's value heads in llama.cpp's tiled order have no config.json form"
        )
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
    adjust = config_json.get("block_auto_adjust_ff_dim", config_json.get("model_type") == "lfm2")
    if not adjust or type(size) is not int:  # LFM2-MoE's dense layers are built as stated
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

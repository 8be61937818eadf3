"""A layer's attention as the forward runs it: its window, its rotary table and its heads'
shape, derived from the config once (Gemma 3's sliding layers and their own base, SmolLM3's
layers without rotary, Gemma 4's full layers with heads of their own, and its layers that
read another's K/V). The cos/sin tables they index are model/rotary.py's."""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve.runtime.loading.model_config import ModelConfig


@dataclass(frozen=True, slots=True)
class Heads:
    """The shape of a layer's q, k and v: query heads over K/V heads, each head_dim wide."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True, slots=True)
class LayerKind:
    """A layer's attention: the tokens a query sees (its last `window` positions, itself
    included; None: all of them), which rotary table turns q and k (None: no rotary), its
    heads, and whether it reads an earlier layer's K/V (computing q only, writing none)."""

    window: int | None
    rotary: int | None
    heads: Heads
    shares_kv: bool = False


def kv_pool_layers(config: ModelConfig) -> dict[int, int]:
    """Each attention layer's layer of the K/V pool: the writing layers' ordinals; a K/V-sharing
    layer (Gemma 4) reads the one of the layer it shares."""
    index = {layer: i for i, layer in enumerate(config.kv_layers)}
    return index | {layer: index[config.kv_source(layer)] for layer in config.shared_kv_layers}


def state_tensors(config: ModelConfig) -> dict[int, int]:
    """Each recurrent layer's first tensor in the state pool (DeltaNet's and Mamba2's window,
    then their matrix, follow)."""
    first: dict[int, int] = {}
    for layer in config.recurrent_layers:
        first[layer] = sum(len(config.layer_state_shapes(earlier)) for earlier in first)
    return first


def layer_kinds(config: ModelConfig) -> tuple[LayerKind, ...]:
    """Each layer's attention: its window (None: the whole context), its rotary table (0:
    the global base; 1: the sliding layers' own base; None: no rotary) and its heads."""
    own_base = config.sliding_rope_theta is not None
    kinds = []
    for i in range(config.num_layers):
        window = config.layer_window(i)
        rotary = None if i in config.no_rope_layers else int(window is not None and own_base)
        heads = Heads(config.num_heads, config.layer_kv_heads(i), config.layer_head_dim(i))
        shares = i in config.shared_kv_layers
        kinds.append(LayerKind(window=window, rotary=rotary, heads=heads, shares_kv=shares))
    return tuple(kinds)

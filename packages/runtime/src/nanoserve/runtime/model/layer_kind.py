"""A layer's attention as the forward runs it: its window and its rotary table, derived from
the config once (Gemma 3's sliding layers and their own base, SmolLM3's layers without
rotary). The cos/sin tables they index are model/rotary.py's."""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve.runtime.loading.model_config import ModelConfig


@dataclass(frozen=True, slots=True)
class LayerKind:
    """A layer's attention: the tokens a query sees (its last `window` positions, itself
    included; None: all of them) and which rotary table turns q and k (None: no rotary)."""

    window: int | None
    rotary: int | None


def layer_kinds(config: ModelConfig) -> tuple[LayerKind, ...]:
    """Each layer's attention: its window (None: the whole context) and its rotary table (0:
    the global base; 1: the sliding layers' own base; None: no rotary)."""
    own_base = config.sliding_rope_theta is not None
    kinds = []
    for i in range(config.num_layers):
        window = config.layer_window(i)
        rotary = None if i in config.no_rope_layers else int(window is not None and own_base)
        kinds.append(LayerKind(window=window, rotary=rotary))
    return tuple(kinds)

"""A layer's attention as the forward runs it: its window and its rotary table, derived from
the config once (Gemma 3's sliding layers and their own base, SmolLM3's layers without
rotary), and the cos/sin tables they index."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.loading.rope import rope_attention_factor, rope_inv_freq


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


def rotary_table(
    config: ModelConfig, positions: int, device: torch.device, *, sliding: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [positions, head_dim] float32 each, in the Hugging Face layout (the two
    halves of a head share a frequency), times longrope's attention factor where it has one."""
    inv_freq = rope_inv_freq(config, device, sliding=sliding, positions=positions)
    t = torch.arange(positions, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)  # [positions, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = 1.0 if sliding else rope_attention_factor(config)
    if scale == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * scale, emb.sin() * scale

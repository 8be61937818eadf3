"""A hybrid's recurrent layer in the forward: which of the three mixers runs on its rows, and
the state tensors of the pool it reads and writes in place (LFM2's short convolution keeps a
window of past inputs; Qwen3.5's gated DeltaNet and Granite 4.0-H's Mamba2 a window and a state
matrix each). The mixers themselves are short_conv.py, delta_net.py and mamba2.py."""

from __future__ import annotations

import torch

from nanoserve.core import DecodePlan, PrefillPlan
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.delta_net import delta_net
from nanoserve.runtime.model.kv_pool import CacheRows
from nanoserve.runtime.model.mamba2 import mamba2
from nanoserve.runtime.model.model_weights import LayerWeights
from nanoserve.runtime.model.short_conv import short_conv


def recurrent_mix(
    mixer_in: torch.Tensor,  # [tokens, the layer's input projection]
    plan: DecodePlan | PrefillPlan,
    cache: CacheRows,
    state: int,  # the layer's first state tensor in the pool
    layer: LayerWeights,
    config: ModelConfig,
    native: bool,  # decode steps in C++, on the pool
) -> torch.Tensor:
    """The layer's mixed rows, [tokens, what its output projection reads]."""
    if layer.delta is not None:  # Qwen3.5's gated DeltaNet
        assert config.delta_net is not None
        window, matrix = cache.state(state, plan), cache.state(state + 1, plan)
        return delta_net(mixer_in, plan, window, matrix, layer.delta, config.delta_net, native)
    if layer.mamba is not None:  # Granite 4.0-H's Mamba2
        assert config.mamba is not None
        window, matrix = cache.state(state, plan), cache.state(state + 1, plan)
        return mamba2(mixer_in, plan, window, matrix, layer.mamba, config.mamba, native)
    assert layer.conv_kernel is not None  # LFM2's short convolution
    window = cache.state(state, plan)
    return short_conv(mixer_in, plan, window, layer.conv_kernel, layer.conv_bias, native)

"""Gemma 4's per-layer embedding: a second table gives each token a small vector per layer,
which gates a residual branch after that layer's MLP.

At the forward's start, each token's row of the table ([vocab, layers * width], times
sqrt(width)) is mixed with a projection of its first embedding (times hidden ** -0.5, each
layer's slice RMS-normed): their sum times 2 ** -0.5, [tokens, layers, width]. After layer l's
MLP, the branch is: gate = GELU(x W_gate) * inputs[:, l]; x += RMSNorm(gate W_proj). As in
transformers' Gemma4TextModel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.embedding import QuantEmbedding
from nanoserve.runtime.model.layer_ops import LayerOps
from nanoserve.runtime.model.weight_forms import Linear

LinearFn = Callable[[torch.Tensor, Linear], torch.Tensor]


@dataclass(frozen=True, slots=True)
class PerLayerEmbedding:
    """The model-wide parts: the table, the projection of the first embedding, its norm."""

    table: torch.Tensor | QuantEmbedding  # [vocab, layers * width]
    projection: Linear  # [layers * width, hidden]
    norm: torch.Tensor  # [width]


@dataclass(frozen=True, slots=True)
class PerLayerBranch:
    """One layer's branch: the gate from the residual stream, the projection back, its norm."""

    gate: Linear  # [width, hidden]
    projection: Linear  # [hidden, width]
    norm: torch.Tensor  # [hidden]


def per_layer_inputs(
    input_ids: torch.Tensor,  # [tokens]
    embeddings: torch.Tensor,  # [tokens, hidden], the first table's rows already scaled
    weights: PerLayerEmbedding | None,
    config: ModelConfig,
    linear: LinearFn,
    ops: LayerOps,
) -> torch.Tensor | None:
    """Every layer's input for each token: [tokens, layers, width] float32 (None: a model
    without per-layer inputs)."""
    if weights is None:
        return None
    assert config.per_layer_inputs is not None
    tokens, width, num_layers = input_ids.shape[0], config.per_layer_inputs.width, config.num_layers
    rows = weights.table[input_ids].float() * width**0.5  # [tokens, layers * width]
    hidden = embeddings.shape[1]
    mixed = linear(embeddings, weights.projection).float() * hidden**-0.5
    mixed = ops.rms_norm(mixed.reshape(tokens * num_layers, width).contiguous(), weights.norm)
    layered = (tokens, num_layers, width)
    return (mixed.float().view(layered) + rows.view(layered)) * 2**-0.5


def layer_tail(
    x: torch.Tensor,  # [tokens, hidden], the residual stream, added to in place
    down: torch.Tensor,  # [tokens, hidden], the MLP's output
    inputs: torch.Tensor | None,  # [tokens, width], this layer's slice of per_layer_inputs
    branch: PerLayerBranch | None,
    scalar: torch.Tensor | None,  # [1], the layer's output scale
    linear: LinearFn,
    ops: LayerOps,
) -> None:
    """A Gemma 4 layer's end, in place: x += down; x += the per-layer branch; x *= scalar."""
    x.add_(down)
    if branch is not None:
        assert inputs is not None
        gate = F.gelu(linear(x, branch.gate).float(), approximate="tanh") * inputs
        x.add_(ops.rms_norm(linear(gate.to(x.dtype), branch.projection), branch.norm).to(x.dtype))
    if scalar is not None:
        x.mul_(scalar.to(x.dtype))

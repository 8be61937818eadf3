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

from nanoserve.runtime.loading.per_layer_inputs import PerLayerInputs
from nanoserve.runtime.model.embedding import QuantEmbedding
from nanoserve.runtime.model.weight_forms import Linear

LinearFn = Callable[[torch.Tensor, Linear], torch.Tensor]
NormFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
    weights: PerLayerEmbedding,
    shape: PerLayerInputs,
    num_layers: int,
    linear: LinearFn,
    rms_norm: NormFn,
) -> torch.Tensor:
    """Every layer's input for each token: [tokens, layers, width] float32."""
    tokens, width = input_ids.shape[0], shape.width
    rows = weights.table[input_ids].float() * width**0.5  # [tokens, layers * width]
    hidden = embeddings.shape[1]
    mixed = linear(embeddings, weights.projection).float() * hidden**-0.5
    mixed = rms_norm(mixed.reshape(tokens * num_layers, width).contiguous(), weights.norm)
    layered = (tokens, num_layers, width)
    return (mixed.float().view(layered) + rows.view(layered)) * 2**-0.5


def per_layer_branch(
    x: torch.Tensor,  # [tokens, hidden], the residual stream after the layer's MLP
    inputs: torch.Tensor,  # [tokens, width], this layer's slice of per_layer_inputs
    branch: PerLayerBranch,
    linear: LinearFn,
    rms_norm: NormFn,
) -> torch.Tensor:
    """What the branch adds to the residual stream: [tokens, hidden]."""
    gate = F.gelu(linear(x, branch.gate).float(), approximate="tanh") * inputs
    return rms_norm(linear(gate.to(x.dtype), branch.projection), branch.norm)

"""A hybrid's recurrent layers as llama.cpp's converters store them in a GGUF: their tensors'
names, shapes and values, and which layers they are.

Granite 4.0-H (`granitehybrid`): Mamba2's projections as `ssm_in`/`ssm_out`, its taps as
`ssm_conv1d` (a matrix, with its bias), `dt_bias` as `ssm_dt.bias`, A as `ssm_a` holding
-exp(A_log) and D as `ssm_d` (each [heads, 1]), its norm as `ssm_norm` ([groups, width]); the
shared MLP split into `ffn_gate`/`ffn_up`/`ffn_down`, the attention's Q and K rows permuted as
Llama's, its multipliers as `attention.scale`, `embedding_scale`, `residual_scale` and
`logit_scale`, and rotary used only where `rope.scaling.finetuned` says so (never, for a
hybrid). Its Mamba2 layers are the ones given no K/V heads.

LFM2 (`lfm2`): the short convolution's taps as a [channels, taps] matrix (Conv1d holds
[channels, 1, taps]); its convolution layers are the ones given no K/V heads (`head_count_kv`
per layer, 0 there).

Qwen3.5 (`qwen35`): DeltaNet's four input projections as `attn_qkv`, `attn_gate` (z),
`ssm_beta` (b) and `ssm_alpha` (a), its output as `ssm_out`, its taps as `ssm_conv1d` (a
matrix, as LFM2's), its norm as `ssm_norm`, `dt_bias` as `ssm_dt.bias`, and A as `ssm_a`
holding -exp(A_log) (read back as A_log). Every other RMSNorm holds `1 + w` already. The
recurrent layers are listed (`attention.recurrent_layers`) or every layer but each
`full_attention_interval`-th. Where key heads are fewer than value heads, the converter puts
the value heads in tiled order (value head h reads key head h mod k_heads, as ggml repeats a
tensor), in every tensor that has them: the model keeps that order (`DeltaNetLayers.tiled`)
rather than permuting columns of blocks. Multi-token-prediction blocks follow the text
model's (`nextn_predict_layers` of them): skipped, and named at boot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from os import PathLike
from typing import Any

import torch

from nanoserve.runtime.errors import ConfigError
from nanoserve.runtime.loading.recurrent_layers import DeltaNetLayers, Mamba2Layers, ShortConvLayers

LFM2_LAYER_NAMES = {
    "shortconv.in_proj": "conv.in_proj",
    "shortconv.conv": "conv.conv",
    "shortconv.out_proj": "conv.out_proj",
}
QWEN35_LAYER_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_out": "linear_attn.out_proj",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
}
# Whole names after `blk.N.` whose Hugging Face tensor is not a `.weight`/`.bias` of a module.
QWEN35_WHOLE_NAMES = {"ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias"}
GRANITE_LAYER_NAMES = {
    "ssm_in": "mamba.in_proj",
    "ssm_out": "mamba.out_proj",
    "ssm_conv1d": "mamba.conv1d",
    "ssm_norm": "mamba.norm",
}
GRANITE_WHOLE_NAMES = {"ssm_a": "mamba.A_log", "ssm_d": "mamba.D", "ssm_dt.bias": "mamba.dt_bias"}
MTP = "MTP heads"


def lfm2_short_conv(kv_heads: list[int], taps: int, gguf_names: frozenset[str]) -> ShortConvLayers:
    """LFM2's convolution layers: those llama.cpp gives no K/V heads."""
    layers = tuple(i for i, n in enumerate(kv_heads) if n == 0)
    bias = bool(layers) and f"blk.{layers[0]}.shortconv.conv.bias" in gguf_names
    return ShortConvLayers(layers=layers, kernel=taps, bias=bias)


def text_layers(metadata: Mapping[str, Any], prefix: str) -> int:
    """The text model's blocks: all of them but the trailing multi-token-prediction ones."""
    blocks = int(metadata.get(f"{prefix}.block_count", 0))
    return blocks - int(metadata.get(f"{prefix}.nextn_predict_layers", 0))


def qwen35_delta_net(
    key: Callable[..., Any], num_layers: int, source: str | PathLike[str]
) -> DeltaNetLayers:
    """Qwen3.5's DeltaNet layers and heads from a GGUF's `ssm.*` and layer metadata."""
    listed = key("attention.recurrent_layers", None)
    if listed is not None:
        layers = tuple(i for i, recurrent in enumerate(listed[:num_layers]) if recurrent)
    else:
        interval = int(key("full_attention_interval", 4))
        layers = tuple(i for i in range(num_layers) if (i + 1) % interval)
    k_heads, v_heads = int(key("ssm.group_count")), int(key("ssm.time_step_rank"))
    inner = int(key("ssm.inner_size"))
    if v_heads <= 0 or inner % v_heads:
        raise ConfigError(source, f"ssm.inner_size={inner} is not a multiple of {v_heads} heads")
    return DeltaNetLayers(
        layers=layers,
        kernel=int(key("ssm.conv_kernel")),
        k_heads=k_heads,
        k_dim=int(key("ssm.state_size")),
        v_heads=v_heads,
        v_dim=inner // v_heads,
        tiled=k_heads != v_heads,
    )


def granite_mamba(
    key: Callable[..., Any], kv_heads: list[int], gguf_names: frozenset[str]
) -> Mamba2Layers:
    """Granite 4.0-H's Mamba2 layers (those given no K/V heads) from its `ssm.*` metadata."""
    layers = tuple(i for i, n in enumerate(kv_heads) if n == 0)
    heads = int(key("ssm.time_step_rank"))
    first = f"blk.{layers[0]}." if layers else "blk.0."
    return Mamba2Layers(
        layers=layers,
        kernel=int(key("ssm.conv_kernel")),
        heads=heads,
        head_dim=int(key("ssm.inner_size")) // max(heads, 1),
        groups=int(key("ssm.group_count")),
        d_state=int(key("ssm.state_size")),
        conv_bias=f"{first}ssm_conv1d.bias" in gguf_names,
        proj_bias=f"{first}ssm_in.bias" in gguf_names,
    )


def hf_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A tensor's shape in Hugging Face layout: a convolution's taps as Conv1d holds them,
    [channels, 1, taps]; Mamba2's A, D ([heads, 1]) and norm ([groups, width]) flat."""
    if name.endswith((".conv.conv.weight", ".linear_attn.conv1d.weight", ".mamba.conv1d.weight")):
        return (shape[0], 1, shape[1])
    if name.endswith(".mlp.shared_expert_gate.weight") and len(shape) == 1:  # a [1, hidden] row
        return (1, shape[0])
    if name.endswith((".mamba.A_log", ".mamba.D", ".mamba.norm.weight")):
        return (shape[0] * shape[1],) if len(shape) == 2 else shape
    return shape


def hf_values(name: str, values: torch.Tensor) -> torch.Tensor:
    """A tensor's Hugging Face values: A_log back from the stored -exp(A_log)."""
    return torch.log(-values) if name.endswith((".linear_attn.A_log", ".mamba.A_log")) else values


def grouped_value_heads(name: str, values: torch.Tensor, delta: DeltaNetLayers) -> torch.Tensor:
    """A DeltaNet tensor (Hugging Face name and layout) with its value heads back in the
    checkpoint's grouped order, where the file holds them tiled: file head v * k_heads + k is
    the checkpoint's head k * per_key + v. Other tensors pass unchanged."""
    if not delta.tiled or ".linear_attn." not in name or name.endswith(".norm.weight"):
        return values
    per_key, k_size = delta.v_heads // delta.k_heads, delta.k_heads * delta.k_dim

    def regroup(x: torch.Tensor, dim: int) -> torch.Tensor:
        x = x.movedim(dim, 0)
        heads = x.reshape(per_key, delta.k_heads, -1, *x.shape[1:]).transpose(0, 1)
        return heads.reshape(x.shape).movedim(0, dim)

    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):  # the value rows only
        return torch.cat((values[: 2 * k_size], regroup(values[2 * k_size :], 0)))
    return regroup(values, 1 if name.endswith("out_proj.weight") else 0)

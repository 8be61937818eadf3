"""QuantWeight and QuantLinear: linears in GGUF's block types, packed for nanoserve's CPU kernels.

Decode streams every weight once per step, so bytes are time, and the bytes a GGUF file holds
are already the fewest its author chose. A `QuantWeight` is one tensor's blocks, exactly as the
file stores them (Q4_K, Q6_K, Q5_0, ... : kernels/csrc/weight_types.h lists them), re-laid out
by `pack_weight` for the kernels — per 16 output features, each block's planes interleaved four
inputs per feature — with no float round trip: the kernels compute with llama.cpp's weights.

A `QuantLinear` is one linear's parts (q, k and v; gate and up), stacked along the output
features, each in its own type: a Q4_K_M file mixes Q5_0, Q8_0, Q4_K and Q6_K within a layer.
One call quantizes the activations once and runs every part.

Weights that arrive as floats (a Hugging Face checkpoint, or a GGUF type with no kernel) are
first written as GGUF blocks with llama.cpp's own rounding (`quantize_q4_1`, `quantize_q8_0`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from nanoserve.runtime.errors import QuantizationError
from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.gguf_types import BY_NAME

GROUP = 32  # inputs per quantization group of the 32-input types and of the activations


def check_groupable(weight_shape: Sequence[int], kind: str) -> None:
    block = BY_NAME[kind].block
    if len(weight_shape) != 2 or weight_shape[1] % block:
        raise QuantizationError(
            f"{kind.lower()} needs [out, in] weights with in a multiple of {block},"
            f" got {list(weight_shape)}"
        )


@dataclass(frozen=True, slots=True)
class QuantWeight:
    packed: torch.Tensor  # [feature blocks * superblocks * packed bytes] uint8
    kind: str  # the GGML type served: "Q4_K"
    out_features: int
    in_features: int
    stored: str  # the type it was stored in: its own kind, or "F32", "IQ2_XS", ... re-quantized

    @classmethod
    def pack(cls, blocks: GgufBlocks, stored: str | None = None) -> QuantWeight:
        load_cpu_kernels()  # a form no kernel can read is refused here, not at the first step
        out, width = blocks.shape
        check_groupable(blocks.shape, blocks.kind)
        packed = kernel_ops.pack_weight(blocks.rows, blocks.ggml.number, width, blocks.order)
        return cls(packed, blocks.kind, out, width, stored or blocks.kind)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))


@dataclass(frozen=True, slots=True)
class QuantLinear:
    parts: tuple[QuantWeight, ...]  # stacked along the output features, each its own type
    # The op's arguments, made once (a decode step calls ~170 linears).
    _args: tuple[list[torch.Tensor], list[int], list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        widths = {p.in_features for p in self.parts}
        if len(widths) != 1:
            raise QuantizationError(f"a linear's parts must share their inputs, got {widths}")
        args = (
            [p.packed for p in self.parts],
            [BY_NAME[p.kind].number for p in self.parts],
            [p.out_features for p in self.parts],
        )
        object.__setattr__(self, "_args", args)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((sum(p.out_features for p in self.parts), self.parts[0].in_features))

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(p.kind for p in self.parts)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [rows, in] float32 @ w.T (+ bias float32) -> [rows, out] float32."""
        return kernel_ops.linear(x, *self._args, bias)


def _groups(weight: torch.Tensor, kind: str) -> torch.Tensor:
    check_groupable(weight.shape, kind)
    out, width = weight.shape
    return weight.detach().to("cpu", torch.float32).reshape(out, width // GROUP, GROUP)


def quantize_q4_1(weight: torch.Tensor) -> GgufBlocks:
    """llama.cpp's Q4_1 rounding (quantize_row_q4_1_ref), as the file's bytes: per group of 32
    d = (max - min) / 15 and q = min(15, trunc((x - min) / d + 0.5)), d and min then fp16."""
    w = _groups(weight, "Q4_1")  # [out, groups, 32]
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    d = (high - low) / 15
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = ((w - low) * inv + 0.5).trunc().clamp_(0, 15).to(torch.uint8)
    scales = torch.cat((d, low), -1).half().view(torch.uint8)  # [out, groups, 4]: d, m
    nibbles = q[..., :16] | (q[..., 16:] << 4)  # inputs j and j + 16 share byte j
    rows = torch.cat((scales, nibbles), -1).reshape(w.shape[0], -1)
    return GgufBlocks("Q4_1", rows, (w.shape[0], w.shape[1] * GROUP))


def quantize_q8_0(weight: torch.Tensor) -> GgufBlocks:
    """llama.cpp's Q8_0 rounding (quantize_row_q8_0_ref): d = amax / 127, q = roundf(x / d),
    half away from zero, as the file's bytes."""
    w = _groups(weight, "Q8_0")
    d = w.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    x = w * inv
    q = (x.sign() * (x.abs() + 0.5).floor()).clamp_(-127, 127).to(torch.int8)
    rows = torch.cat((d.half().view(torch.uint8), q.view(torch.uint8)), -1)
    return GgufBlocks("Q8_0", rows.reshape(w.shape[0], -1), (w.shape[0], w.shape[1] * GROUP))


def dequantize_blocks(blocks: GgufBlocks) -> torch.Tensor:
    """[out, in] float32: the values the blocks define, rows in Hugging Face order."""
    load_cpu_kernels()
    return kernel_ops.dequantize_rows(
        blocks.rows, blocks.ggml.number, blocks.shape[1], blocks.order
    )

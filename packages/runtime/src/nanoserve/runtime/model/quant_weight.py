"""Q4Weight and Q8Weight: linears in llama.cpp's block forms, packed for nanoserve's CPU kernels.

Decode streams every weight once per step, so bytes are time. The two forms are GGUF's:

- Q4 (GGUF Q4_1): per group of 32 inputs a scale d and a minimum m (fp16), and 4-bit levels
  q in 0..15: w = d * q + m. 0.625 bytes a weight, a fifth of fp32. GGUF's Q4_0
  (w = d * (q - 8)) is the same form with m = -8 d, which fp16 holds exactly.
- Q8 (GGUF Q8_0): per group a scale d and int8 levels: w = d * q. For the output projection,
  whose logits pick the token, as llama.cpp's files store the embedding it is tied to.

Levels (`Q4Levels`, `Q8Levels`) are the blocks unpacked: what a GGUF file stores, what the
quantizer (llama.cpp's rounding) makes of float weights, and what concatenates (q, k and v into
one projection). `pack()` lays them out as the kernels read them (csrc/kernel_table.h): per
block of 16 output features and group of 32 inputs, the 16 features' levels interleaved four
inputs at a time, then their scales — one contiguous stream per block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nanoserve.runtime.errors import QuantizationError
from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels

GROUP = 32  # inputs per group
FEATURE_BLOCK = 16  # output features per packed block
Q4_GROUP_BYTES = 4 * 64 + 2 * 32  # levels, then d, then m
Q8_GROUP_BYTES = 8 * 64 + 32  # levels (as w + 128), then d


def check_groupable(weight_shape: Sequence[int], form: str) -> None:
    if len(weight_shape) != 2 or weight_shape[1] % GROUP:
        raise QuantizationError(
            f"{form} needs [out, in] weights with in a multiple of {GROUP},"
            f" got {list(weight_shape)}"
        )


def _blocks(n: int) -> int:
    return -(-n // FEATURE_BLOCK)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return F.pad(t, (0, 0, 0, rows - t.shape[0])) if rows > t.shape[0] else t


def _fp16_bytes(t: torch.Tensor, blocks: int) -> torch.Tensor:
    """[n, groups] fp16 -> [blocks, groups, 32] bytes: each group's 16 features' values."""
    groups = t.shape[1]
    t = _pad_rows(t, blocks * FEATURE_BLOCK).view(blocks, FEATURE_BLOCK, groups)
    return t.permute(0, 2, 1).contiguous().view(torch.uint8)


def _unpack_fp16(b: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of _fp16_bytes: [blocks, groups, 32] bytes -> [n, groups] fp16."""
    blocks, groups, _ = b.shape
    t = b.contiguous().view(torch.float16).permute(0, 2, 1)  # [blocks, 16, groups]
    return t.reshape(blocks * FEATURE_BLOCK, groups)[:n]


@dataclass(frozen=True, slots=True)
class Q4Levels:
    q: torch.Tensor  # [out, in] uint8, 0..15
    d: torch.Tensor  # [out, in / 32] float16
    m: torch.Tensor  # [out, in / 32] float16

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Q4Levels:
        """llama.cpp's Q4_1 rounding (quantize_row_q4_1_ref): d = (max - min) / 15 and
        q = min(15, trunc((x - min) / d + 0.5)), with d and min then stored in fp16."""
        check_groupable(weight.shape, "q4")
        out, width = weight.shape
        w = weight.detach().to("cpu", torch.float32).reshape(out, width // GROUP, GROUP)
        low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)  # [out, groups, 1]
        d = (high - low) / 15
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = ((w - low) * inv + 0.5).trunc().clamp_(0, 15).to(torch.uint8)
        return cls(q.reshape(out, width), d[..., 0].half(), low[..., 0].half())

    @classmethod
    def from_q4_1_blocks(cls, blocks: torch.Tensor) -> Q4Levels:
        """GGUF Q4_1 rows as stored: [out, groups * 20] bytes, each block d, m (fp16) and 16
        bytes whose low nibbles are inputs 0..15 and high nibbles 16..31."""
        out = blocks.shape[0]
        b = blocks.reshape(out, -1, 20)
        scales = b[..., :4].contiguous().view(torch.float16)  # [out, groups, 2]: d, m
        return cls(_nibbles(b[..., 4:], out), scales[..., 0].clone(), scales[..., 1].clone())

    @classmethod
    def from_q4_0_blocks(cls, blocks: torch.Tensor) -> Q4Levels:
        """GGUF Q4_0 rows: [out, groups * 18] bytes, d (fp16) and 16 bytes of nibbles; w = d (q
        - 8), which is Q4_1 with m = -8 d (exact in fp16: a power of two)."""
        out = blocks.shape[0]
        b = blocks.reshape(out, -1, 18)
        d = b[..., :2].contiguous().view(torch.float16)[..., 0]
        return cls(_nibbles(b[..., 2:], out), d.clone(), (d * -8).clone())

    @staticmethod
    def cat(parts: Sequence[Q4Levels]) -> Q4Levels:
        return Q4Levels(
            *(torch.cat(t) for t in zip(*((p.q, p.d, p.m) for p in parts), strict=True))
        )

    def dequantize(self) -> torch.Tensor:
        out, width = self.q.shape
        q = self.q.float().reshape(out, width // GROUP, GROUP)
        return (q * self.d.float()[..., None] + self.m.float()[..., None]).reshape(out, width)

    def pack(self) -> Q4Weight:
        load_cpu_kernels()  # a form no kernel can read is refused here, not at the first step
        out, width = self.q.shape
        groups, blocks = width // GROUP, _blocks(out)
        q = _pad_rows(self.q, blocks * FEATURE_BLOCK)
        # [block, feature, group, chunk, nibble, byte]: input 8 chunk + 4 nibble + byte
        q = q.reshape(blocks, FEATURE_BLOCK, groups, 4, 2, 4)
        levels = q[..., 0, :] | (q[..., 1, :] << 4)  # [block, feature, group, chunk, byte]
        levels = levels.permute(0, 2, 3, 1, 4).reshape(blocks, groups, 256)
        packed = torch.cat((levels, _fp16_bytes(self.d, blocks), _fp16_bytes(self.m, blocks)), -1)
        return Q4Weight(packed.reshape(-1).contiguous(), out, width)


def _nibbles(qs: torch.Tensor, out: int) -> torch.Tensor:
    """[out, groups, 16] bytes of GGUF nibbles -> [out, groups * 32] levels."""
    return torch.cat((qs & 15, qs >> 4), dim=-1).reshape(out, -1)


@dataclass(frozen=True, slots=True)
class Q8Levels:
    q: torch.Tensor  # [out, in] int8
    d: torch.Tensor  # [out, in / 32] float16

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Q8Levels:
        """llama.cpp's Q8_0 rounding (quantize_row_q8_0_ref): d = amax / 127, q = roundf(x / d),
        half away from zero."""
        check_groupable(weight.shape, "q8")
        out, width = weight.shape
        w = weight.detach().to("cpu", torch.float32).reshape(out, width // GROUP, GROUP)
        d = w.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        x = w * inv
        q = (x.sign() * (x.abs() + 0.5).floor()).clamp_(-127, 127).to(torch.int8)
        return cls(q.reshape(out, width), d[..., 0].half())

    @classmethod
    def from_q8_0_blocks(cls, blocks: torch.Tensor) -> Q8Levels:
        """GGUF Q8_0 rows: [out, groups * 34] bytes, each block d (fp16) and 32 int8 levels."""
        out = blocks.shape[0]
        b = blocks.reshape(out, -1, 34)
        d = b[..., :2].contiguous().view(torch.float16)[..., 0].clone()
        return cls(b[..., 2:].contiguous().view(torch.int8).reshape(out, -1), d)

    @staticmethod
    def cat(parts: Sequence[Q8Levels]) -> Q8Levels:
        return Q8Levels(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]))

    def dequantize(self) -> torch.Tensor:
        out, width = self.q.shape
        q = self.q.float().reshape(out, width // GROUP, GROUP)
        return (q * self.d.float()[..., None]).reshape(out, width)

    def pack(self) -> Q8Weight:
        load_cpu_kernels()
        out, width = self.q.shape
        groups, blocks = width // GROUP, _blocks(out)
        u = (self.q.to(torch.int16) + 128).to(torch.uint8)  # dpbusd reads unsigned weights
        u = _pad_rows(u, blocks * FEATURE_BLOCK).reshape(blocks, FEATURE_BLOCK, groups, 8, 4)
        levels = u.permute(0, 2, 3, 1, 4).reshape(blocks, groups, 512)
        packed = torch.cat((levels, _fp16_bytes(self.d, blocks)), -1)
        return Q8Weight(packed.reshape(-1).contiguous(), out, width)


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A linear's levels in the kernels' layout (csrc/kernel_table.h) and its logical shape."""

    packed: torch.Tensor  # [blocks * groups * group bytes] uint8
    out_features: int
    in_features: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    def _groups(self, group_bytes: int) -> torch.Tensor:
        """[blocks, groups, group bytes], the packed bytes by block and group."""
        blocks, groups = _blocks(self.out_features), self.in_features // GROUP
        return self.packed.view(blocks, groups, group_bytes)


@dataclass(frozen=True, slots=True)
class Q4Weight(PackedWeight):
    def levels(self) -> Q4Levels:
        """The packed bytes read back (the inverse of Q4Levels.pack)."""
        p = self._groups(Q4_GROUP_BYTES)
        blocks, groups, _ = p.shape
        levels = p[..., :256].reshape(blocks, groups, 4, FEATURE_BLOCK, 4)
        q = torch.stack(
            (levels & 15, levels >> 4), dim=3
        )  # [block, group, chunk, 2, feature, byte]
        q = q.permute(0, 4, 1, 2, 3, 5).reshape(blocks * FEATURE_BLOCK, self.in_features)
        n = self.out_features
        return Q4Levels(
            q[:n].contiguous(), _unpack_fp16(p[..., 256:288], n), _unpack_fp16(p[..., 288:], n)
        )

    def dequantize(self) -> torch.Tensor:
        return self.levels().dequantize()

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [rows, in] float32 @ w.T (+ bias float32) -> [rows, out] float32."""
        return torch.ops.nanoserve.q4_linear(x, self.packed, self.out_features, bias)


@dataclass(frozen=True, slots=True)
class Q8Weight(PackedWeight):
    def levels(self) -> Q8Levels:
        p = self._groups(Q8_GROUP_BYTES)
        blocks, groups, _ = p.shape
        u = p[..., :512].reshape(blocks, groups, 8, FEATURE_BLOCK, 4).permute(0, 3, 1, 2, 4)
        q = (u.reshape(-1, self.in_features).to(torch.int16) - 128).to(torch.int8)
        n = self.out_features
        return Q8Levels(q[:n].contiguous(), _unpack_fp16(p[..., 512:], n))

    def dequantize(self) -> torch.Tensor:
        return self.levels().dequantize()

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [rows, in] float32 @ w.T (+ bias float32) -> [rows, out] float32."""
        return torch.ops.nanoserve.q8_linear(x, self.packed, self.out_features, bias)

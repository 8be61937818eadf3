"""Int8Weight: weight-only int8 quantization of a linear layer (per output row scales).

Decode at small batches is a weight-bandwidth problem: a step streams every weight once.
Stored as int8 the weights are a quarter of fp32's bytes and half of bf16's, and torch's
`_weight_int8pack_mm` reads them directly (a step's linears run in a fraction of bf16's and
fp32's time: RESULTS.md, "forward"). Activations stay in the
model's dtype; the error is one rounding of each weight to 255 levels of its row's range.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Int8Weight:
    q: torch.Tensor  # [out, in] int8
    scale: torch.Tensor  # [out], the activation dtype: w ~= q * scale[:, None]

    @classmethod
    def quantize(cls, weight: torch.Tensor, dtype: torch.dtype) -> Int8Weight:
        w = weight.float()  # [out, in]
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [out]
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        return cls(q.contiguous(), scale.to(dtype))

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale.float()[:, None]

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x @ w.T for x [rows, in] in the scale's dtype -> [rows, out]."""
        out = torch._weight_int8pack_mm(x.to(self.scale.dtype), self.q, self.scale)
        return out if bias is None else out + bias

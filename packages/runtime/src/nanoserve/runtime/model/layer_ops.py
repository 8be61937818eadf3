"""LayerOps: the non-linear pieces of a Llama layer, as one of two kernel sets.

The forward (llama.py) is written once against this interface; the set decides how each piece
runs:

- TorchOps: torch operators, on any device (CUDA, the meta trace, the CPU's exact float32
  mode). Attention gathers K/V through the slot rectangle (core's paged attention), in
  `accum_dtype`; the residual stream is in the model's dtype.
- CpuKernelOps: nanoserve's C++ kernels (kernels/kernel_ops.py), one call per piece where torch
  takes five to twenty: RMSNorm fused with the residual add, rotary fused with the K/V write,
  attention that reads K/V in place through the rectangle, and SiLU-and-multiply. The residual
  stream is float32 whatever the pool's dtype. Every piece computes each row in one fixed order
  (kernels/csrc/kernels.h), so a row's bits ignore its batch, its bucket and the CPU's ISA.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from nanoserve.core import DecodePlan, PrefillPlan
from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.kv_pool import CacheRows

Plan = DecodePlan | PrefillPlan
Rotary = tuple[torch.Tensor, torch.Tensor]


class LayerOps(Protocol):
    name: str

    def residual(self, embeddings: torch.Tensor) -> torch.Tensor:
        """The residual stream a forward starts from: [tokens, hidden]."""
        ...

    def rotary(self, plan: Plan) -> Rotary:
        """What rotary needs for this plan's positions, made once per forward."""
        ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor: ...

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        """x += delta in place; returns RMSNorm(x)."""
        ...

    def rotate_and_cache(
        self, qkv: torch.Tensor, rotary: Rotary, plan: Plan, cache: CacheRows, layer: int
    ) -> torch.Tensor:
        """Rotary on q and k, the new K/V into the pool; returns q, [tokens, heads * head_dim]."""
        ...

    def attention(self, q: torch.Tensor, plan: Plan, cache: CacheRows, layer: int) -> torch.Tensor:
        """Each token over its visible slots: [tokens, heads * head_dim] in the residual dtype."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...


class TorchOps:
    name = "torch"

    def __init__(
        self,
        config: ModelConfig,
        cos: torch.Tensor,  # [max_pos, head_dim] float32
        sin: torch.Tensor,
        accum_dtype: torch.dtype,
    ) -> None:
        self.config = config
        self.cos, self.sin = cos, sin
        self.accum_dtype = accum_dtype
        self.scale = config.head_dim**-0.5

    def residual(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings

    def rotary(self, plan: Plan) -> Rotary:
        # [tokens, 1, head_dim]: gathered once, broadcast over heads in every layer.
        return self.cos[plan.positions][:, None, :], self.sin[plan.positions][:, None, :]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return weight * xf.to(x.dtype)

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        return self.rms_norm(x.add_(delta), weight)

    def rotate_and_cache(
        self, qkv: torch.Tensor, rotary: Rotary, plan: Plan, cache: CacheRows, layer: int
    ) -> torch.Tensor:
        cfg = self.config
        tokens, q_size, kv_size = qkv.shape[0], cfg.q_size, cfg.kv_size
        q = qkv[:, :q_size].view(tokens, cfg.num_heads, cfg.head_dim)
        k = qkv[:, q_size : q_size + kv_size].view(tokens, cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, q_size + kv_size :].view(tokens, cfg.num_kv_heads, cfg.head_dim)
        cos, sin = rotary
        k = _rotate(k, cos, sin)
        cache.write(layer, plan, k, v)
        return _rotate(q, cos, sin).reshape(tokens, q_size)

    def attention(self, q: torch.Tensor, plan: Plan, cache: CacheRows, layer: int) -> torch.Tensor:
        cfg = self.config
        heads = q.view(q.shape[0], cfg.num_heads, cfg.head_dim)
        out = cache.paged_attention(layer, heads, plan, self.scale, self.accum_dtype)
        return out.to(q.dtype).reshape(q.shape[0], cfg.q_size)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [tokens, heads, head_dim]; Hugging Face layout: rotate the two halves.
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class CpuKernelOps:
    name = "nanoserve"

    def __init__(self, config: ModelConfig, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.config = config
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        self.eps = config.rms_norm_eps
        self.scale = config.head_dim**-0.5
        self.ops = kernel_ops

    def residual(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings.float()

    def rotary(self, plan: Plan) -> Rotary:
        return self.cos, self.sin  # the kernel indexes the tables by position itself

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x.contiguous(), weight, self.eps)

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        return self.ops.add_rms_norm(x, delta, weight, self.eps)

    def rotate_and_cache(
        self, qkv: torch.Tensor, rotary: Rotary, plan: Plan, cache: CacheRows, layer: int
    ) -> torch.Tensor:
        cos, sin = rotary
        kv = cache.storage(layer, plan)  # [2, slots + 1, kv_heads, head_dim]
        self.ops.rope_write_kv(
            qkv, plan.positions, cos, sin, kv, plan.write_slots, self.config.num_heads
        )
        return qkv[:, : self.config.q_size]  # a view: rows keep qkv's stride

    def attention(self, q: torch.Tensor, plan: Plan, cache: CacheRows, layer: int) -> torch.Tensor:
        kv = cache.storage(layer, plan)
        heads = self.config.num_heads
        if isinstance(plan, DecodePlan):
            return self.ops.paged_attention(
                q, kv, plan.slot_rect, None, plan.context_lens, self.scale, heads
            )
        # A prompt token attends like a decode row at its own position: its chunk's rectangle
        # row, position + 1 slots (the causal mask is the length).
        return self.ops.paged_attention(
            q, kv, plan.slot_rect, plan.token_rows, plan.token_context_lens, self.scale, heads
        )

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.ops.silu_mul(gate_up)

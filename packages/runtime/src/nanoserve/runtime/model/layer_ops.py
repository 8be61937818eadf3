"""LayerOps: the non-linear pieces of a Llama layer, as one of two kernel sets.

The forward (llama.py) is written once against this interface; the set decides how each piece
runs:

- TorchOps: torch operators, on any device (CUDA, the meta trace, the CPU's exact float32
  mode). Attention gathers K/V through the slot rectangle (core's paged attention), in
  `accum_dtype`; the residual stream is in the model's dtype.
- CpuKernelOps: nanoserve's C++ kernels (kernels/kernel_ops.py), one call per piece where torch
  takes five to twenty: RMSNorm fused with the residual add, rotary fused with the K/V write,
  attention that reads K/V in place through the rectangle (a sliding window skips whole blocks
  before it), per-head q/k norms, and SiLU- or GELU-and-multiply. The residual
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
from nanoserve.runtime.model.layer_kind import Heads

Plan = DecodePlan | PrefillPlan
Rotary = tuple[torch.Tensor, torch.Tensor]
QKNorms = tuple[torch.Tensor, torch.Tensor]


class LayerOps(Protocol):
    name: str

    def residual(self, embeddings: torch.Tensor) -> torch.Tensor:
        """The residual stream a forward starts from: [tokens, hidden]."""
        ...

    def rotary(self, plan: Plan) -> list[Rotary]:
        """What rotary needs for this plan's positions, per table, made once per forward."""
        ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor: ...

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        """x += delta in place; returns RMSNorm(x)."""
        ...

    def rotate(
        self,
        qkv: torch.Tensor,
        rotary: Rotary | None,
        plan: Plan,
        qk_norms: QKNorms | None = None,
        heads: Heads | None = None,
        v_norm: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As `rotate_and_cache`, keeping nothing: q, k and v, [tokens, (kv_)heads, head_dim]
        (a model that reads whole inputs)."""
        ...

    def rotate_and_cache(
        self,
        qkv: torch.Tensor,
        rotary: Rotary | None,
        plan: Plan,
        cache: CacheRows,
        layer: int,
        qk_norms: QKNorms | None = None,
        heads: Heads | None = None,
        v_norm: bool = False,
    ) -> torch.Tensor:
        """The q and k heads normalised (if given), then rotary on them (if any), the new K/V
        into the pool; returns q, [tokens, heads * head_dim]. `heads`: the layer's shape (None:
        the config's); `v_norm`: each V head RMS-normed without a weight (Gemma 4)."""
        ...

    def rotate_query(
        self, q: torch.Tensor, rotary: Rotary | None, plan: Plan, norm: torch.Tensor, heads: Heads
    ) -> torch.Tensor:
        """A K/V-sharing layer's q ([tokens, heads * head_dim]) normed per head and turned:
        it computes no k or v, and writes nothing."""
        ...

    def attention(
        self,
        q: torch.Tensor,
        plan: Plan,
        cache: CacheRows,
        layer: int,
        window: int | None,
        sinks: torch.Tensor | None = None,
        heads: Heads | None = None,
    ) -> torch.Tensor:
        """Each token over its visible slots (within its window, if any; with `sinks` [heads],
        a logit per head in the softmax's denominator): [tokens, heads * head_dim] in the
        residual dtype."""
        ...

    def gated_act(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[tokens, 2 * intermediate] -> [tokens, intermediate]: act(gate) * up, the config's
        activation (SiLU; tanh-approximate GELU for Gemma)."""
        ...


class TorchOps:
    name = "torch"

    def __init__(
        self,
        config: ModelConfig,
        tables: list[Rotary],  # cos and sin, [max_pos, head_dim] float32 each
        accum_dtype: torch.dtype,
    ) -> None:
        self.config = config
        self.tables = tables
        self.accum_dtype = accum_dtype
        self.scale = config.attention_scale

    def residual(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings

    def rotary(self, plan: Plan) -> list[Rotary]:
        # [tokens, 1, head_dim]: gathered once, broadcast over heads in every layer.
        return [
            (cos[plan.positions][:, None, :], sin[plan.positions][:, None, :])
            for cos, sin in self.tables
        ]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return weight * xf.to(x.dtype)

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        return self.rms_norm(x.add_(delta), weight)

    def rotate_and_cache(
        self,
        qkv: torch.Tensor,
        rotary: Rotary | None,
        plan: Plan,
        cache: CacheRows,
        layer: int,
        qk_norms: QKNorms | None = None,
        heads: Heads | None = None,
        v_norm: bool = False,
    ) -> torch.Tensor:
        q, k, v = self.rotate(qkv, rotary, plan, qk_norms, heads, v_norm)
        cache.write(layer, plan, k, v)
        return q.reshape(qkv.shape[0], q.shape[1] * q.shape[2])

    def rotate_query(
        self, q: torch.Tensor, rotary: Rotary | None, plan: Plan, norm: torch.Tensor, heads: Heads
    ) -> torch.Tensor:
        q = self.rms_norm(q.view(q.shape[0], heads.num_heads, heads.head_dim), norm)
        if rotary is not None:
            q = _rotate(q, *rotary)
        return q.reshape(q.shape[0], heads.q_size)

    def rotate(
        self,
        qkv: torch.Tensor,
        rotary: Rotary | None,
        plan: Plan,
        qk_norms: QKNorms | None = None,
        heads: Heads | None = None,
        v_norm: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = split_heads(qkv, heads or config_heads(self.config))
        if qk_norms is not None:
            q, k = self.rms_norm(q, qk_norms[0]), self.rms_norm(k, qk_norms[1])
        if v_norm:
            vf = v.float()
            eps = self.config.rms_norm_eps
            v = (vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + eps)).to(v.dtype)
        if rotary is not None:
            q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        return q, k, v

    def attention(
        self,
        q: torch.Tensor,
        plan: Plan,
        cache: CacheRows,
        layer: int,
        window: int | None,
        sinks: torch.Tensor | None = None,
        heads: Heads | None = None,
    ) -> torch.Tensor:
        shape = heads or config_heads(self.config)
        per_head = q.view(q.shape[0], shape.num_heads, shape.head_dim)
        out = cache.paged_attention(
            layer, per_head, plan, self.scale, self.accum_dtype, window, sinks
        )
        return out.to(q.dtype).reshape(q.shape[0], shape.q_size)

    def gated_act(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        if self.config.hidden_act == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        return F.silu(gate) * up


def config_heads(config: ModelConfig) -> Heads:
    """The config's heads: every layer's, where layers do not differ."""
    return Heads(config.num_heads, config.num_kv_heads, config.head_dim)


def split_heads(qkv: torch.Tensor, heads: Heads) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The qkv projection's output as q, k and v heads: [tokens, (kv_)heads, head_dim] views."""
    tokens, q_size, kv_size, dim = qkv.shape[0], heads.q_size, heads.kv_size, heads.head_dim
    q = qkv[:, :q_size].view(tokens, heads.num_heads, dim)
    k = qkv[:, q_size : q_size + kv_size].view(tokens, heads.num_kv_heads, dim)
    v = qkv[:, q_size + kv_size :].view(tokens, heads.num_kv_heads, dim)
    return q, k, v


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [tokens, heads, head_dim]; Hugging Face layout: rotate the two halves of the first
    # cos.shape[-1] dimensions (all of them, or a partial rotary's), the rest pass.
    turned = cos.shape[-1]
    if turned < x.shape[-1]:
        return torch.cat((_rotate(x[..., :turned], cos, sin), x[..., turned:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class CpuKernelOps:
    name = "nanoserve"

    def __init__(self, config: ModelConfig, tables: list[Rotary]) -> None:
        self.config = config
        self.tables = [(cos.contiguous(), sin.contiguous()) for cos, sin in tables]
        # A layer without rotary writes its K/V through the same kernel, turned by nothing:
        # x * 1 + rotate(x) * 0 is x exactly.
        self.identity: Rotary | None = None
        if config.no_rope_layers:
            shape = tables[0][0].shape  # [max_pos, head_dim]
            self.identity = (torch.ones(shape), torch.zeros(shape))
        self.eps = config.rms_norm_eps
        self.scale = config.attention_scale
        self.ops = kernel_ops
        # v_norm's weight of ones, per head_dim: made here, never inside a recorded step.
        dims = {config.head_dim, config.full_head_dim or config.head_dim}
        self.unit_norms = {d: torch.ones(d) for d in dims} if config.v_norm else {}

    def residual(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings.float()

    def rotary(self, plan: Plan) -> list[Rotary]:
        return self.tables  # the kernel indexes the tables by position itself

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x.contiguous(), weight, self.eps)

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor
    ) -> torch.Tensor:
        return self.ops.add_rms_norm(x, delta, weight, self.eps)

    def rotate_and_cache(
        self,
        qkv: torch.Tensor,
        rotary: Rotary | None,
        plan: Plan,
        cache: CacheRows,
        layer: int,
        qk_norms: QKNorms | None = None,
        heads: Heads | None = None,
        v_norm: bool = False,
    ) -> torch.Tensor:
        shape = heads or config_heads(self.config)
        if qk_norms is not None:
            self.ops.head_rms_norm(qkv, *qk_norms, shape.num_heads, shape.num_kv_heads, self.eps)
        if v_norm:
            self._norm_v(qkv, shape)
        rotary = rotary or self.identity
        assert rotary is not None  # a layer without rotary exists only where identity does
        kv = cache.storage(layer, plan)  # [2, slots + 1, kv_heads, head_dim], or blocks
        self.ops.rope_write_kv(
            qkv, plan.positions, *rotary, kv, plan.write_slots, shape.num_heads,
            cache.kernel_types,
        )  # fmt: skip
        return qkv[:, : shape.q_size]  # a view: rows keep qkv's stride

    def _norm_v(self, qkv: torch.Tensor, heads: Heads) -> None:
        """In place: each V head of qkv RMS-normed, without a weight (Gemma 4's v_norm)."""
        start, dim = heads.q_size + heads.kv_size, heads.head_dim
        v = qkv[:, start:].reshape(-1, dim).contiguous()
        normed = self.ops.rms_norm(v, self.unit_norms[dim], self.eps)
        qkv[:, start:] = normed.view(qkv.shape[0], -1)

    def rotate_query(
        self, q: torch.Tensor, rotary: Rotary | None, plan: Plan, norm: torch.Tensor, heads: Heads
    ) -> torch.Tensor:
        tokens = q.shape[0]
        q = self.ops.rms_norm(q.reshape(-1, heads.head_dim).contiguous(), norm, self.eps)
        q = q.view(tokens, heads.num_heads, heads.head_dim)
        if rotary is not None:  # the whole tables: gathered here at the plan's positions
            cos, sin = (t[plan.positions][:, None, :] for t in rotary)
            q = _rotate(q, cos, sin)
        return q.reshape(tokens, heads.q_size)

    def rotate(
        self,
        qkv: torch.Tensor,
        rotary: Rotary | None,
        plan: Plan,
        qk_norms: QKNorms | None = None,
        heads: Heads | None = None,
        v_norm: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shape = heads or config_heads(self.config)
        qkv = qkv.contiguous()
        if qk_norms is not None:
            self.ops.head_rms_norm(qkv, *qk_norms, shape.num_heads, shape.num_kv_heads, self.eps)
        if v_norm:
            self._norm_v(qkv, shape)
        q, k, v = split_heads(qkv, shape)
        if rotary is not None:  # the whole tables: gathered here at the plan's positions
            cos, sin = (t[plan.positions][:, None, :] for t in rotary)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        return q, k, v

    def attention(
        self,
        q: torch.Tensor,
        plan: Plan,
        cache: CacheRows,
        layer: int,
        window: int | None,
        sinks: torch.Tensor | None = None,
        heads: Heads | None = None,
    ) -> torch.Tensor:
        kv, types = cache.storage(layer, plan), cache.kernel_types
        num_heads, window = (heads or config_heads(self.config)).num_heads, window or 0
        if isinstance(plan, DecodePlan):
            return self.ops.paged_attention(
                q,
                kv,
                plan.slot_rect,
                None,
                plan.context_lens,
                self.scale,
                num_heads,
                window,
                types,
                sinks,
            )
        # A prompt token attends like a decode row at its own position: its chunk's rectangle
        # row, position + 1 slots (the causal mask is the length).
        return self.ops.paged_attention(
            q,
            kv,
            plan.slot_rect,
            plan.token_rows,
            plan.token_context_lens,
            self.scale,
            num_heads,
            window,
            types,
            sinks,
        )

    def gated_act(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.config.hidden_act == "gelu_tanh":
            return self.ops.gelu_mul(gate_up)
        return self.ops.silu_mul(gate_up)

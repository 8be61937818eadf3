"""The Llama family's forward over a flat batch, with every K/V read and written via the pool.

One forward takes either a DecodePlan (one token per row; the step that is bucketed and
recorded) or a PrefillPlan (chunks of prompts, and decode rows as chunks of one token). Each
layer writes the new K/V with one index_put, then attends through core's paged attention.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

import torch
import torch.nn.functional as F

from nanoserve.core import DecodePlan, PrefillPlan, StepFootprint
from nanoserve.runtime.errors import WeightsError
from nanoserve.runtime.loading.model_config import ModelConfig, rope_inv_freq
from nanoserve.runtime.model.device import resolve_device
from nanoserve.runtime.model.int8_weight import Int8Weight, check_quantize
from nanoserve.runtime.model.kv_pool import CacheRows

# fp32 GEMM rows in a tail of 1-3 past a multiple of 8 take another kernel (different low
# bits); at a multiple of 4 every row's result is independent of the batch it sits in.
INVARIANT_ROW_TILE = 4


def attention_dtype(
    dtype: torch.dtype, batch_invariant: bool, device: torch.device | str = "cpu"
) -> torch.dtype:
    """What attention's matmuls run in. bf16/fp16 models: their own dtype, whose (oneDNN)
    kernels are batch- and width-invariant, at no cost. fp32 models on a CPU: float64 when
    invariance is asked for (padding width and kernel shape then leave no trace once rounded
    back), else float32. On CUDA always the model's dtype (float32 for fp32): float64 and
    row padding are recipes measured against MKL and oneDNN, not cuBLAS, and float64 is slow
    there; see `invariance`."""
    if dtype in (torch.bfloat16, torch.float16):
        return dtype
    cpu = torch.device(device).type == "cpu"
    return torch.float64 if batch_invariant and cpu else torch.float32


def invariance(dtype: torch.dtype, batch_invariant: bool, device: torch.device | str) -> str:
    """What a row's tokens are independent of, per backend, as measured or as built:

    - "batch and bucket" (CPU, batch_invariant): alone, batched, padded to any bucket;
    - "bucket shape" (CUDA, or batch_invariant off): the same bucket shape gives the same
      bits (recorded == eager at that shape); across shapes cuBLAS may pick other kernels."""
    cpu = torch.device(device).type == "cpu"
    return "batch and bucket" if batch_invariant and cpu else "bucket shape"


Linear: TypeAlias = torch.Tensor | Int8Weight


@dataclass(slots=True)
class LayerWeights:
    qkv: Linear  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    o: Linear  # [hidden, heads * head_dim]
    gate_up: Linear  # [2 * intermediate, hidden]
    down: Linear  # [hidden, intermediate]
    input_norm: torch.Tensor  # [hidden]
    post_norm: torch.Tensor  # [hidden]


class LlamaModel:
    """Weights and the forward. Holds no per-request state: that lives in the plan and pool."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        batch_invariant: bool = True,
        max_positions: int | None = None,
        quantize: str | None = None,
    ) -> None:
        check_quantize(quantize)
        self.config = config
        self.quantize = quantize
        self.dtype = dtype
        self.device = resolve_device(device)
        self.batch_invariant = batch_invariant
        self.accum_dtype = attention_dtype(dtype, batch_invariant, self.device)
        self.invariance = invariance(dtype, batch_invariant, self.device)
        self.scale = config.head_dim**-0.5

        def take(name: str) -> torch.Tensor:
            try:
                tensor = weights.pop(name)
            except KeyError:
                raise WeightsError("checkpoint", f"weight {name} is missing") from None
            if tensor.device != self.device:
                tensor = tensor.to(self.device)
            return tensor if tensor.dtype == dtype else tensor.to(dtype)

        def take_optional(name: str) -> torch.Tensor | None:
            return take(name) if name in weights else None

        self.embed = take("model.embed_tokens.weight")  # [vocab, hidden]
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            q, k, v = (take(f"{p}self_attn.{n}_proj.weight") for n in "qkv")
            biases = [take_optional(f"{p}self_attn.{n}_proj.bias") for n in "qkv"]
            self.layers.append(
                LayerWeights(
                    qkv=torch.cat((q, k, v)),
                    qkv_bias=torch.cat(biases) if biases[0] is not None else None,  # type: ignore[arg-type]
                    o=take(f"{p}self_attn.o_proj.weight"),
                    gate_up=torch.cat(
                        (take(f"{p}mlp.gate_proj.weight"), take(f"{p}mlp.up_proj.weight"))
                    ),
                    down=take(f"{p}mlp.down_proj.weight"),
                    input_norm=take(f"{p}input_layernorm.weight"),
                    post_norm=take(f"{p}post_attention_layernorm.weight"),
                )
            )
        self.norm = take("model.norm.weight")
        lm_head = take_optional("lm_head.weight")
        self.lm_head: Linear = (
            self.embed if lm_head is None or config.tie_word_embeddings else lm_head
        )
        if quantize == "int8":
            # The embedding table stays as it is for lookups; the output projection (tied or
            # not) and every layer's linears become int8.
            self.lm_head = Int8Weight.quantize(self.lm_head, dtype)
            for layer in self.layers:
                for name in ("qkv", "o", "gate_up", "down"):
                    setattr(layer, name, Int8Weight.quantize(getattr(layer, name), dtype))
        inv_freq = rope_inv_freq(config, self.device)  # [head_dim / 2] float32
        # The rotary table covers what the deployment serves, not a 128k-position config.
        positions = min(config.max_position_embeddings, max_positions or 1 << 62)
        t = torch.arange(positions, device=self.device, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [max_pos, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos()  # [max_pos, head_dim]
        self.sin = emb.sin()

    @classmethod
    def from_tensors(
        cls,
        config: ModelConfig,
        tensors: Iterable[tuple[str, torch.Tensor]],
        **kwargs: object,
    ) -> LlamaModel:
        """Build from (name, tensor) pairs; each is cast and placed once, then dropped."""
        return cls(config, dict(tensors), **kwargs)  # type: ignore[arg-type]

    @classmethod
    def empty(
        cls,
        config: ModelConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        **kwargs: object,
    ) -> LlamaModel:
        """Uninitialised weights of config's shape: for a trace on `meta`, or to fill with
        random values (the GPU check's stand-in for a checkpoint it cannot carry)."""
        weights = {
            name: torch.empty(shape, dtype=dtype, device=device)
            for name, shape in weight_shapes(config).items()
        }
        return cls(config, weights, dtype=dtype, device=device, **kwargs)  # type: ignore[arg-type]

    # -- pieces ---------------------------------------------------------------------------

    def step_footprint(self) -> StepFootprint:
        """What one decode step of this model needs at its peak, by shape (the recording
        budget's and the warm list's one price)."""
        cfg = self.config
        return StepFootprint(
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            vocab_size=cfg.vocab_size,
            pool_bytes=self.dtype.itemsize,
            accum_bytes=self.accum_dtype.itemsize,
        )

    def _linear(self, x: torch.Tensor, w: Linear, b: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(w, Int8Weight):
            return w.matmul(x, b)
        rows = x.shape[0]
        pad = -rows % INVARIANT_ROW_TILE
        if self.batch_invariant and pad and x.dtype == torch.float32 and x.device.type == "cpu":
            x = torch.cat((x, x.new_zeros(pad, x.shape[1])))
            return F.linear(x, w, b)[:rows]
        return F.linear(x, w, b)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return weight * xf.to(x.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [tokens, heads, head_dim]; Hugging Face layout: rotate the two halves.
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)

    # -- forward --------------------------------------------------------------------------

    def forward(
        self,
        plan: DecodePlan | PrefillPlan,
        cache: CacheRows,
        logit_rows: torch.Tensor | slice | None = None,
    ) -> torch.Tensor:
        """Logits (float32) of the selected rows of the flat batch: [selected, vocab].

        `logit_rows` defaults to a decode plan's rows as the cache view selects them, and to
        each chunk's last token of a prefill plan.
        """
        cfg = self.config
        heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        x = self.embed[plan.input_ids]  # [tokens, hidden]
        tokens = x.shape[0]
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        cos = self.cos[plan.positions][:, None, :]  # [tokens, 1, head_dim], once for all layers
        sin = self.sin[plan.positions][:, None, :]
        for index, layer in enumerate(self.layers):
            h = self._rms_norm(x, layer.input_norm)
            qkv = self._linear(h, layer.qkv, layer.qkv_bias)  # [tokens, q + 2 kv]
            q = qkv[:, :q_size].view(tokens, heads, head_dim)
            k = qkv[:, q_size : q_size + kv_size].view(tokens, kv_heads, head_dim)
            v = qkv[:, q_size + kv_size :].view(tokens, kv_heads, head_dim)
            q = self._rotate(q, cos, sin)
            k = self._rotate(k, cos, sin)
            cache.write(index, plan, k, v)
            attn = cache.paged_attention(index, q, plan, self.scale, self.accum_dtype)
            attn = attn.to(x.dtype).reshape(tokens, q_size)
            x = x + self._linear(attn, layer.o)
            h = self._rms_norm(x, layer.post_norm)
            gate_up = self._linear(h, layer.gate_up)  # [tokens, 2 * intermediate]
            gate, up = gate_up.chunk(2, dim=-1)
            x = x + self._linear(F.silu(gate) * up, layer.down)
        if logit_rows is None:
            if isinstance(plan, DecodePlan):
                logit_rows = slice(0, cache.num_logit_rows(plan))
            else:
                logit_rows = plan.last_token_idx
        x = self._rms_norm(x[logit_rows], self.norm)
        return self._linear(x, self.lm_head).float()


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight the model takes, by Hugging Face name, and its shape."""
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (config.q_size, hidden),
            p + "self_attn.k_proj.weight": (config.kv_size, hidden),
            p + "self_attn.v_proj.weight": (config.kv_size, hidden),
            p + "self_attn.o_proj.weight": (hidden, config.q_size),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
        if config.attention_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (config.q_size,),
                p + "self_attn.k_proj.bias": (config.kv_size,),
                p + "self_attn.v_proj.bias": (config.kv_size,),
            }
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes

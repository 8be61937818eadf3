"""The BERT family's forward: bidirectional attention over each whole input, no K/V kept.

BERT, RoBERTa/XLM-R and NomicBERT differ only in the fields of their `EncoderLayers`
(loading/encoder_layers.py): learned or rotary positions, a token-type row per segment, GELU
or SwiGLU, biases or none. Each layer is post-norm: LayerNorm(x + attention(x)), then
LayerNorm(x + MLP(x)), and the embeddings are normed before the first layer. The output is each
row's last-layer state, which pooling reads (there is no LM head and no final norm).

The engine schedules an encoder's prompt as one chunk (its attention reads every position of
the input, not a cache), so a step's PrefillPlan is a list of whole inputs; attention runs per
input, and every other op row by row, so an input's answer does not depend on its batch. The
linears are whatever form the weights were loaded in (weight_forms.py): a GGUF's blocks on
nanoserve's CPU kernels, or floats on torch, as the decoder's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from nanoserve.core import DecodePlan, PrefillPlan, StepFootprint
from nanoserve.core.kv_cache_dtype import KvCacheDtype
from nanoserve.runtime.errors import QuantizationError
from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.loading.encoder_layers import EncoderLayers
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.batch_invariance import tiled_linear
from nanoserve.runtime.model.device import resolve_device
from nanoserve.runtime.model.experts import ExpertUsage
from nanoserve.runtime.model.int8_weight import Int8Weight
from nanoserve.runtime.model.kv_pool import CacheRows
from nanoserve.runtime.model.quant_weight import QuantLinear, QuantWeight
from nanoserve.runtime.model.rotary import rotary_table
from nanoserve.runtime.model.weight_forms import (
    KERNEL_FORMS,
    Linear,
    Source,
    check_quantize,
    dense,
    describe_fallbacks,
    describe_types,
    kept_blocks,
    linear_kernels,
    make_linear,
    prepare_kernels,
)
from nanoserve.runtime.model.whole_attention import whole_attention

Norm = tuple[torch.Tensor, torch.Tensor]  # a LayerNorm's weight and bias, float32


@dataclass(frozen=True, slots=True)
class EncoderLayer:
    qkv: Linear  # [3 * hidden, hidden]
    qkv_bias: torch.Tensor | None
    o: Linear
    o_bias: torch.Tensor | None
    attn_norm: Norm
    up: Linear  # [intermediate, hidden]; SwiGLU: gate then up, [2 * intermediate, hidden]
    up_bias: torch.Tensor | None
    down: Linear
    down_bias: torch.Tensor | None
    out_norm: Norm


class EncoderModel:
    """Weights and the forward of a BERT-family encoder (holds no per-request state)."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, Source],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        batch_invariant: bool = True,
        max_positions: int | None = None,
        quantize: str | None = None,
        weights_path: Path | None = None,
        sep_token_id: int | None = None,
    ) -> None:
        check_quantize(quantize)
        assert config.encoder is not None, "an EncoderModel needs an encoder's config"
        self.config, self.encoder = config, config.encoder
        self.weights_path, self.quantize, self.dtype = weights_path, quantize, dtype
        self.device = resolve_device(device)
        kernel_ops = quantize in KERNEL_FORMS
        prepare_kernels(config, quantize, self.device)
        self.batch_invariant = batch_invariant
        self.kv_cache_dtype = KvCacheDtype.of(dtype)  # no K/V is kept; the plan's form only
        self.accum_dtype = dtype
        self.sep_token_id = self.encoder.sep_token_id or sep_token_id
        self.kernels = linear_kernels(quantize, dtype, self.device)
        self.invariance = "batch, bucket and ISA" if kernel_ops else "batch and bucket"
        self._load(weights, quantize)
        positions = min(config.max_position_embeddings, max_positions or 1 << 62)
        self.rotary = (
            None
            if self.encoder.learned_positions
            else rotary_table(config, positions, self.device)  # [positions, head_dim] each
        )
        self.weight_types = describe_types(self.quant_weights()) if kernel_ops else None
        self.expert_usage: ExpertUsage | None = None  # an encoder routes to no experts
        self.weight_fallbacks = describe_fallbacks(self.quant_weights())

    def _load(self, weights: dict[str, Source], quantize: str | None) -> None:
        enc, dtype, device = self.encoder, self.dtype, self.device

        def take(name: str) -> torch.Tensor:
            return dense(weights.pop(name), torch.float32, device)

        def bias(*names: str) -> torch.Tensor | None:
            if not enc.biases:
                return None
            return torch.cat([take(f"{n}.bias") for n in names])

        def linear(*names: str) -> Linear:
            return make_linear([weights.pop(f"{n}.weight") for n in names], quantize, dtype, device)

        def norm(prefix: str) -> Norm:
            return take(f"{prefix}.LayerNorm.weight"), take(f"{prefix}.LayerNorm.bias")

        self.word = take("embeddings.word_embeddings.weight")
        self.position = (
            take("embeddings.position_embeddings.weight") if enc.learned_positions else None
        )
        types = "embeddings.token_type_embeddings.weight"
        self.token_type = take(types) if enc.type_vocab_size else None
        self.embed_norm = norm("embeddings")
        self.layers: list[EncoderLayer] = []
        for i in range(self.config.num_layers):
            p = f"encoder.layer.{i}"
            qkv = (f"{p}.attention.self.qkv",) if enc.fused_qkv else tuple(
                f"{p}.attention.self.{part}" for part in ("query", "key", "value")
            )  # fmt: skip
            up = f"{p}.intermediate.dense"
            mlp = (f"{p}.intermediate.gate", up) if enc.swiglu else (up,)
            self.layers.append(
                EncoderLayer(
                    qkv=linear(*qkv),
                    qkv_bias=bias(*qkv),
                    o=linear(f"{p}.attention.output.dense"),
                    o_bias=bias(f"{p}.attention.output.dense"),
                    attn_norm=norm(f"{p}.attention.output"),
                    up=linear(*mlp),
                    up_bias=bias(*mlp),
                    down=linear(f"{p}.output.dense"),
                    down_bias=bias(f"{p}.output.dense"),
                    out_norm=norm(f"{p}.output"),
                )
            )

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, **kwargs: object) -> EncoderModel:
        quantize = kwargs.get("quantize")
        tensors = checkpoint.sources(kept_blocks(quantize if isinstance(quantize, str) else None))
        sep = checkpoint.tokenizer.token_to_id("[SEP]")
        if sep is None:
            sep = checkpoint.tokenizer.token_to_id("</s>")
        return cls.from_tensors(
            checkpoint.config, tensors, weights_path=checkpoint.path, sep_token_id=sep, **kwargs
        )

    @classmethod
    def from_tensors(
        cls, config: ModelConfig, tensors: Iterable[tuple[str, Source]], **kwargs: object
    ) -> EncoderModel:
        return cls(config, dict(tensors), **kwargs)  # type: ignore[arg-type]

    def use_kv_cache_dtype(self, kv: KvCacheDtype) -> None:
        """An encoder keeps no K/V: any form is as good as none."""
        self.kv_cache_dtype = kv

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.kv_cache_dtype.torch_dtype

    def quant_weights(self) -> list[QuantWeight]:
        linears = [w for layer in self.layers for w in (layer.qkv, layer.o, layer.up, layer.down)]
        return [p for w in linears if isinstance(w, QuantLinear) for p in w.parts]

    def step_footprint(self) -> StepFootprint:
        cfg = self.config
        return StepFootprint(
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            vocab_size=cfg.vocab_size,
            pool_bytes=self.kv_dtype.itemsize,
            accum_bytes=self.accum_dtype.itemsize,
            gathers=False,
        )

    # -- forward ----------------------------------------------------------------------------

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise QuantizationError("an encoder has no LM head: it embeds and scores")

    def hidden(
        self,
        plan: DecodePlan | PrefillPlan,
        cache: CacheRows | None = None,
        logit_rows: torch.Tensor | slice | None = None,
    ) -> torch.Tensor:
        """The last layer's states of the selected rows (default: each input's last), float32.
        Every chunk of `plan` is a whole input (its positions start at 0)."""
        if not isinstance(plan, PrefillPlan):
            raise TypeError("an encoder runs whole inputs, never a decode step")
        enc, cfg = self.encoder, self.config
        ids, positions = plan.input_ids, plan.positions
        x = self.word[ids]
        if self.position is not None:
            x = x + self.position[positions + enc.position_offset]
        if self.token_type is not None:
            x = x + self.token_type[self._token_types(ids, plan.query_starts)]
        x = _layer_norm(x, self.embed_norm, enc.layer_norm_eps)
        starts = plan.query_starts
        heads, head_dim = cfg.num_heads, cfg.head_dim
        for layer in self.layers:
            qkv = self._linear(x, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split(cfg.hidden_size, dim=-1)
            if self.rotary is not None:
                q, k = self._rotate(q, positions), self._rotate(k, positions)
            qh, kh, vh = (t.view(-1, heads, head_dim) for t in (q, k, v))
            mixed = whole_attention(qh, kh, vh, starts)
            attn = self._linear(mixed, layer.o, layer.o_bias)
            x = _layer_norm(x + attn, layer.attn_norm, enc.layer_norm_eps)
            up = self._linear(x, layer.up, layer.up_bias)
            if enc.swiglu:
                gate, up = up.chunk(2, dim=-1)
                inner = F.silu(gate) * up
            else:
                inner = _activate(up, enc)
            down = self._linear(inner, layer.down, layer.down_bias)
            x = _layer_norm(x + down, layer.out_norm, enc.layer_norm_eps)
        return x[plan.last_token_idx if logit_rows is None else logit_rows]

    def forward(
        self,
        plan: DecodePlan | PrefillPlan,
        cache: CacheRows | None = None,
        logit_rows: torch.Tensor | slice | None = None,
    ) -> torch.Tensor:
        return self.logits(self.hidden(plan, cache, logit_rows))

    def _token_types(self, ids: torch.Tensor, starts: tuple[int, ...]) -> torch.Tensor:
        """Each row's segment: 0 through an input's first separator, 1 after it (a pair)."""
        types = torch.zeros_like(ids)
        if self.sep_token_id is None or self.encoder.type_vocab_size < 2:
            return types
        for a, b in itertools.pairwise(starts):
            seps = (ids[a:b] == self.sep_token_id).long()
            types[a:b] = (seps.cumsum(0) - seps > 0).long()
        return types

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary in Hugging Face's layout (each head's two halves share a frequency)."""
        assert self.rotary is not None
        cos, sin = (t[positions][:, None, :] for t in self.rotary)  # [tokens, 1, head_dim]
        h = x.view(x.shape[0], self.config.num_heads, self.config.head_dim)
        first, second = h.chunk(2, dim=-1)
        turned = torch.cat((-second, first), dim=-1)
        return (h * cos + turned * sin).reshape(x.shape)

    def _linear(self, x: torch.Tensor, w: Linear, b: torch.Tensor | None) -> torch.Tensor:
        """x float32 -> float32, in whatever form the weight is."""
        if isinstance(w, QuantLinear):  # the kernel adds the bias as it stores each output
            return w.matmul(x.to(torch.float32), b)
        if isinstance(w, Int8Weight):
            out = w.matmul(x.to(self.dtype)).float()
            return out if b is None else out + b
        xs = x.to(w.dtype)
        bias = None if b is None else b.to(w.dtype)
        if self.batch_invariant and x.device.type == "cpu":
            return tiled_linear(xs, w, bias).float()
        return F.linear(xs, w, bias).float()


def _layer_norm(x: torch.Tensor, norm: Norm, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), norm[0], norm[1], eps)


def _activate(x: torch.Tensor, encoder: EncoderLayers) -> torch.Tensor:
    if encoder.act == "gelu":
        return F.gelu(x)
    if encoder.act == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    return F.silu(x)

"""The one forward of every decoder family, over a flat batch, with every K/V read and written
via the pool.

Each family is deltas on it, each a field of ModelConfig: per-head q/k norms before rotary (OLMoE
norms the whole projections), Gemma's sandwich norms and GeGLU, scaled embeddings, queries and
branches, sliding windows with their own rotary base, layers without rotary, gpt-oss's sinks. A
hybrid's recurrent layers (LFM2's short convolution, Qwen3.5's gated DeltaNet, Granite 4.0-H's
Mamba2: recurrent_mixer.py) keep their state in the state pool, addressed by the plan's
`state_slots`; only attention layers that write K/V hold a pool layer (`kv_index`), described
by their `LayerKind`. A mixture of experts runs in place of the MLP, or (Gemma 4) beside it
(experts.py); Gemma 4 adds per-layer inputs and layer scalars (per_layer_embedding.py).

One forward takes either a DecodePlan (one token per row; the step that is bucketed and
recorded) or a PrefillPlan (chunks of prompts, and decode rows as chunks of one token). Each
layer is RMSNorm, the qkv projection, rotary and the K/V write, paged attention, the output
projection, and the MLP; the linears are whatever form the weights were loaded in
(weight_forms.py) and the rest is one of two kernel sets (layer_ops.py): torch's, or
nanoserve's CPU kernels, which the CPU-only weight forms (q4, q8) run on. With `bidirectional`
(EmbeddingGemma), a prefill plan's chunks are whole inputs and attention reads each both ways
(whole_attention.py), keeping no K/V.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

from nanoserve.core import DecodePlan, PrefillPlan, StepFootprint, last_tokens
from nanoserve.core.kv_cache_dtype import KvCacheDtype, check_kv_form
from nanoserve.runtime.loading.checkpoint import Checkpoint, expected_tensor_shapes
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.batch_invariance import attention_dtype, invariance, tiled_linear
from nanoserve.runtime.model.device import resolve_device
from nanoserve.runtime.model.embedding import QuantEmbedding
from nanoserve.runtime.model.expert_arena import expert_arena
from nanoserve.runtime.model.experts import (
    ExpertUsage,
    ExpertWeights,
    experts_beside_mlp,
    routed_mlp,
)
from nanoserve.runtime.model.int8_weight import Int8Weight
from nanoserve.runtime.model.kv_pool import CacheRows
from nanoserve.runtime.model.layer_kind import kv_pool_layers, layer_kinds, state_tensors
from nanoserve.runtime.model.layer_ops import CpuKernelOps, LayerOps, TorchOps
from nanoserve.runtime.model.model_weights import assemble_weights
from nanoserve.runtime.model.per_layer_embedding import layer_tail, per_layer_inputs
from nanoserve.runtime.model.quant_weight import QuantLinear, QuantWeight
from nanoserve.runtime.model.recurrent_mixer import recurrent_mix
from nanoserve.runtime.model.rotary import rotary_table
from nanoserve.runtime.model.weight_forms import (
    KERNEL_FORMS,
    Linear,
    Source,
    check_quantize,
    describe_fallbacks,
    describe_types,
    kept_blocks,
    linear_kernels,
    prepare_kernels,
)
from nanoserve.runtime.model.whole_attention import whole_attention


class LlamaModel:
    """Weights and the forward. Holds no per-request state: that lives in the plan and pool."""

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
        weights_path: Path | None = None,  # the file or directory read; None: built in memory
    ) -> None:
        check_quantize(quantize)
        self.config = config
        self.weights_path = weights_path
        self.quantize = quantize
        self.dtype = dtype
        self.device = resolve_device(device)
        prepare_kernels(config, quantize, self.device)
        self.batch_invariant = batch_invariant
        self.accum_dtype = attention_dtype(dtype, batch_invariant, self.device)
        kernel_ops = quantize in KERNEL_FORMS
        # nanoserve's kernels keep the residual stream, norms and biases in float32, and the K/V
        # pool in IEEE half, as llama.cpp's default cache: 11 significant bits to bf16's 8
        # (teacher-forced on Qwen2.5-0.5B: mean |dlogit| 0.044 with a bf16 pool, 0.041 fp32).
        small_dtype = torch.float32 if kernel_ops else dtype
        self.kv_cache_dtype = KvCacheDtype.of(torch.float16 if kernel_ops else dtype)

        # A GGUF's experts on the kernels: packed once into a cache file, then mapped.
        arena = expert_arena(config, weights, quantize, weights_path)
        assembled = assemble_weights(
            config,
            weights,
            dtype=dtype,
            device=self.device,
            quantize=quantize,
            small_dtype=small_dtype,
            arena=arena,
        )
        if arena is not None:
            arena.finish()
        self.embed, self.layers, self.norm = assembled.embed, assembled.layers, assembled.norm
        self.lm_head, self.tied = assembled.lm_head, assembled.tied
        self.per_layer = assembled.per_layer  # Gemma 4's per-layer embedding, or None
        # The rotary tables cover what the deployment serves, not a 128k-position config.
        positions = min(config.max_position_embeddings, max_positions or 1 << 62)
        self.kinds = layer_kinds(config)
        # Where each layer keeps what it carries (layer_kind.py).
        self.kv_index, self.state_index = kv_pool_layers(config), state_tensors(config)
        # Table 0 (the global base) always, so a layer without rotary has a shape to copy.
        tables = sorted({0} | {k.rotary for k in self.kinds if k.rotary is not None})
        self.rotary_tables = [
            rotary_table(config, positions, self.device, sliding=bool(t)) for t in tables
        ]  # [max_pos, head_dim] cos and sin each
        self.ops: LayerOps = (
            CpuKernelOps(config, self.rotary_tables)
            if kernel_ops
            else TorchOps(config, self.rotary_tables, self.accum_dtype)
        )
        self.kernels = linear_kernels(quantize, dtype, self.device)
        self.invariance = invariance(dtype, batch_invariant, self.device, self.ops.name)
        # Which experts have run since boot (/health), by routed layer: its ordinal among them.
        routed = [layer.experts for layer in self.layers if layer.experts is not None]
        self.routed_index: dict[int, int] = {}
        self.expert_usage: ExpertUsage | None = None
        if config.experts is not None and routed:
            self.routed_index = {i: n for n, i in enumerate(config.experts.layers)}
            self.expert_usage = ExpertUsage(routed, config.experts, arena)
        self.weight_types = self._weight_types()  # for the boot line and /health
        # The stored types served in another (re-quantized), or None.
        self.weight_fallbacks = describe_fallbacks(self.quant_weights())

    # -- what is served ---------------------------------------------------------------------

    def quant_weights(self) -> list[QuantWeight]:
        """Every packed tensor: the layers' linears' parts, then the output projection's."""
        linears = [
            w
            for layer in self.layers
            for w in (layer.qkv, layer.attn_gate, layer.o, layer.gate_up, layer.down)
        ]
        for layer in self.layers:
            if layer.experts is not None:
                e = layer.experts
                linears += [*e.gate_up, *e.down, e.shared_gate_up, e.shared_down]
        return [p for w in (*linears, self.lm_head) if isinstance(w, QuantLinear) for p in w.parts]

    def _weight_types(self) -> str | None:
        """The types served, one count per file tensor ("q5_0×133 q8_0×13 ..."), the embedding
        table included (once, when the output projection is tied to it); None unquantized."""
        served: list[QuantWeight | GgufBlocks] = [*self.quant_weights()]
        if isinstance(self.embed, QuantEmbedding) and not self.tied:
            served.append(self.embed.blocks)
        return describe_types(served) if served else None

    @classmethod
    def from_tensors(
        cls,
        config: ModelConfig,
        tensors: Iterable[tuple[str, Source]],
        **kwargs: object,
    ) -> LlamaModel:
        """Build from (name, tensor) pairs; each is cast and placed once, then dropped."""
        return cls(config, dict(tensors), **kwargs)  # type: ignore[arg-type]

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, **kwargs: object) -> LlamaModel:
        """Build from a checkpoint, taking a GGUF's blocks as stored where the weight form
        reads them so (q4, q8)."""
        quantize = kwargs.get("quantize")
        tensors = checkpoint.sources(kept_blocks(quantize if isinstance(quantize, str) else None))
        return cls.from_tensors(checkpoint.config, tensors, weights_path=checkpoint.path, **kwargs)

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

    def use_kv_cache_dtype(self, kv: KvCacheDtype) -> None:
        """Keep K/V in another form (`--kv-cache-dtype`); blocks only under the kernels."""
        for head_dim in sorted({kind.heads.head_dim for kind in self.kinds}):
            check_kv_form(kv, kernels=self.ops.name == "nanoserve", device=str(self.device),
                          head_dim=head_dim)  # fmt: skip
        self.kv_cache_dtype = kv

    @property
    def kv_dtype(self) -> torch.dtype:
        """The pool tensor's element type (uint8 for blocks)."""
        return self.kv_cache_dtype.torch_dtype

    # -- pieces ---------------------------------------------------------------------------

    def step_footprint(self) -> StepFootprint:
        """What one decode step of this model needs at its peak, by shape (the recording
        budget's and the warm list's one price)."""
        cfg = self.config
        return StepFootprint(  # the widest layer's heads, where layers differ (Gemma 4)
            num_heads=cfg.num_heads,
            num_kv_heads=max(kind.heads.num_kv_heads for kind in self.kinds),
            head_dim=max(kind.heads.head_dim for kind in self.kinds),
            vocab_size=cfg.vocab_size,
            pool_bytes=self.kv_dtype.itemsize,
            accum_bytes=self.accum_dtype.itemsize,
            gathers=self.ops.name == "torch",
        )

    def _linear(self, x: torch.Tensor, w: Linear, b: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(w, QuantLinear):
            return w.matmul(x, b)  # float32 in, float32 out
        if isinstance(w, Int8Weight):
            return w.matmul(x, b)
        if self.batch_invariant and x.device.type == "cpu":
            return tiled_linear(x, w, b)
        return F.linear(x, w, b)

    def _experts(
        self, h: torch.Tensor, weights: ExpertWeights, layer: int, mlp: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A routed layer's output: [tokens, hidden] (experts.py); with the dense `mlp`'s
        output, Gemma 4's two branches on the residual `h`."""
        assert self.config.experts is not None and self.expert_usage is not None
        usage, routed = self.expert_usage, self.routed_index[layer]
        args = (weights, self.config.experts, self._linear, self.ops.gated_act,
                lambda expert: usage.ran(routed, expert))  # fmt: skip
        if mlp is not None:
            return experts_beside_mlp(h, mlp, *args, self.ops.rms_norm)
        return routed_mlp(h, *args)

    def _projection_norms(
        self, qkv: torch.Tensor, norms: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """OLMoE's RMSNorms over the whole q and the whole k projection (v untouched)."""
        q, kv = self.config.q_size, self.config.kv_size
        spans = ((0, q), (q, q + kv))
        normed = [self.ops.rms_norm(qkv[:, a:b], n).to(qkv.dtype)
                  for (a, b), n in zip(spans, norms, strict=True)]  # fmt: skip
        return torch.cat((*normed, qkv[:, q + kv :]), dim=1)

    # -- forward --------------------------------------------------------------------------

    def forward(
        self,
        plan: DecodePlan | PrefillPlan,
        cache: CacheRows,
        logit_rows: torch.Tensor | slice | None = None,
    ) -> torch.Tensor:
        """Logits (float32) of the selected rows of the flat batch: [selected, vocab]
        (`hidden`'s rows through the output projection)."""
        return self.logits(self.hidden(plan, cache, logit_rows))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output projection of final-normed hidden states: [rows, vocab] float32."""
        if isinstance(self.lm_head, torch.Tensor):  # a pooled float32 row, on a bf16 model
            hidden = hidden.to(self.lm_head.dtype)
        logits = self._linear(hidden, self.lm_head).float()
        scaling, cap = self.config.logits_scaling, self.config.final_logit_softcap
        if scaling != 1.0:
            logits = logits / scaling
        if cap is not None:  # Gemma 4's soft cap: cap * tanh(logits / cap)
            logits = torch.tanh(logits / cap) * cap
        return logits

    def hidden(
        self,
        plan: DecodePlan | PrefillPlan,
        cache: CacheRows,
        logit_rows: torch.Tensor | slice | None = None,
    ) -> torch.Tensor:
        """The final-normed hidden states of the selected rows of the flat batch: [selected,
        hidden] (what the output projection reads, and what pooling pools).

        `logit_rows` defaults to every row of a decode plan, padding included, and to each
        chunk's last token of a prefill plan. A padded decode step computes its padded rows'
        logits too, whether it is recorded or run eagerly: the same row count on every path, so
        the same BLAS kernel (cuBLAS may choose another per row count), at the cost of a few
        rows of the output projection.

        A prefill plan's last layer carries only the chunks' last tokens past its K/V write:
        no later layer reads the other rows, and every op is row by row, so the logits are
        the untrimmed forward's (a 64-token prompt of a 24-layer model skips 63 rows of one
        layer's attention, output projection and MLP).
        """
        ops, cfg = self.ops, self.config
        last = len(self.layers) - 1
        x = ops.residual(self.embed[plan.input_ids])  # [tokens, hidden]
        if cfg.embedding_multiplier != 1.0:
            x = x * cfg.embedding_multiplier
        # Gemma 4's [tokens, layers, width], or None
        layer_inputs = per_layer_inputs(plan.input_ids, x, self.per_layer, cfg, self._linear, ops)
        rotary = ops.rotary(plan)  # once per table for all layers
        h = ops.rms_norm(x, self.layers[0].input_norm)
        for index, (layer, kind) in enumerate(zip(self.layers, self.kinds, strict=True)):
            # The last layer of a prefill carries only each chunk's last token past its writes.
            trim = logit_rows is None and index == last and isinstance(plan, PrefillPlan)
            trim = trim and not cfg.bidirectional  # there every row's K/V is read after it
            mixer_in = self._linear(h, layer.qkv, layer.qkv_bias)  # [tokens, q + 2 kv]
            if index in self.state_index:  # a recurrent layer
                native = self.ops.name == "nanoserve"  # decode steps in C++, on the pool
                state = self.state_index[index]
                mixed = recurrent_mix(mixer_in, plan, cache, state, layer, cfg, native)
                mixed = mixed.to(x.dtype)  # [tokens, what the output projection reads]
                if trim:
                    assert isinstance(plan, PrefillPlan)
                    rows = plan.last_token_idx  # [chunks]
                    mixed, x, plan = mixed[rows], x[rows], last_tokens(plan)
                attn = self._linear(mixed, layer.o, layer.o_bias)
            elif cfg.bidirectional:  # EmbeddingGemma: each whole input both ways, nothing kept
                assert isinstance(plan, PrefillPlan)
                table = None if kind.rotary is None else rotary[kind.rotary]
                q, k, v = ops.rotate(mixer_in, table, plan, layer.qk_norms)
                heads = whole_attention(
                    q, k, v, plan.query_starts, scale=cfg.attention_scale, window=kind.window
                )
                attn = self._linear(heads, layer.o)
            else:
                table = None if kind.rotary is None else rotary[kind.rotary]
                kv = self.kv_index[index]  # the layer's K/V in the pool (attention layers only)
                if layer.projection_norms is not None:  # OLMoE: q and k normed whole
                    mixer_in = self._projection_norms(mixer_in, layer.projection_norms)
                if kind.shares_kv:  # Gemma 4: q alone, over an earlier layer's K/V
                    assert layer.q_norm is not None
                    q = ops.rotate_query(mixer_in, table, plan, layer.q_norm, kind.heads)
                else:
                    q = ops.rotate_and_cache(
                        mixer_in, table, plan, cache, kv, layer.qk_norms, kind.heads, cfg.v_norm
                    )
                h_gate = h
                if trim:
                    assert isinstance(plan, PrefillPlan)
                    rows = plan.last_token_idx  # [chunks]
                    q, x, plan = q[rows], x[rows], last_tokens(plan)  # [chunks, q], [chunks, ...]
                    h_gate = h[rows]
                    layer_inputs = None if layer_inputs is None else layer_inputs[rows]
                heads = ops.attention(
                    q, plan, cache, kv, kind.window, layer.sinks, kind.heads
                )  # [tokens, q]
                if layer.attn_gate is not None:  # Qwen3.5: times sigmoid(the gate's query)
                    gate = self._linear(h_gate, layer.attn_gate).float().sigmoid()
                    heads = (heads.float() * gate).to(heads.dtype)
                attn = self._linear(heads, layer.o, layer.o_bias)
            if layer.attn_out_norm is not None:
                attn = ops.rms_norm(attn, layer.attn_out_norm)
            if cfg.residual_multiplier != 1.0:
                attn = attn * cfg.residual_multiplier
            h = ops.add_rms_norm(x, attn, layer.post_norm)
            if layer.experts is not None and layer.gate_up is None:  # experts for the MLP
                down = self._experts(h, layer.experts, index)
            else:
                assert layer.gate_up is not None and layer.down is not None
                gate_up = self._linear(h, layer.gate_up)  # [tokens, 2 * intermediate]
                down = self._linear(ops.gated_act(gate_up), layer.down)  # [tokens, hidden]
                if layer.experts is not None:  # Gemma 4: experts beside it, on the residual
                    down = self._experts(x, layer.experts, index, mlp=down)
            if layer.mlp_out_norm is not None:
                down = ops.rms_norm(down, layer.mlp_out_norm)
            if cfg.residual_multiplier != 1.0:
                down = down * cfg.residual_multiplier
            if layer.per_layer is not None or layer.scalar is not None:  # Gemma 4's tail
                inputs = None if layer_inputs is None else layer_inputs[:, index]
                layer_tail(x, down, inputs, layer.per_layer, layer.scalar, self._linear, ops)
                if index + 1 < len(self.layers):
                    h = ops.rms_norm(x, self.layers[index + 1].input_norm)
            elif index + 1 < len(self.layers):
                h = ops.add_rms_norm(x, down, self.layers[index + 1].input_norm)
            else:
                x.add_(down)
        if logit_rows is None:
            if isinstance(plan, DecodePlan):
                logit_rows = slice(0, plan.num_rows)
            else:
                logit_rows = plan.last_token_idx
        return ops.rms_norm(x[logit_rows], self.norm)


weight_shapes = expected_tensor_shapes  # every weight the model takes, by HF name: its shape

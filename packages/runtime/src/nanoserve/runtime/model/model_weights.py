"""The weights of a Llama-family model as the forward reads them: each tensor of a checkpoint
taken once, cast and placed, and each linear in its weight form (weight_forms.py).

A layer's projections are fused as the forward calls them (q, k and v as one qkv; gate and up
as one; a DeltaNet layer's four input projections as one), norms carry Gemma's and Qwen3.5's
(1 + w) offset already added, and the output projection is the embedding table itself where it
is tied and unquantized. Qwen3.5's query projection, each head's query then its output gate,
is split into the two linears the forward calls. A routed layer (a mixture of experts) has a
router and each expert's gate-and-up and down in place of the MLP's two linears.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from nanoserve.runtime.errors import WeightsError
from nanoserve.runtime.loading.checkpoint import layer_norm_names
from nanoserve.runtime.loading.expert_layers import EXPERT_BRANCH_NORMS
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.delta_net import DeltaNetWeights
from nanoserve.runtime.model.embedding import QuantEmbedding
from nanoserve.runtime.model.expert_arena import ExpertArena
from nanoserve.runtime.model.experts import ExpertWeights
from nanoserve.runtime.model.mamba2 import Mamba2Weights
from nanoserve.runtime.model.per_layer_embedding import PerLayerBranch, PerLayerEmbedding
from nanoserve.runtime.model.quant_weight import QuantLinear
from nanoserve.runtime.model.weight_forms import KERNEL_FORMS, Linear, Source, dense, make_linear


@dataclass(slots=True)
class LayerWeights:
    """One layer. Its mixer is attention, or on an LFM2 convolution layer the gated short
    convolution: then `qkv` is its input projection (B, C, x: [3 * hidden, hidden]), `o` its
    output projection, and `conv_kernel` its depthwise taps; or on a Qwen3.5 linear-attention
    layer gated DeltaNet: then `qkv` projects to q, k, v, z, b and a, `o` is its output
    projection, and `delta` holds the rest; or on a Granite 4.0-H Mamba2 layer: then `qkv`
    projects to z, x, B, C and dt, and `mamba` holds the rest."""

    qkv: Linear  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    o: Linear  # [hidden, heads * head_dim]
    gate_up: Linear | None  # [2 * intermediate, hidden]; None where experts replace the MLP
    down: Linear | None  # [hidden, intermediate]
    input_norm: torch.Tensor  # [hidden]
    post_norm: torch.Tensor  # [hidden], before the MLP
    qk_norms: tuple[torch.Tensor, torch.Tensor] | None = None  # [head_dim] each (Qwen3, Gemma 3)
    attn_out_norm: torch.Tensor | None = None  # [hidden], on attention's output (Gemma 3)
    mlp_out_norm: torch.Tensor | None = None  # [hidden], on the MLP's output (Gemma 3)
    conv_kernel: torch.Tensor | None = None  # [hidden, taps] float32: an LFM2 conv layer's
    conv_bias: torch.Tensor | None = None  # [hidden] float32, with the config's conv_bias
    o_bias: torch.Tensor | None = (
        None  # [hidden]: the output projection's bias (LFM2's conv, gpt-oss)
    )
    sinks: torch.Tensor | None = None  # [heads] float32: attention's sink logits (gpt-oss)
    delta: DeltaNetWeights | None = None  # a DeltaNet layer's kernel, decay and norm
    mamba: Mamba2Weights | None = None  # a Mamba2 layer's kernel, decay, skip and norm
    attn_gate: Linear | None = None  # [heads * head_dim, hidden]: Qwen3.5's output gate
    experts: ExpertWeights | None = None  # a routed layer's router and experts
    # [q] and [kv]: RMSNorms over the whole q and k projections (OLMoE)
    projection_norms: tuple[torch.Tensor, torch.Tensor] | None = None
    q_norm: torch.Tensor | None = None  # [head_dim]: a K/V-sharing layer's (its qkv is q alone)
    per_layer: PerLayerBranch | None = None  # Gemma 4's per-layer input branch
    scalar: torch.Tensor | None = None  # [1] float32: the layer's output times it (Gemma 4)


@dataclass(frozen=True, slots=True)
class ModelWeights:
    embed: torch.Tensor | QuantEmbedding  # [vocab, hidden], for lookups
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden], the final norm
    lm_head: Linear  # [vocab, hidden]
    tied: bool  # the output projection is the embedding's (stored once in the file)
    per_layer: PerLayerEmbedding | None = None  # Gemma 4's second table and its projection


def split_query_gate(both: Source, heads: int, head_dim: int) -> tuple[Source, Source]:
    """Qwen3.5's query projection ([heads * 2 * head_dim, hidden]: each head's query rows, then
    its gate's) as two: the queries' rows and the gates'. A GGUF's blocks stay blocks: each half
    a copy of its rows' bytes, as stored."""
    rows = torch.arange(heads * 2 * head_dim).reshape(heads, 2, head_dim)
    query_rows, gate_rows = rows[:, 0].flatten(), rows[:, 1].flatten()
    if isinstance(both, GgufBlocks):
        order = both.order if both.order is not None else torch.arange(both.shape[0])
        shape = (heads * head_dim, both.shape[1])
        query = GgufBlocks(both.kind, both.rows.index_select(0, order[query_rows]), shape)
        gate = GgufBlocks(both.kind, both.rows.index_select(0, order[gate_rows]), shape)
        both.done()  # the file's pages: both halves are copied
        return query, gate
    return both[query_rows], both[gate_rows]


def assemble_weights(
    config: ModelConfig,
    weights: dict[str, Source],
    *,
    dtype: torch.dtype,
    device: torch.device,
    quantize: str | None,
    small_dtype: torch.dtype,
    arena: ExpertArena | None = None,
) -> ModelWeights:
    """Every weight the forward reads, popped from `weights` (what is left was not used);
    `small_dtype`: what norms and biases are kept in; `arena`: where experts it holds are
    packed (mapped from its file)."""
    kernel_ops = quantize in KERNEL_FORMS

    def source(name: str) -> Source:
        try:
            return weights.pop(name)
        except KeyError:
            raise WeightsError("checkpoint", f"weight {name} is missing") from None

    def take(name: str, as_dtype: torch.dtype = dtype) -> torch.Tensor:
        return dense(source(name), as_dtype, device)

    def norm(name: str) -> torch.Tensor:
        # Gemma's norms scale by (1 + w): the 1 added once here, in float32, as transformers
        # adds it (a GGUF's converter has added it already: the file's config says 0).
        weight = dense(source(name), torch.float32, device)
        if config.norm_offset:
            weight = weight + config.norm_offset
        return weight.to(small_dtype)

    def linear(*names: str, form: str | None = quantize) -> Linear:
        return make_linear([source(n) for n in names], form, dtype, device)

    def expert_linear(*names: str) -> Linear:
        if arena is None or not all(arena.holds(n) for n in names):
            return linear(*names)
        blocks = [source(n) for n in names]
        return QuantLinear(tuple(arena.place(n, b) for n, b in zip(names, blocks, strict=True)))  # type: ignore[arg-type]

    embed = source("model.embed_tokens.weight")
    # Under the kernels a GGUF's table stays in the file, read row by row (embedding.py).
    embed_table: torch.Tensor | QuantEmbedding = (
        QuantEmbedding(embed)
        if kernel_ops and isinstance(embed, GgufBlocks)
        else dense(embed, dtype, device)
    )  # [vocab, hidden], for lookups
    layers: list[LayerWeights] = []
    norm_names = layer_norm_names(config)
    conv, delta, mamba = config.short_conv, config.delta_net, config.mamba

    def recurrent_mixer(i: int) -> dict[str, Any] | None:
        """Layer i's recurrent mixer as LayerWeights fields (its projections, and its
        convolution, DeltaNet or Mamba2 tensors), or None for an attention layer."""
        p = f"model.layers.{i}."
        if conv is not None and i in conv.layers:
            c, bias = f"{p}conv.", conv.bias
            return {
                "qkv": linear(f"{c}in_proj.weight"),
                "qkv_bias": take(f"{c}in_proj.bias", small_dtype) if bias else None,
                "o": linear(f"{c}out_proj.weight"),
                "o_bias": take(f"{c}out_proj.bias", small_dtype) if bias else None,
                "conv_kernel": take(f"{c}conv.weight", torch.float32)[:, 0].contiguous(),
                "conv_bias": take(f"{c}conv.bias", torch.float32) if bias else None,
            }
        if delta is not None and i in delta.layers:
            d = f"{p}linear_attn."
            in_proj = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
            return {
                "qkv": linear(*(f"{d}{n}.weight" for n in in_proj)),
                "qkv_bias": None,
                "o": linear(f"{d}out_proj.weight"),
                "delta": DeltaNetWeights(
                    conv_kernel=take(f"{d}conv1d.weight", torch.float32)[:, 0].contiguous(),
                    decay_rate=-take(f"{d}A_log", torch.float32).exp(),
                    dt_bias=take(f"{d}dt_bias", torch.float32),
                    norm=take(f"{d}norm.weight", torch.float32),
                    eps=config.rms_norm_eps,
                ),
            }
        if mamba is not None and i in mamba.layers:
            m, bias = f"{p}mamba.", mamba.proj_bias
            return {
                "qkv": linear(f"{m}in_proj.weight"),
                "qkv_bias": take(f"{m}in_proj.bias", small_dtype) if bias else None,
                "o": linear(f"{m}out_proj.weight"),
                "o_bias": take(f"{m}out_proj.bias", small_dtype) if bias else None,
                "mamba": Mamba2Weights(
                    conv_kernel=take(f"{m}conv1d.weight", torch.float32)[:, 0].contiguous(),
                    conv_bias=take(f"{m}conv1d.bias", torch.float32) if mamba.conv_bias else None,
                    decay_rate=-take(f"{m}A_log", torch.float32).exp(),
                    dt_bias=take(f"{m}dt_bias", torch.float32),
                    skip=take(f"{m}D", torch.float32),
                    norm=take(f"{m}norm.weight", torch.float32),
                    eps=config.rms_norm_eps,
                ),
            }
        return None

    def mlp(i: int, norms: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Layer i's MLP as LayerWeights fields: its two linears, or a router and experts (or,
        Gemma 4, both)."""
        p = f"model.layers.{i}.mlp."
        parts = ["gate_up"] if config.fused_mlp else ["gate", "up"]  # the checkpoint's MLP form
        if config.experts is not None and i in config.experts.layers:
            e = range(config.experts.num_experts)
            experts = ExpertWeights(
                router=take(f"{p}gate.weight", small_dtype),
                gate_up=tuple(
                    expert_linear(
                        f"{p}experts.{j}.gate_proj.weight", f"{p}experts.{j}.up_proj.weight"
                    )
                    for j in e
                ),
                down=tuple(expert_linear(f"{p}experts.{j}.down_proj.weight") for j in e),
            )
            if config.experts.expert_bias:
                experts = replace(experts, bias=take(f"{p}expert_bias", torch.float32))
            if config.experts.router_bias:
                experts = replace(experts, router_bias=take(f"{p}gate.bias", small_dtype))
            if config.experts.linear_biases:  # each expert's: gate then up, and down
                x = f"{p}experts."
                gate_up = [(f"{x}{j}.gate_proj.bias", f"{x}{j}.up_proj.bias") for j in e]
                experts = replace(
                    experts,
                    gate_up_bias=torch.stack(
                        [torch.cat([take(n, small_dtype) for n in pair]) for pair in gate_up]
                    ),
                    down_bias=torch.stack([take(f"{x}{j}.down_proj.bias", small_dtype) for j in e]),
                )
            if config.experts.shared_size is not None:
                s = p if config.experts.shared_is_mlp else f"{p}shared_expert."
                experts = replace(
                    experts,
                    shared_gate_up=linear(*(f"{s}{n}_proj.weight" for n in parts)),
                    shared_down=linear(f"{s}down_proj.weight"),
                    shared_gate=take(f"{p}shared_expert_gate.weight", small_dtype)
                    if config.experts.shared_gate
                    else None,
                )
            if not config.experts.beside_mlp:
                return {"gate_up": None, "down": None, "experts": experts}
            # Gemma 4: the router's input scale (hidden^-0.5 folded in), each expert's weight
            # scale, the branches' norms; and the dense MLP beside them, below
            hidden = config.hidden_size**-0.5
            scale = dense(source(f"{p}router_scale"), torch.float32, device) * hidden
            experts = replace(
                experts,
                router_scale=scale.to(small_dtype),
                expert_scale=take(f"{p}expert_scale", torch.float32),
                branch_norms=tuple(norms[n] for n in EXPERT_BRANCH_NORMS),  # type: ignore[arg-type]
            )
            return {
                "gate_up": linear(*(f"{p}{n}_proj.weight" for n in parts)),
                "down": linear(f"{p}down_proj.weight"),
                "experts": experts,
            }
        return {
            "gate_up": linear(*(f"{p}{n}_proj.weight" for n in parts)),
            "down": linear(f"{p}down_proj.weight"),
        }

    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        norms = {n: norm(f"{p}{n}.weight") for n in norm_names}
        mixer = recurrent_mixer(i)
        if mixer is not None:  # a recurrent layer's mixer, then the MLP every layer has
            layers.append(
                LayerWeights(
                    **mixer,
                    **mlp(i, norms),
                    input_norm=norms["input_layernorm"],
                    post_norm=norms["post_attention_layernorm"],
                )
            )
            continue
        fused = config.fused_projections
        attn = [f"{p}self_attn.{n}_proj" for n in (["qkv"] if fused else "qkv")]
        has_bias = f"{attn[0]}.bias" in weights
        shares_kv = i in config.shared_kv_layers
        if shares_kv:  # Gemma 4: q alone, its K/V an earlier layer's
            attn = attn[:1]
        elif config.k_eq_v and config.is_full_layer(i):  # V is K's projection: its rows twice
            weights[f"{attn[2]}.weight"] = weights[f"{attn[1]}.weight"]
        q_norm = norm(f"{p}self_attn.q_norm.weight") if shares_kv else None
        qk_norms = (
            (norm(f"{p}self_attn.q_norm.weight"), norm(f"{p}self_attn.k_norm.weight"))
            if config.qk_norm and not shares_kv
            else None
        )
        projection_norms = (
            (norm(f"{p}self_attn.q_norm.weight"), norm(f"{p}self_attn.k_norm.weight"))
            if config.projection_qk_norm
            else None
        )
        attn_gate = None
        if config.attn_output_gate:  # each head's query rows, then its gate's: split in two
            query, gate = split_query_gate(
                source(f"{attn[0]}.weight"), config.num_heads, config.head_dim
            )
            weights[f"{attn[0]}.weight"] = query
            attn_gate = make_linear([gate], quantize, dtype, device)
        layers.append(
            LayerWeights(
                qkv=linear(*(f"{a}.weight" for a in attn)),
                qkv_bias=torch.cat([take(f"{a}.bias", small_dtype) for a in attn])
                if has_bias
                else None,
                o=linear(f"{p}self_attn.o_proj.weight"),
                o_bias=take(f"{p}self_attn.o_proj.bias", small_dtype)
                if config.output_bias
                else None,
                sinks=take(f"{p}self_attn.sinks", torch.float32)
                if config.attention_sinks
                else None,
                **mlp(i, norms),
                input_norm=norms["input_layernorm"],
                post_norm=norms.get("pre_feedforward_layernorm", norms["post_attention_layernorm"]),
                qk_norms=qk_norms,
                attn_out_norm=norms["post_attention_layernorm"] if config.sandwich_norm else None,
                mlp_out_norm=norms.get("post_feedforward_layernorm"),
                attn_gate=attn_gate,
                projection_norms=projection_norms,
                q_norm=q_norm,
                per_layer=PerLayerBranch(
                    gate=linear(f"{p}per_layer_input_gate.weight"),
                    projection=linear(f"{p}per_layer_projection.weight"),
                    norm=norms["post_per_layer_input_norm"],
                )
                if config.per_layer_inputs is not None
                else None,
                scalar=take(f"{p}layer_scalar", torch.float32) if config.layer_scalar else None,
            )
        )
    final_norm = norm("model.norm.weight")
    per_layer = None
    if config.per_layer_inputs is not None:
        table = source("model.embed_tokens_per_layer.weight")
        per_layer = PerLayerEmbedding(
            table=QuantEmbedding(table)
            if kernel_ops and isinstance(table, GgufBlocks)
            else dense(table, dtype, device),
            projection=linear("model.per_layer_model_projection.weight"),
            norm=norm("model.per_layer_projection_norm.weight"),
        )
    # The output projection, tied or not, takes the head's form; tied and unquantized, it
    # is the embedding table itself.
    tied = "lm_head.weight" not in weights or config.tie_word_embeddings
    lm_source = embed if tied else source("lm_head.weight")
    weights.pop("lm_head.weight", None)
    lm_head: Linear
    if quantize is None and tied:
        assert isinstance(embed_table, torch.Tensor)
        lm_head = embed_table
    else:
        lm_head = make_linear([lm_source], quantize, dtype, device, head=True)
    return ModelWeights(embed_table, layers, final_norm, lm_head, tied, per_layer)

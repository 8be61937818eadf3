"""A mixture of experts in a model's config: which layers route each token to experts in place
of the dense MLP, how many experts there are and how wide, how many a token takes, and how the
router's scores become the weights of the chosen.

Qwen3-MoE and OLMoE score every expert by a softmax over the router's logits, take the k
highest, and (Qwen3-MoE's `norm_topk_prob`) rescale the k weights to sum to one, or (OLMoE)
keep them as they are. Each expert is a SwiGLU MLP of its own (`moe_intermediate_size` wide for
Qwen3-MoE, `intermediate_size` for OLMoE, which has no dense MLP); the layer's output is the
weighted sum of its token's k experts. Qwen3-MoE may keep a dense MLP on some layers
(`mlp_only_layers`, `decoder_sparse_step`); every released checkpoint routes on all of them. Qwen3.5-MoE routes as
Qwen3-MoE (always rescaled), and adds a shared expert that every token runs
(`shared_expert_intermediate_size` wide), its output times the sigmoid of a one-row gate
(`shared_expert_gate`). LFM2-MoE scores each expert by a sigmoid, chooses by the scores plus a
learned bias (`expert_bias`, `use_expert_bias`), weights the chosen by their unbiased scores
rescaled to sum to one (`norm_topk_prob`, with 1e-6 under the sum) and times
`routed_scaling_factor`; its first `num_dense_layers` layers keep a dense MLP. Granite 4.0-H
(Tiny, Small) chooses the k highest logits and weighs them by a softmax over those k alone
(`topk_softmax`), and keeps its dense MLP (`shared_mlp`) beside the experts on every layer,
its output added: a shared expert stored under the MLP's own names (`shared_is_mlp`). Gemma 4
(26B-A4B, `enable_moe_block`) keeps its dense MLP too, but runs the experts beside it rather
than adding them in (`beside_mlp`): each branch has its own norms (the experts read the residual
through `pre_feedforward_layernorm_2`, the MLP's output and theirs are normed apart by
`post_feedforward_layernorm_1` and `_2` before they are summed), the router reads the residual
RMS-normed without a weight, times a learned scale and hidden^-0.5 (`router.scale`), scores by
softmax, rescales the k to sum to one, then times each chosen expert's own scale
(`router.per_expert_scale`); its experts are `moe_intermediate_size` wide and stacked
(`experts.gate_up_proj`, `experts.down_proj`).

A Hugging Face checkpoint stores each expert's linears apart (`mlp.experts.{e}.gate_proj`),
the router as `mlp.gate` (Granite stacks them: hf_stacked.py); a GGUF stores them stacked (`ffn_gate_exps`: [experts, rows, cols])
and the router as `ffn_gate_inp`, with the counts as `{arch}.expert_count`,
`{arch}.expert_used_count` and the width as `{arch}.expert_feed_forward_length`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError

# softmax over all experts, then the top k (Qwen, OLMoE); each expert's sigmoid (LFM2-MoE); or
# the k highest logits, then a softmax over those k (Granite)
Scoring = Literal["softmax", "sigmoid", "topk_softmax"]
SCORINGS: tuple[Scoring, ...] = ("softmax", "sigmoid", "topk_softmax")


# Gemma 4's experts block: the norm before the experts, and the two over each branch's output
EXPERT_BRANCH_NORMS = (
    "pre_feedforward_layernorm_2",
    "post_feedforward_layernorm_1",
    "post_feedforward_layernorm_2",
)


@dataclass(frozen=True, slots=True)
class ExpertLayers:
    """The layers that route to experts, and the experts' shape and routing."""

    layers: tuple[int, ...]
    num_experts: int
    experts_per_token: int  # k: the experts each token's row runs through
    intermediate_size: int  # one expert's MLP width
    normalize: bool  # the k chosen weights rescaled to sum to one
    scoring: Scoring = "softmax"
    shared_size: int | None = None  # a shared expert every token runs, this wide (Qwen3.5-MoE)
    shared_gate: bool = False  # its output times sigmoid(a one-row linear of the input)
    expert_bias: bool = False  # a learned bias added to the scores to choose (not to weigh)
    norm_eps: float = 0.0  # added to the k weights' sum when they are rescaled
    routed_scale: float = 1.0  # the k weights times this
    # the shared expert is the layer's dense MLP, under its names (Granite's `shared_mlp`)
    shared_is_mlp: bool = False
    router_bias: bool = False  # the router's logits have a bias (gpt-oss)
    linear_biases: bool = False  # each expert's projections have biases (gpt-oss)
    # gpt-oss's gate: gate clamped to <= clamp, up to [-clamp, clamp], then
    # (up + 1) * gate * sigmoid(alpha * gate); None: the model's SwiGLU
    clamp: float | None = None
    alpha: float = 1.0
    # Gemma 4's: the experts beside the layer's dense MLP, each branch normed apart; the router
    # on the normed, scaled residual; the k weights times each expert's own scale
    beside_mlp: bool = False

    def check(self, num_layers: int, source: str) -> None:
        for name in ("num_experts", "experts_per_token", "intermediate_size"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(source, f"experts: {name}={value!r} must be a positive integer")
        if self.experts_per_token > self.num_experts:
            raise ConfigError(
                source,
                f"num_experts_per_tok={self.experts_per_token} exceeds"
                f" num_experts={self.num_experts}",
            )
        if not isinstance(self.normalize, bool):
            raise ConfigError(source, f"norm_topk_prob={self.normalize!r} must be a bool")
        shared = self.shared_size
        if shared is not None and (type(shared) is not int or shared <= 0):
            raise ConfigError(source, f"experts: shared_size={shared!r} must be a positive integer")
        if self.shared_gate and shared is None:
            raise ConfigError(source, "experts: a shared expert gate without a shared expert")
        for name in ("norm_eps", "routed_scale", "alpha"):
            if not isinstance(getattr(self, name), float):
                raise ConfigError(
                    source, f"experts: {name}={getattr(self, name)!r} must be a float"
                )
        if self.clamp is not None and (not isinstance(self.clamp, float) or self.clamp <= 0):
            raise ConfigError(source, f"experts: swiglu_limit={self.clamp!r} must be positive")
        if self.scoring not in SCORINGS:
            raise UnsupportedModelError(source, f"expert scoring {self.scoring!r}")
        if any(type(i) is not int or not 0 <= i < num_layers for i in self.layers):
            raise ConfigError(
                source, f"expert layers {self.layers} name a layer outside 0..{num_layers - 1}"
            )

    def expert_shapes(
        self, prefix: str, hidden: int, fused_mlp: bool = False
    ) -> dict[str, tuple[int, ...]]:
        """One routed layer's tensors by Hugging Face name: the router, then each expert's
        gate, up and down projections, then a shared expert's (`fused_mlp`: gate and up as one,
        where it is the layer's MLP)."""
        inter = self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {f"{prefix}.gate.weight": (self.num_experts, hidden)}
        if self.router_bias:
            shapes[f"{prefix}.gate.bias"] = (self.num_experts,)
        for e in range(self.num_experts):
            shapes[f"{prefix}.experts.{e}.gate_proj.weight"] = (inter, hidden)
            shapes[f"{prefix}.experts.{e}.up_proj.weight"] = (inter, hidden)
            shapes[f"{prefix}.experts.{e}.down_proj.weight"] = (hidden, inter)
            if self.linear_biases:
                shapes[f"{prefix}.experts.{e}.gate_proj.bias"] = (inter,)
                shapes[f"{prefix}.experts.{e}.up_proj.bias"] = (inter,)
                shapes[f"{prefix}.experts.{e}.down_proj.bias"] = (hidden,)
        if self.shared_size is not None:
            shared = self.shared_size
            s = prefix if self.shared_is_mlp else f"{prefix}.shared_expert"
            if fused_mlp:
                shapes[f"{s}.gate_up_proj.weight"] = (2 * shared, hidden)
            else:
                shapes[f"{s}.gate_proj.weight"] = (shared, hidden)
                shapes[f"{s}.up_proj.weight"] = (shared, hidden)
            shapes[f"{s}.down_proj.weight"] = (hidden, shared)
        if self.shared_gate:
            shapes[f"{prefix}.shared_expert_gate.weight"] = (1, hidden)
        if self.beside_mlp:  # the router's input scale and each expert's weight scale
            shapes[f"{prefix}.router_scale"] = (hidden,)
            shapes[f"{prefix}.expert_scale"] = (self.num_experts,)
        if self.expert_bias:
            shapes[f"{prefix}.expert_bias"] = (self.num_experts,)
        return shapes


def hf_experts(arch: str, config_json: Mapping[str, Any], num_layers: int) -> ExpertLayers | None:
    """A family's experts from config.json (types checked by `check`); None for a hybrid
    without them (the dense Qwen3.5, LFM2, Granite 4.0-H Micro)."""
    # transformers 5 writes `num_local_experts` where the checkpoints say `num_experts`
    experts = config_json.get("num_experts", config_json.get("num_local_experts"))
    if arch == "qwen3_5":  # Qwen3.5-MoE: every layer routes, with a gated shared expert
        if experts is None:
            return None  # the dense Qwen3.5
        return ExpertLayers(
            layers=tuple(range(num_layers)),
            num_experts=experts,
            experts_per_token=config_json.get("num_experts_per_tok"),  # type: ignore[arg-type]
            intermediate_size=config_json.get("moe_intermediate_size"),  # type: ignore[arg-type]
            normalize=True,  # its router always rescales
            shared_size=config_json.get("shared_expert_intermediate_size"),
            shared_gate=True,
        )
    if arch == "lfm2":  # LFM2-MoE: sigmoid scores, a choosing bias, a dense prefix
        if experts is None:
            return None  # the dense LFM2
        scale = config_json.get("routed_scaling_factor", 1.0)
        return ExpertLayers(
            layers=tuple(range(config_json.get("num_dense_layers", 0), num_layers)),
            num_experts=experts,
            experts_per_token=config_json.get("num_experts_per_tok"),  # type: ignore[arg-type]
            intermediate_size=config_json.get("moe_intermediate_size"),  # type: ignore[arg-type]
            normalize=bool(config_json.get("norm_topk_prob", True)),
            scoring="sigmoid",
            expert_bias=bool(config_json.get("use_expert_bias", True)),
            norm_eps=1e-6,
            routed_scale=float(scale) if isinstance(scale, int | float) else scale,
        )
    if arch == "gpt_oss":  # every layer: top k of biased logits, biased experts, clamped gate
        limit, alpha = config_json.get("swiglu_limit", 7.0), config_json.get("swiglu_alpha", 1.702)
        return ExpertLayers(
            layers=tuple(range(num_layers)),
            num_experts=experts,
            experts_per_token=config_json.get("num_experts_per_tok"),  # type: ignore[arg-type]
            intermediate_size=config_json.get("intermediate_size"),  # type: ignore[arg-type]
            normalize=False,
            scoring="topk_softmax",
            router_bias=True,
            linear_biases=True,
            clamp=float(limit) if isinstance(limit, int | float) else limit,
            alpha=float(alpha) if isinstance(alpha, int | float) else alpha,
        )
    if arch == "granitemoehybrid":  # every layer routes, beside its dense MLP
        experts = config_json.get("num_local_experts", 8)  # transformers' defaults: 8, top 2
        if not experts:
            return None  # Micro: the dense MLP alone
        return ExpertLayers(
            layers=tuple(range(num_layers)),
            num_experts=experts,
            experts_per_token=config_json.get("num_experts_per_tok", 2),
            intermediate_size=config_json.get("intermediate_size"),  # type: ignore[arg-type]
            normalize=False,  # a softmax over the k is its own rescaling
            scoring="topk_softmax",
            shared_size=config_json.get("shared_intermediate_size"),
            shared_is_mlp=True,
        )
    if arch == "gemma4":  # 26B-A4B: every layer, beside its dense MLP
        if not config_json.get("enable_moe_block"):
            return None  # E2B, E4B, 31B
        return ExpertLayers(
            layers=tuple(range(num_layers)),
            num_experts=experts,
            experts_per_token=config_json.get("top_k_experts"),  # type: ignore[arg-type]
            intermediate_size=config_json.get("moe_intermediate_size"),  # type: ignore[arg-type]
            normalize=True,
            beside_mlp=True,
        )
    if arch == "olmoe":  # every layer routes; the experts are `intermediate_size` wide
        layers = tuple(range(num_layers))
        width = config_json.get("intermediate_size")
    else:
        dense = set(config_json.get("mlp_only_layers") or ())
        step = config_json.get("decoder_sparse_step", 1) or 1
        layers = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
        width = config_json.get("moe_intermediate_size")
    return ExpertLayers(
        layers=layers,
        num_experts=experts,
        experts_per_token=config_json.get("num_experts_per_tok"),  # type: ignore[arg-type]
        intermediate_size=width,  # type: ignore[arg-type]
        normalize=bool(config_json.get("norm_topk_prob", False)),
    )


def experts_to_hf(arch: str, experts: ExpertLayers, num_layers: int) -> dict[str, Any]:
    """The expert fields of a transformers 5 config.json."""
    out: dict[str, Any] = {
        "num_experts": experts.num_experts,
        "num_experts_per_tok": experts.experts_per_token,
        "norm_topk_prob": experts.normalize,
        "output_router_logits": False,
    }
    if arch == "qwen3_moe":
        out["moe_intermediate_size"] = experts.intermediate_size
        out["decoder_sparse_step"] = 1
        out["mlp_only_layers"] = [i for i in range(num_layers) if i not in experts.layers]
    if arch == "lfm2":
        out["moe_intermediate_size"] = experts.intermediate_size
        out["num_dense_layers"] = min(experts.layers)
        out["use_expert_bias"] = experts.expert_bias
        out["routed_scaling_factor"] = experts.routed_scale
    if arch == "qwen3_5":
        out["moe_intermediate_size"] = experts.intermediate_size
        out["shared_expert_intermediate_size"] = experts.shared_size
    if arch == "gpt_oss":
        del out["num_experts"]
        out["num_local_experts"] = experts.num_experts
        out["intermediate_size"] = experts.intermediate_size
        out["swiglu_limit"] = experts.clamp
        out["swiglu_alpha"] = experts.alpha
    if arch == "granitemoehybrid":  # the MLP's width is `shared_intermediate_size` already
        del out["num_experts"]
        out["num_local_experts"] = experts.num_experts
        out["intermediate_size"] = experts.intermediate_size
    if arch == "gemma4":
        del out["num_experts_per_tok"]
        out["enable_moe_block"] = True
        out["top_k_experts"] = experts.experts_per_token
        out["moe_intermediate_size"] = experts.intermediate_size
    if arch in ("qwen3_5", "granitemoehybrid", "gpt_oss", "gemma4"):
        del out["norm_topk_prob"]
    return out


# GGUF's stacked expert tensors -> each expert's linear, by Hugging Face part name
GGUF_EXPERT_PARTS = {
    "ffn_gate_up_exps": "gate_up_proj",  # Gemma 4's: each expert's gate rows, then its up rows
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
GGUF_ROUTER = "ffn_gate_inp"
# A shared expert's parts by Hugging Face name (the gate: llama.cpp's `ffn_gate_inp_shexp`)
GGUF_SHARED_PARTS = {
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Whether llama.cpp rescales each family's k weights (its graph fixes it, the file does not say)
GGUF_NORMALIZE = {
    "qwen3_moe": True, "olmoe": False, "qwen3_5": True, "lfm2": True, "gemma4": True,
}  # fmt: skip
# Gemma 4's router input scale and per-expert weight scale, after `blk.N.`
GGUF_GEMMA4_SCALES = {
    "ffn_gate_inp.scale": "mlp.router_scale",
    "ffn_down_exps.scale": "mlp.expert_scale",
}
# Granite's shared expert is its dense MLP (llama.cpp names it `ffn_*_shexp` when experts are
# beside it); it weighs the k by a softmax over them (llama.cpp: softmax, top k, rescaled:
# the same numbers)
GGUF_SHARED_IS_MLP = {"ffn_gate_shexp": "mlp.gate_proj", "ffn_up_shexp": "mlp.up_proj",
                      "ffn_down_shexp": "mlp.down_proj"}  # fmt: skip
GPT_OSS_SWIGLU = (7.0, 1.702)  # gpt-oss's clamp and alpha
GGUF_SIGMOID = 2  # llama.cpp's `expert_gating_func` for sigmoid scores (1: softmax)
GGUF_EXPERT_BIAS = "exp_probs_b.bias"  # the choosing bias, after `blk.N.`


def gguf_experts(
    arch: str, key: Callable[..., Any], num_layers: int, names: frozenset[str]
) -> ExpertLayers | None:
    """A GGUF's experts (`key` reads `{arch}.<name>`; `names`: its tensors), or None when it
    has none."""
    count = key("expert_count", None)
    if not count:
        return None
    width = key("expert_feed_forward_length", None) or key("feed_forward_length")
    shared = key("expert_shared_feed_forward_length", None)
    first = int(key("leading_dense_block_count", 0))
    sigmoid = key("expert_gating_func", 1) == GGUF_SIGMOID
    granite, gpt_oss = arch == "granitemoehybrid", arch == "gpt_oss"
    return ExpertLayers(
        layers=tuple(range(first, num_layers)),
        num_experts=int(count),
        experts_per_token=int(key("expert_used_count")),
        intermediate_size=int(width),
        normalize=not (granite or gpt_oss)
        and bool(key("expert_weights_norm", GGUF_NORMALIZE.get(arch, False))),
        shared_size=int(shared) if shared else None,
        shared_gate=f"blk.{first}.ffn_gate_inp_shexp.weight" in names,
        scoring="sigmoid" if sigmoid else "topk_softmax" if granite or gpt_oss else "softmax",
        expert_bias=f"blk.{first}.{GGUF_EXPERT_BIAS}" in names,
        norm_eps=1e-6 if arch == "lfm2" else 0.0,
        routed_scale=float(key("expert_weights_scale", 1.0)),
        shared_is_mlp=granite,
        router_bias=f"blk.{first}.{GGUF_ROUTER}.bias" in names,
        linear_biases=f"blk.{first}.ffn_gate_exps.bias" in names,
        # llama.cpp's gpt-oss graph fixes these (its swiglu_oai), the file does not hold them
        clamp=GPT_OSS_SWIGLU[0] if gpt_oss else None,
        alpha=GPT_OSS_SWIGLU[1] if gpt_oss else 1.0,
        beside_mlp=arch == "gemma4",
    )

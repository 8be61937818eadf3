"""A mixture of experts in place of a layer's MLP: the router scores the experts, each token's
row runs through the k it chose, and their outputs are summed by the router's weights.

Routing (`route`) is in float32: a softmax (or sigmoid) over the router's logits, the k highest
(ties to the lower expert index, as a stable sort orders them), optionally rescaled to sum to
one; or (Granite) the k highest logits, weighed by a softmax over those k.

Dispatch has two forms, one result. Eagerly (`grouped`), a step sorts its (row, slot) pairs by
expert and runs each chosen expert once on the rows that chose it: at one row, k GEMVs, and only
the chosen experts' weights are read. A recorded step cannot size an expert's batch by how many
rows chose it (a graph's shapes are fixed, and reading the counts is a host sync), so there
(`static`: on CUDA, and under the capture guard) every expert runs on every row and each slot
takes its expert's output by a mask. The linears are row-independent and each slot is a copy of
its expert's row, so both forms give every row the same bits; the k slots are then summed in
rank order, the same adds in both.

Gemma 4 runs its experts beside the dense MLP rather than in its place (`experts_beside_mlp`).

`ExpertUsage` keeps which experts have run since boot: the share of the experts' bytes a
deployment has read, which /health reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from nanoserve.runtime.loading.expert_layers import ExpertLayers
from nanoserve.runtime.model.expert_arena import ExpertArena
from nanoserve.runtime.model.int8_weight import Int8Weight
from nanoserve.runtime.model.quant_weight import QuantLinear
from nanoserve.runtime.model.weight_forms import Linear, describe_types

_STATIC = ContextVar("static_expert_dispatch", default=False)


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """One routed layer's router and experts."""

    router: torch.Tensor  # [experts, hidden]
    gate_up: tuple[Linear, ...]  # per expert: [2 * intermediate, hidden], gate then up
    down: tuple[Linear, ...]  # per expert: [hidden, intermediate]
    # A shared expert every row runs (Qwen3.5-MoE): [2 * shared, hidden], [hidden, shared]
    shared_gate_up: Linear | None = None
    shared_down: Linear | None = None
    shared_gate: torch.Tensor | None = None  # [1, hidden]: its output times sigmoid(h @ this.T)
    # (Granite's shared expert is its dense MLP, run beside the experts on every layer)
    bias: torch.Tensor | None = None  # [experts] float32: added to the scores to choose (LFM2-MoE)
    router_bias: torch.Tensor | None = None  # [experts]: added to the router's logits (gpt-oss)
    gate_up_bias: torch.Tensor | None = None  # [experts, 2 * intermediate] (gpt-oss)
    down_bias: torch.Tensor | None = None  # [experts, hidden] (gpt-oss)
    # Gemma 4's experts block: the router reads RMSNorm(residual) times this [hidden] (its
    # learned scale times hidden^-0.5); the k weights times this [experts] float32, by expert;
    # the norms before the experts, after the dense MLP and after the experts, [hidden] each
    router_scale: torch.Tensor | None = None
    expert_scale: torch.Tensor | None = None
    branch_norms: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


@contextmanager
def static_dispatch() -> Iterator[None]:
    """Within: every routed layer dispatches statically (what a recording needs)."""
    token = _STATIC.set(True)
    try:
        yield
    finally:
        _STATIC.reset(token)


def is_static(device: torch.device) -> bool:
    """Whether a routed layer on `device` dispatches statically here: on CUDA always (a step
    may be captured), elsewhere within `static_dispatch` (a recording, a trace)."""
    return device.type != "cpu" or _STATIC.get()


def route(
    logits: torch.Tensor, experts: ExpertLayers, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's logits [rows, experts] as each row's k weights (float32) and experts
    (int64), [rows, k] each, best first: scored by softmax or sigmoid, chosen by the scores
    plus `bias` (if any), weighted by the scores, rescaled and scaled as configured."""
    logits = logits.float()
    if experts.scoring == "topk_softmax":  # the k highest logits, a softmax over them alone
        _, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        chosen = order[:, : experts.experts_per_token]
        weights = torch.softmax(logits.gather(1, chosen), dim=-1)
    else:
        scores = torch.softmax(logits, dim=-1) if experts.scoring == "softmax" else logits.sigmoid()
        choosing = scores if bias is None else scores + bias
        _, order = torch.sort(choosing, dim=-1, descending=True, stable=True)
        chosen = order[:, : experts.experts_per_token]
        weights = scores.gather(1, chosen)
    if experts.normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + experts.norm_eps)
    if experts.routed_scale != 1.0:
        weights = weights * experts.routed_scale
    return weights, chosen


ExpertFn = Callable[[torch.Tensor, int], torch.Tensor]  # (rows, expert) -> [rows, hidden]


def grouped(h: torch.Tensor, chosen: torch.Tensor, num_experts: int, run: ExpertFn) -> torch.Tensor:
    """Each chosen expert once, on the rows that chose it: [rows, k, hidden] outputs."""
    rows, k = chosen.shape
    flat = chosen.flatten()
    order = torch.argsort(flat, stable=True)  # the (row, slot) pairs, grouped by expert
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    outputs: torch.Tensor | None = None
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        pairs = order[start : start + count]
        start += count
        out = run(h[pairs // k], expert)
        if outputs is None:
            outputs = out.new_empty(rows * k, out.shape[1])
        outputs[pairs] = out
    assert outputs is not None, "a routed layer ran on no rows"
    return outputs.view(rows, k, -1)


def static(h: torch.Tensor, chosen: torch.Tensor, num_experts: int, run: ExpertFn) -> torch.Tensor:
    """Every expert on every row, each slot taking its expert's: [rows, k, hidden] outputs,
    with shapes that do not depend on the routing."""
    outputs: torch.Tensor | None = None
    for expert in range(num_experts):
        out = run(h, expert)[:, None, :]  # [rows, 1, hidden]
        taken = (chosen == expert)[:, :, None]  # [rows, k, 1]
        outputs = torch.where(taken, out, out.new_zeros(()) if outputs is None else outputs)
    assert outputs is not None
    return outputs


def mix_experts(
    h: torch.Tensor,
    weights: ExpertWeights,
    experts: ExpertLayers,
    run: ExpertFn,
    router_logits: torch.Tensor,
) -> torch.Tensor:
    """The routed MLP's output [rows, hidden]: each row's k experts' outputs times their
    weights, summed in rank order."""
    mix, chosen = route(router_logits, experts, weights.bias)
    if weights.expert_scale is not None:  # Gemma 4: each chosen expert's own scale
        mix = mix * weights.expert_scale[chosen]
    dispatch = static if is_static(h.device) else grouped
    outputs = dispatch(h, chosen, experts.num_experts, run)  # [rows, k, hidden]
    mix = mix.to(outputs.dtype)
    total = outputs[:, 0] * mix[:, :1]
    for slot in range(1, experts.experts_per_token):
        total = total + outputs[:, slot] * mix[:, slot : slot + 1]
    return total


def clamped_swiglu(gate_up: torch.Tensor, clamp: float, alpha: float) -> torch.Tensor:
    """gpt-oss's gate, [rows, 2h] -> [rows, h] in float32: gate clamped to <= clamp, up to
    [-clamp, clamp], then (up + 1) * gate * sigmoid(alpha * gate)."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    gate = gate.clamp(max=clamp)
    up = up.clamp(min=-clamp, max=clamp)
    return ((up + 1) * (gate * torch.sigmoid(gate * alpha))).to(gate_up.dtype)


def routed_mlp(
    h: torch.Tensor,
    weights: ExpertWeights,
    experts: ExpertLayers,
    linear: Callable[..., torch.Tensor],
    gated_act: Callable[[torch.Tensor], torch.Tensor],
    ran: Callable[[int], None],
    router_input: torch.Tensor | None = None,
) -> torch.Tensor:
    """A routed layer's output [rows, hidden]: the router (on `router_input`, else `h`), the
    mixture of the chosen experts (`ran` told of each expert run), and a shared expert where
    there is one (Qwen3.5-MoE's, times the sigmoid of its gate). `linear(x, w, bias=None)` and
    `gated_act` are the model's own; gpt-oss's experts add their biases and gate by
    `clamped_swiglu`."""
    clamp = experts.clamp
    act = gated_act if clamp is None else lambda x: clamped_swiglu(x, clamp, experts.alpha)
    up_bias, down_bias = weights.gate_up_bias, weights.down_bias

    def run(rows: torch.Tensor, expert: int) -> torch.Tensor:
        ran(expert)
        gate_up = linear(
            rows, weights.gate_up[expert], None if up_bias is None else up_bias[expert]
        )
        down = None if down_bias is None else down_bias[expert]
        return linear(act(gate_up), weights.down[expert], down)

    routed = h if router_input is None else router_input
    logits = linear(routed.to(weights.router.dtype), weights.router, weights.router_bias)
    mixed = mix_experts(h, weights, experts, run, logits)
    if weights.shared_gate_up is None or weights.shared_down is None:
        return mixed
    shared = linear(gated_act(linear(h, weights.shared_gate_up)), weights.shared_down)
    if weights.shared_gate is not None:
        gate = linear(h.to(weights.shared_gate.dtype), weights.shared_gate)
        shared = shared * gate.sigmoid().to(shared.dtype)
    return mixed + shared


def experts_beside_mlp(
    x: torch.Tensor,
    mlp_out: torch.Tensor,
    weights: ExpertWeights,
    experts: ExpertLayers,
    linear: Callable[..., torch.Tensor],
    gated_act: Callable[[torch.Tensor], torch.Tensor],
    ran: Callable[[int], None],
    rms_norm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Gemma 4's feed-forward output [rows, hidden] (before the layer's last norm): the dense
    MLP's output normed, plus the experts' normed, the experts and the router both reading the
    residual `x` (each through its own norm)."""
    assert weights.branch_norms is not None and weights.router_scale is not None
    before, after_mlp, after_experts = weights.branch_norms
    router_input = rms_norm(x, weights.router_scale)
    routed = routed_mlp(rms_norm(x, before), weights, experts, linear, gated_act, ran, router_input)
    return rms_norm(mlp_out, after_mlp) + rms_norm(routed, after_experts)


def linear_bytes(w: Linear) -> int:
    """The bytes a linear's weights hold as served."""
    if isinstance(w, QuantLinear):
        return sum(p.packed.numel() for p in w.parts)
    if isinstance(w, Int8Weight):
        return w.q.numel() + w.scale.numel() * w.scale.element_size()
    return w.numel() * w.element_size()


class ExpertUsage:
    """Which experts have run since boot, per routed layer (a flag each: the step thread sets
    them while /health reads, and a flag never resizes)."""

    def __init__(
        self,
        layers: Sequence[ExpertWeights],
        experts: ExpertLayers,
        arena: ExpertArena | None = None,
    ) -> None:
        self.experts = experts
        # The file the experts are mapped from (expert_arena.py), or None: packed into memory.
        self.arena = arena
        self.sizes = [
            [linear_bytes(g) + linear_bytes(d) for g, d in zip(w.gate_up, w.down, strict=True)]
            for w in layers
        ]
        self.flags = [bytearray(len(sizes)) for sizes in self.sizes]
        parts = [p for w in layers for lin in (*w.gate_up, *w.down) if isinstance(lin, QuantLinear)
                 for p in lin.parts]  # fmt: skip
        self.types = describe_types(parts) if parts else None

    def ran(self, layer: int, expert: int) -> None:
        self.flags[layer][expert] = 1

    @property
    def total_bytes(self) -> int:
        return sum(sum(sizes) for sizes in self.sizes)

    def touched_share(self) -> float:
        """The share of the experts' bytes that have run at least once, 0..1."""
        touched = sum(
            size
            for sizes, flags in zip(self.sizes, self.flags, strict=True)
            for size, flag in zip(sizes, bytes(flags), strict=True)
            if flag
        )
        return touched / self.total_bytes if self.total_bytes else 0.0

    def as_dict(self) -> dict[str, object]:
        """/health's `experts`: the counts, the types served, the bytes and the share read."""
        return {
            "experts": self.experts.num_experts,
            "per_token": self.experts.experts_per_token,
            "routed_layers": len(self.sizes),
            "types": self.types,
            "bytes": self.total_bytes,
            "touched_share": round(self.touched_share(), 4),
            # mapped from this file (its pages the OS's), or null: packed into memory
            "mapped_from": str(self.arena.path) if self.arena is not None else None,
            "reused": self.arena.reused if self.arena is not None else None,
        }

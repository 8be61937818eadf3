"""experts.py: routing against a float64 reference on hand-set router logits with ties, and the
two dispatches (grouped by expert eagerly, every expert under a mask when recorded) giving each
row the same bits, the eager one running only the chosen experts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.runtime.decode.capture_guard import CaptureSafetyError, capture_guard
from nanoserve.runtime.loading.expert_layers import ExpertLayers
from nanoserve.runtime.model.experts import grouped, is_static, route, static, static_dispatch


def experts_of(num: int = 4, k: int = 2, normalize: bool = False) -> ExpertLayers:
    return ExpertLayers(
        layers=(0,), num_experts=num, experts_per_token=k, intermediate_size=8, normalize=normalize
    )


def reference_route(logits: torch.Tensor, k: int, normalize: bool) -> list[list[tuple[int, float]]]:
    """float64, row by row: the k largest softmax probabilities, ties to the lower index."""
    out = []
    for row in logits.double():
        probs = torch.softmax(row, dim=0).tolist()
        ranked = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:k]
        total = sum(probs[e] for e in ranked) if normalize else 1.0
        out.append([(e, probs[e] / total) for e in ranked])
    return out


LOGITS = torch.tensor(
    [
        [1.0, 1.0, 1.0, 1.0],  # all tied: experts 0 and 1
        [0.0, 2.0, 2.0, -1.0],  # a tie for first: 1, then 2
        [3.0, -1.0, 0.5, 0.5],  # a tie for second: 0, then 2
        [-5.0, 4.0, -5.0, 4.5],  # clear: 3, then 1
    ]
)


@pytest.mark.parametrize("normalize", [False, True])
def test_routing_matches_float64_with_ties_to_the_lower_expert(normalize: bool) -> None:
    weights, chosen = route(LOGITS, experts_of(normalize=normalize))
    expected = reference_route(LOGITS, 2, normalize)
    assert chosen.tolist() == [[0, 1], [1, 2], [0, 2], [3, 1]]
    assert chosen.tolist() == [[e for e, _ in row] for row in expected]
    want = torch.tensor([[w for _, w in row] for row in expected], dtype=torch.float64)
    assert torch.allclose(weights.double(), want, rtol=2e-7, atol=0)
    assert weights.dtype == torch.float32
    if normalize:
        assert weights[0].tolist() == [0.5, 0.5]
    else:
        assert weights[0].tolist() == [0.25, 0.25]


@given(
    rows=st.integers(1, 9),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    ties=st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_grouped_and_static_give_every_row_the_same_bits(
    rows: int, k: int, seed: int, ties: bool
) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, 5, generator=generator)
    if ties:
        logits = logits.round()  # whole numbers: many ties
    _, chosen = route(logits, experts_of(num=5, k=k))
    h = torch.randn(rows, 6, generator=generator)
    mats = torch.randn(5, 6, 6, generator=generator)

    def run(x: torch.Tensor, expert: int) -> torch.Tensor:
        return x @ mats[expert] + expert  # row-independent, and each expert distinct

    eager, recorded = grouped(h, chosen, 5, run), static(h, chosen, 5, run)
    assert torch.equal(eager, recorded)
    for r in range(rows):  # each slot is its expert's output of its row alone
        for slot in range(k):
            assert torch.equal(eager[r, slot], run(h[r : r + 1], int(chosen[r, slot]))[0])


def test_eager_dispatch_runs_only_the_chosen_experts_once_each() -> None:
    chosen = torch.tensor([[2, 0], [2, 3], [0, 2]])
    calls: list[tuple[int, int]] = []

    def run(x: torch.Tensor, expert: int) -> torch.Tensor:
        calls.append((expert, x.shape[0]))
        return x * expert

    grouped(torch.ones(3, 4), chosen, 6, run)
    assert calls == [(0, 2), (2, 3), (3, 1)]  # experts 1, 4 and 5 untouched


def test_a_recording_dispatches_statically_and_stays_on_its_device() -> None:
    """Under the capture guard the dispatch sizes nothing by the routing: eager grouping there
    is refused (its counts' shape is the routing's), the static form passes."""
    assert not is_static(torch.device("cpu"))
    with static_dispatch():
        assert is_static(torch.device("cpu"))
    assert is_static(torch.device("cuda"))
    h = torch.randn(3, 4)
    chosen = torch.tensor([[2, 0], [2, 3], [0, 2]])

    def run(x: torch.Tensor, expert: int) -> torch.Tensor:
        return x * (expert + 1)

    with capture_guard("cpu"):
        assert is_static(h.device)
        out = static(h, chosen, 4, run)
    assert torch.equal(out, grouped(h, chosen, 4, run))
    with pytest.raises(CaptureSafetyError, match="bincount"), capture_guard("cpu"):
        grouped(h, chosen, 4, run)


def test_sigmoid_routing_chooses_with_the_bias_and_weighs_without_it() -> None:
    """LFM2-MoE's: each expert's sigmoid, the k chosen by score plus bias (ties to the lower
    index), weighted by their unbiased scores over their sum plus 1e-6, times the scale."""
    experts = ExpertLayers(
        layers=(0,),
        num_experts=4,
        experts_per_token=2,
        intermediate_size=8,
        normalize=True,
        scoring="sigmoid",
        expert_bias=True,
        norm_eps=1e-6,
        routed_scale=2.5,
    )
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    bias = torch.tensor([-10.0, 0.0, 0.0, 1.0])  # expert 0 never chosen, expert 3 favoured
    weights, chosen = route(logits, experts, bias)
    assert chosen.tolist() == [[3, 1], [3, 1]]  # row 1: experts 1 and 2 tie after 3
    for row in range(2):
        scores = torch.sigmoid(logits[row].double())
        picked = scores[chosen[row]]
        want = picked / (picked.sum() + 1e-6) * 2.5
        assert torch.allclose(weights[row].double(), want, rtol=2e-7, atol=0)


def test_topk_softmax_routing_weighs_the_chosen_by_a_softmax_over_them() -> None:
    """Granite's (and gpt-oss's): the k highest logits (ties to the lower index), weighed by a
    softmax over those k alone, against float64."""
    experts = ExpertLayers(
        layers=(0,),
        num_experts=4,
        experts_per_token=2,
        intermediate_size=8,
        normalize=False,
        scoring="topk_softmax",
    )
    weights, chosen = route(LOGITS, experts)
    assert chosen.tolist() == [[0, 1], [1, 2], [0, 2], [3, 1]]
    for row in range(len(LOGITS)):
        want = torch.softmax(LOGITS[row].double()[chosen[row]], dim=0)
        assert torch.allclose(weights[row].double(), want, rtol=2e-7, atol=0)
    assert weights[0].tolist() == [0.5, 0.5]
    # the same numbers as a softmax over all, the k rescaled (llama.cpp's form), to rounding
    rescaled, again = route(LOGITS, experts_of(normalize=True))
    assert torch.equal(again, chosen)
    assert torch.allclose(weights, rescaled, rtol=1e-6, atol=0)


def test_gemma4_experts_beside_the_mlp_match_float64() -> None:
    """Gemma 4's block against float64, written out: the router on the residual RMS-normed
    (no weight) times its scale and hidden^-0.5, softmax, top 2 (experts 1 and 2 tie on every
    row: their router rows are equal, so 1 ranks first), rescaled, times each expert's scale;
    the experts (GeGLU) on the residual through their own norm; the dense MLP's output and the
    experts' normed apart, then summed."""
    import torch.nn.functional as F

    from nanoserve.runtime.model.experts import ExpertWeights, experts_beside_mlp

    g = torch.Generator().manual_seed(0)
    hidden, num, inter, eps = 8, 4, 4, 1e-6

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    router = rand(num, hidden)
    router[2] = router[1]
    gate_up, down = (
        [rand(2 * inter, hidden) for _ in range(num)],
        [rand(hidden, inter) for _ in range(num)],
    )
    scale, expert_scale = rand(hidden), torch.tensor([0.5, 2.0, -1.0, 1.5])
    norms = (rand(hidden).abs() + 0.5, rand(hidden).abs() + 0.5, rand(hidden).abs() + 0.5)
    x, mlp_out = rand(5, hidden), rand(5, hidden)
    weights = ExpertWeights(
        router=router, gate_up=tuple(gate_up), down=tuple(down),
        router_scale=scale * hidden**-0.5, expert_scale=expert_scale, branch_norms=norms,
    )  # fmt: skip
    experts = ExpertLayers(
        layers=(0,), num_experts=num, experts_per_token=2, intermediate_size=inter,
        normalize=True, beside_mlp=True,
    )  # fmt: skip

    def rms(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w

    def geglu(h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    ran: list[int] = []
    got = experts_beside_mlp(
        x, mlp_out, weights, experts, lambda v, w, b=None: F.linear(v, w, b), geglu, ran.append, rms
    )
    d = torch.float64
    x64, pre, post1, post2 = x.to(d), *(n.to(d) for n in norms)
    logits = rms(x64, torch.ones(hidden, dtype=d)) * scale.to(d) * hidden**-0.5 @ router.to(d).T
    want = rms(mlp_out.to(d), post1)
    for row in range(len(x)):
        probs = torch.softmax(logits[row], 0).tolist()
        assert probs[1] == probs[2]  # the tie
        top = sorted(range(num), key=lambda e: (-probs[e], e))[:2]
        total = sum(probs[e] for e in top)
        h = rms(x64[row], pre)
        routed = sum(
            probs[e] / total * float(expert_scale[e])
            * (down[e].to(d) @ geglu(gate_up[e].to(d) @ h))
            for e in top
        )  # fmt: skip
        want[row] += rms(routed, post2)
    assert torch.allclose(got.to(d), want, rtol=1e-5, atol=1e-5)
    assert set(ran) <= set(range(num)) and ran

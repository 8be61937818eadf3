"""The roofline's bytes (benchmarks/roofline.py): what a decode step reads, from a GGUF's
tensor table, written out by hand for a tiny Llama and checked on a tiny Phi-3's fused qkv."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.roofline import StepBytes, step_bytes
from benchmarks.shape_gguf import write
from benchmarks.shapes import LLAMA_3_2_3B, PHI_4_MINI
from tests.benchmarks.test_shapes import tiny

Q4_K, Q6_K = 144 / 256, 210 / 256  # bytes a value
H, Q, KV, FFN, VOCAB = 256, 256, 128, 512, 512


def layer_bytes(wide: float) -> int:
    """One tiny layer: two F32 norms, gate/up Q4_K, down and v in `wide`, q/k/o Q4_K."""
    norms = 2 * H * 4
    mlp = 2 * FFN * H * Q4_K + H * FFN * wide
    attention = (Q * H + KV * H + H * Q) * Q4_K + KV * H * wide
    return int(norms + mlp + attention)


def test_a_tied_llama_reads_every_weight_and_its_whole_embedding(tmp_path: Path) -> None:
    step = step_bytes(write(tiny(LLAMA_3_2_3B), tmp_path / "llama.gguf"))
    embedding = int(VOCAB * H * Q6_K)  # tied: the output projection reads all of it
    # layer 0 of 2 gets Q4_K for v and down, layer 1 (the last eighth) Q6_K
    weights = embedding + H * 4 + 64 * 4 + layer_bytes(Q4_K) + layer_bytes(Q6_K)
    assert step == StepBytes(
        shared=weights,
        per_row=0,
        experts=0,
        expert_count=0,
        experts_used=0,
        kv_per_position=2 * 2 * (KV + KV),  # 2 layers, 2 bytes, K and V
    )
    assert step.at(rows=3, context=10) == weights + 3 * 10 * 1024


def test_a_fused_qkv_counts_k_and_v_without_q(tmp_path: Path) -> None:
    step = step_bytes(write(tiny(PHI_4_MINI), tmp_path / "phi.gguf"))
    assert step.kv_per_position == 2 * 2 * (KV + KV)


def test_experts_are_read_in_expectation() -> None:
    step = StepBytes(shared=1000, per_row=10, experts=6400, expert_count=4, experts_used=2,
                     kv_per_position=1)  # fmt: skip
    assert step.at(rows=1, context=0) == 1000 + 10 + 3200  # half the experts
    assert step.at(rows=2, context=5) == 1000 + 2 * 15 + 4800  # 1 - 1/4 of them
    assert step.limit(bandwidth_gbs=1.0, rows=1, context=0) == pytest.approx(1e9 / 4210)


@given(
    rows=st.integers(1, 64),
    context=st.integers(0, 4096),
    experts=st.sampled_from([(0, 0), (8, 2), (64, 8), (32, 32)]),
)
def test_more_rows_or_context_never_read_less(
    rows: int, context: int, experts: tuple[int, int]
) -> None:
    step = StepBytes(3000, 7, 64000 if experts[0] else 0, *experts, kv_per_position=11)
    assert step.at(rows + 1, context) >= step.at(rows, context)
    assert step.at(rows, context + 1) > step.at(rows, context)
    assert step.at(rows, context) <= step.shared + step.experts + rows * (7 + 11 * context)

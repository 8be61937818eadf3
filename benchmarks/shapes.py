"""The shapes of models no GGUF of which can be fetched here, as their config.json states them.

benchmarks/shape_gguf.py writes each as a GGUF with random weights in llama.cpp's names:

- `lfm2-1.2b-shape`: LFM2-1.2B (hidden 2048, 16 layers of which 6 attend (32 heads, 8 K/V
  heads), the rest gated short convolutions of 3 taps; MLP 8192; vocabulary 65,536; tied);
- `qwen3.5-0.8b-shape`: Qwen3.5-0.8B's text model (hidden 1024, 24 layers, every fourth
  attending with an output gate (8 heads of 256, 2 K/V heads, rotary on 64 dims), the rest
  gated DeltaNet with 16 key and 16 value heads of 128 and 4 taps; MLP 3584; vocabulary
  248,320; tied);
- `olmoe-1b-7b-shape`: OLMoE-1B-7B (hidden 2048, 16 layers of 16 heads of 128, q and k normed
  whole; 64 experts of 1024 a layer, 8 a token, the router F32 as llama.cpp keeps it, the
  experts stacked as `ffn_*_exps` in the same Q4_K/Q6_K mix; vocabulary 50,304; untied);
- `gpt-oss-20b-shape`: gpt-oss-20b in the types of ggml-org's MXFP4 GGUF, not a Q4_K_M mix
  (hidden 2880, 24 layers of 64 heads of 64 and 8 K/V heads, sliding (128) and full layers
  alternating, sinks and biases; 32 experts of 2880 a layer, 4 a token, MXFP4 with F32 biases;
  attention, embedding and output Q8_0; YaRN x32 over 4,096; vocabulary 201,088; untied);
- `llama-3.2-3b-shape`: Llama-3.2-3B (hidden 3072, 28 layers of 24 heads of 128 and 8 K/V
  heads; MLP 8192; Llama 3's rotary factors as a `rope_freqs` tensor; vocabulary 128,256; tied);
- `qwen2.5-3b-shape`: Qwen2.5-3B (hidden 2048, 36 layers of 16 heads of 128 and 2 K/V heads,
  q/k/v biases; MLP 11,008; vocabulary 151,936; tied);
- `phi-4-mini-shape`: Phi-4-mini (3.8B: hidden 3072, 32 layers of 24 heads of 128 and 8 K/V
  heads, q, k and v fused in `attn_qkv` (Q5_K, as llama.cpp's Q4_K_M gives a fused qkv), gate
  and up fused in `ffn_up`; rotary on 96 of 128 dims with longrope's factor tensors; MLP 8192;
  vocabulary 200,064; tied).

The rotary factor tensors are 1 (no rescaling): the shapes, not the values, set a step's cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Shape:
    """A model's geometry and how its GGUF states it."""

    name: str
    arch: str  # llama.cpp's architecture name
    vocab: int
    hidden: int
    layers: int
    attention: tuple[int, ...]  # the layers that attend
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float
    eps: float
    metadata: dict[str, object] = field(default_factory=dict)  # "<arch>.<key>" -> value


LFM2_1_2B = Shape(
    name="lfm2-1.2b-shape",
    arch="lfm2",
    vocab=65536,
    hidden=2048,
    layers=16,
    attention=(2, 5, 8, 10, 12, 14),
    heads=32,
    kv_heads=8,
    head_dim=64,
    ffn=8192,
    rope_theta=1_000_000.0,
    eps=1e-5,
    metadata={"shortconv.l_cache": 3},
)
QWEN3_5_0_8B = Shape(
    name="qwen3.5-0.8b-shape",
    arch="qwen35",
    vocab=248320,
    hidden=1024,
    layers=24,
    attention=tuple(range(3, 24, 4)),
    heads=8,
    kv_heads=2,
    head_dim=256,
    ffn=3584,
    rope_theta=10_000_000.0,
    eps=1e-6,
    metadata={
        "ssm.conv_kernel": 4,
        "ssm.state_size": 128,
        "ssm.group_count": 16,
        "ssm.time_step_rank": 16,
        "ssm.inner_size": 2048,
        "full_attention_interval": 4,
        "rope.dimension_count": 64,
        "rope.dimension_sections": [11, 11, 10, 0],
    },
)
OLMOE_1B_7B = Shape(
    name="olmoe-1b-7b-shape",
    arch="olmoe",
    vocab=50304,
    hidden=2048,
    layers=16,
    attention=tuple(range(16)),
    heads=16,
    kv_heads=16,
    head_dim=128,
    ffn=1024,  # each expert's width (OLMoE has no dense MLP)
    rope_theta=10000.0,
    eps=1e-5,
    metadata={"expert_count": 64, "expert_used_count": 8},
)
GPT_OSS_20B = Shape(
    name="gpt-oss-20b-shape",
    arch="gpt-oss",
    vocab=201088,
    hidden=2880,
    layers=24,
    attention=tuple(range(24)),
    heads=64,
    kv_heads=8,
    head_dim=64,
    ffn=2880,  # each expert's width (no dense MLP)
    rope_theta=150000.0,
    eps=1e-5,
    metadata={
        "expert_count": 32,
        "expert_used_count": 4,
        "expert_feed_forward_length": 2880,
        "attention.sliding_window": 128,
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 32.0,
        "rope.scaling.original_context_length": 4096,
    },
)
# Dense 3-4B files people chat with (issue 47's set), each tied to its embedding (Q6_K)
LLAMA_3_2_3B = Shape(
    name="llama-3.2-3b-shape",
    arch="llama",
    vocab=128256,
    hidden=3072,
    layers=28,
    attention=tuple(range(28)),
    heads=24,
    kv_heads=8,
    head_dim=128,
    ffn=8192,
    rope_theta=500_000.0,
    eps=1e-5,
    metadata={"rope.dimension_count": 128},
)
QWEN2_5_3B = Shape(
    name="qwen2.5-3b-shape",
    arch="qwen2",
    vocab=151936,
    hidden=2048,
    layers=36,
    attention=tuple(range(36)),
    heads=16,
    kv_heads=2,
    head_dim=128,
    ffn=11008,
    rope_theta=1_000_000.0,
    eps=1e-6,
)
PHI_4_MINI = Shape(
    name="phi-4-mini-shape",
    arch="phi3",
    vocab=200064,
    hidden=3072,
    layers=32,
    attention=tuple(range(32)),
    heads=24,
    kv_heads=8,
    head_dim=128,
    ffn=8192,
    rope_theta=10_000.0,
    eps=1e-5,
    metadata={
        "rope.dimension_count": 96,  # partial rotary: 0.75 of each head
        "rope.scaling.attn_factor": 1.1902380714238083,
        "rope.scaling.original_context_length": 4096,
    },
)
SHAPES = {
    shape.name: shape
    for shape in (
        LFM2_1_2B,
        QWEN3_5_0_8B,
        OLMOE_1B_7B,
        GPT_OSS_20B,
        LLAMA_3_2_3B,
        QWEN2_5_3B,
        PHI_4_MINI,
    )
}
# The block types each shape's file is written in, as its usual download has them.
MIX = {"gpt-oss-20b-shape": "mxfp4"}

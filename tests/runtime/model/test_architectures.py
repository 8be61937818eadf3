"""The newer families as deltas on one forward (Qwen3's q/k norms, Gemma 3's sandwich norms,
GeGLU, scaled embedding and sliding-window layers with their own rotary base, SmolLM3's layers
without rotary; the hybrids LFM2, Qwen3.5 and Granite 4.0-H with their recurrent state; the
mixtures of experts Qwen3-MoE and OLMoE, routed eagerly by expert and statically when recorded): each
against transformers' own class, from a Hugging Face directory and from the GGUF llama.cpp's
converter would write; then through the engine, alone and batched,
eager, bucketed and recorded, on torch and on nanoserve's kernels. The tiny Gemma slides over
4 tokens, so every prompt and generation here crosses its window."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.core import Shape
from nanoserve.runtime.decode.capture_trace import trace_recorded_steps
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel
from tests.runtime.capture_helpers import PROMPTS, run_joining_workload
from tests.runtime.paged_logits import paged_logits, rel_error

ARCHS = [
    "qwen3",
    "gemma3",
    "smollm3",
    "phi3",
    "lfm2",
    "qwen3_5",
    "granitemoehybrid",
    "qwen3_moe",
    "olmoe",
    "qwen3_5_moe",
    "lfm2_moe",
    "granite_moe",
    "gpt_oss",
    "gemma4",
    "gemma4_moe",
]
# Granite's Mamba2 state sums dt * x * B^T over the prompt, and the random tiny model's large dt
# carries the int8 activations' rounding along: measured 0.02 at its first token, 0.05-0.23 later
# (0.13 over the prompt), every argmax equal. Qwen3-MoE's tiny router has two experts 0.01
# apart at one position of its first layer, and the int8 activations choose the other: 0.71 at
# that position, under 0.1 from the eighth on (0.45 over the prompt, 19 of 22 argmax equal);
# Qwen3.5-MoE's, over four layers, measured 0.16 the same way; Granite's with experts 0.21
# (Mamba2's carried rounding, and routing: 0.03-0.33 by position, 19 of 22 argmax equal).
# gpt-oss's, four layers of clamped gates (activations up to 56 into an int8 row): 0.05 after
# its first layer (Qwen3-MoE's: 0.04), 0.15 after four on an F32 file, 0.24 on this Q8_0 one
# (19 of 22 argmax equal). Every other family stays under 0.1.
ACTIVATION_GAP = {
    "granitemoehybrid": 0.2,
    "qwen3_moe": 0.5,
    "qwen3_5_moe": 0.25,
    "granite_moe": 0.3,
    "gpt_oss": 0.3,
}
PROMPT = [5, 17, 3, 99, 250, 31, 7, 7, 7, 120, 64, 8, 200, 2, 11, 13, 17, 19, 23, 29, 31, 37]


@pytest.fixture(scope="module", params=ARCHS)
def arch_dir(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    make_tiny_model_dir: Callable[..., Path],
) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param)


@pytest.fixture(scope="module")
def reference_logits(arch_dir: Path) -> torch.Tensor:
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(arch_dir).eval()
    with torch.no_grad():
        return reference(torch.tensor([PROMPT])).logits[0]  # [tokens, vocab]


def model_of(checkpoint: Checkpoint, quantize: str | None = None) -> LlamaModel:
    blocks = quantize is not None and checkpoint.format == "gguf"
    tensors = checkpoint.sources(frozenset({"Q8_0"})) if blocks else checkpoint.tensors()
    return LlamaModel.from_tensors(checkpoint.config, tensors, max_positions=256, quantize=quantize)


def test_gguf_logits_match_transformers(
    arch_dir: Path,
    reference_logits: torch.Tensor,
    tmp_path: Path,
    write_tiny_gguf: Callable[..., Path],
) -> None:
    """Names, norms (Gemma's stored 1 + w), rotary bases, windows and rotary-free layers all as
    llama.cpp's files say them: the F32 GGUF gives transformers' logits."""
    checkpoint = load_checkpoint(write_tiny_gguf(arch_dir, tmp_path / "tiny.gguf"))
    hf = load_checkpoint(arch_dir).config
    assert checkpoint.config.architecture == hf.architecture
    assert checkpoint.config.sliding_layers == hf.sliding_layers
    assert checkpoint.config.no_rope_layers == hf.no_rope_layers
    assert checkpoint.config.norm_offset == 0.0  # the converter stored 1 + w
    assert rel_error(paged_logits(model_of(checkpoint), PROMPT), reference_logits) < 1e-5


def test_a_converted_gguf_is_the_model_transformers_reads(
    arch_dir: Path,
    reference_logits: torch.Tensor,
    tmp_path: Path,
    write_tiny_gguf: Callable[..., Path],
) -> None:
    """`nanoserve convert` of each: transformers loads the directory and gives the logits."""
    import transformers

    from nanoserve.runtime.loading.convert import convert_gguf

    out = convert_gguf(write_tiny_gguf(arch_dir, tmp_path / "tiny.gguf"), tmp_path / "hf")
    converted = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        logits = converted(torch.tensor([PROMPT])).logits[0]
    assert rel_error(logits, reference_logits) < 1e-5


def test_kernels_agree_with_torch_on_the_same_blocks(
    arch_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    """nanoserve's kernels (q/k norms, GeGLU, windows and the identity rotary among them) on a
    Q8_0 file against torch's ops on the same blocks dequantized: apart by the kernels' int8
    activations only (the tiny Llama's own gap is 0.06 here; a layer turned by rotary that
    should not be, or a window dropped, is 0.3 and more)."""
    from gguf import GGMLQuantizationType

    path = write_tiny_gguf(arch_dir, tmp_path / "q8.gguf", qtype=GGMLQuantizationType.Q8_0)
    torch_ops = paged_logits(model_of(load_checkpoint(path)), PROMPT)
    kernels = paged_logits(model_of(load_checkpoint(path), quantize="gguf"), PROMPT)
    assert rel_error(kernels, torch_ops) < ACTIVATION_GAP.get(arch_dir.name.split("-")[0], 0.1)
    assert (kernels.argmax(-1) == torch_ops.argmax(-1)).float().mean() >= 0.85


def tiny_engine(model_dir: Path, quantize: str | None, **config: Any) -> Engine:
    checkpoint = load_checkpoint(model_dir)
    defaults: dict[str, Any] = {
        "max_model_len": 256,
        "max_batch": 8,
        "width_multiple": 8,
        "block_size": 4,
        "kv_budget_bytes": 1 << 22,
        "quantize": quantize,
    }
    model = LlamaModel.from_tensors(
        checkpoint.config, checkpoint.tensors(), max_positions=256, quantize=quantize
    )
    return Engine.from_config(model, checkpoint.tokenizer, EngineConfig(**{**defaults, **config}))


def alone(model_dir: Path, quantize: str | None) -> dict[str, list[int]]:
    """Each request of the joining workload run by itself."""
    tokens = {}
    for i, prompt in enumerate(PROMPTS):
        engine = tiny_engine(model_dir, quantize)
        engine.add_request(
            "only",
            prompt,
            SamplingParams(max_tokens=6 + 9 * i if i < 3 else 20, temperature=0, ignore_eos=True),
        )
        tokens[f"r{i}"] = [t for d in engine.run_until_done() for t in d.token_ids]
    return tokens


@pytest.mark.parametrize("quantize", [None, "q8"])
def test_alone_batched_eager_bucketed_and_recorded_agree(
    arch_dir: Path, quantize: str | None
) -> None:
    """Requests join and leave mid-run while generations cross the window: a row's tokens are
    the same alone and batched, in every decode mode."""
    eager = run_joining_workload(tiny_engine(arch_dir, quantize))
    assert sum(len(t) for t in eager.values()) == 6 + 15 + 24 + 20 + 20
    for mode in ("bucketed", "recorded"):
        recorded = run_joining_workload(tiny_engine(arch_dir, quantize, decode_mode=mode))
        assert recorded == eager
    assert alone(arch_dir, quantize) == eager


def test_the_warm_list_traces_clean_as_cuda(arch_dir: Path) -> None:
    """Mixed layers (windows, two rotary bases, rotary-free layers, head norms, a hybrid's
    state reads and writes) bring no host tensor and no value-dependent shape into the
    recorded step."""
    config = load_checkpoint(arch_dir).config
    shapes = (Shape(1, 8), Shape(4, 64), Shape(8, 128))
    trace = trace_recorded_steps(config, shapes, max_batch=8, max_model_len=256)
    assert trace.shapes == shapes


def test_a_llama3_gguf_with_rope_freqs_matches_transformers(
    tmp_path: Path,
    make_tiny_model_dir: Callable[..., Path],
    write_tiny_gguf: Callable[..., Path],
) -> None:
    """Llama 3.2's shape: tied, Llama-3 rope scaling, which llama.cpp's converter stores as
    one factor per frequency (`rope_freqs.weight`) rather than as the blend's parameters."""
    import transformers

    from nanoserve.runtime.loading.rope import FreqFactors

    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    model_dir = make_tiny_model_dir(tmp_path, arch="llama", rope_parameters=rope)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    checkpoint = load_checkpoint(write_tiny_gguf(model_dir, tmp_path / "llama3.gguf"))
    factors = checkpoint.config.rope_scaling
    assert isinstance(factors, FreqFactors) and len(set(factors.factors)) > 2  # all 3 bands
    assert rel_error(paged_logits(model_of(checkpoint), PROMPT), expected) < 1e-5


def test_a_phi3_longrope_gguf_matches_transformers(
    tmp_path: Path,
    make_tiny_model_dir: Callable[..., Path],
    write_tiny_gguf: Callable[..., Path],
) -> None:
    """Phi-3's longrope as llama.cpp stores it: both divisor sets as tensors, the attention
    factor and the pretraining context in the metadata (short divisors: the context served is
    within the pretraining one)."""
    import transformers

    from nanoserve.runtime.loading.rope import LongRope

    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0, 1.1, 1.3, 1.7, 2.0, 2.5, 3.0, 4.0],
        "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 16.0, 32.0, 32.0],
    }
    model_dir = make_tiny_model_dir(
        tmp_path,
        arch="phi3",
        tie=False,
        rope_parameters=rope,
        max_position_embeddings=8192,
        original_max_position_embeddings=4096,
        partial_rotary_factor=1.0,
    )
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    checkpoint = load_checkpoint(write_tiny_gguf(model_dir, tmp_path / "phi3.gguf"))
    scaling = checkpoint.config.rope_scaling
    assert isinstance(scaling, LongRope) and scaling.attention_factor > 1.0
    hf_scaling = load_checkpoint(model_dir).config.rope_scaling
    assert isinstance(hf_scaling, LongRope)
    assert scaling.short_factor == pytest.approx(hf_scaling.short_factor, rel=1e-7)  # float32
    assert scaling.attention_factor == pytest.approx(hf_scaling.attention_factor)
    assert rel_error(paged_logits(model_of(checkpoint), PROMPT), expected) < 1e-5


def test_each_serves_from_its_gguf_through_the_boot_path(
    arch_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    """What `nanoserve serve` runs: build_engine over the file with quantize auto (its own
    blocks on the kernels), a chat through its template, greedy, as many tokens as asked."""
    from gguf import GGMLQuantizationType

    from nanoserve.runtime.engine.serving.llm import LLM

    path = write_tiny_gguf(arch_dir, tmp_path / "q8.gguf", qtype=GGMLQuantizationType.Q8_0)
    llm = LLM(str(path), quantize="auto", dtype="auto", max_model_len=128, kv_budget_bytes=1 << 22)
    assert llm.engine.config.quantize == "gguf"
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    (out,) = llm.chat([{"role": "user", "content": "hello world"}], params)
    assert len(out.outputs[0].token_ids) == 12 and out.outputs[0].finish_reason == "length"
    (again,) = llm.chat([{"role": "user", "content": "hello world"}], params)
    assert again.outputs[0].token_ids == out.outputs[0].token_ids
    llm.engine.check_blocks()

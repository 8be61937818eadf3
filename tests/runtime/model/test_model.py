"""LlamaModel against transformers, which nobody here wrote: same weights, same logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel
from tests.runtime.paged_logits import fresh_pool, paged_logits, rel_error


def build(checkpoint: Checkpoint, **kwargs: Any) -> LlamaModel:
    return LlamaModel.from_tensors(
        checkpoint.config, checkpoint.tensors(), max_positions=2048, **kwargs
    )


@pytest.fixture(scope="module")
def tiny_prompt() -> list[int]:
    return [5, 17, 3, 99, 250, 31, 7, 7, 7, 120, 64, 8, 200, 2, 11, 13, 17, 19, 23, 29, 31, 37]


@pytest.mark.parametrize(
    ("arch", "tie", "overrides"),
    [
        ("llama", True, {}),
        ("llama", False, {}),
        ("llama", True, {"num_key_value_heads": 1}),
        (
            "llama",
            True,
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                }
            },
        ),
        ("qwen2", False, {}),
        ("mistral", True, {}),
        ("qwen3", True, {}),
        ("gemma3", True, {"query_pre_attn_scalar": 24}),
        ("smollm3", True, {}),
        ("phi3", False, {}),
        ("phi3", False, {"partial_rotary_factor": 1.0, "sliding_window": None}),
        (
            "phi3",
            False,
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0, 1.1, 1.3, 1.7, 2.0, 2.5, 3.0, 4.0],
                    "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 16.0, 32.0, 32.0],
                },
                "max_position_embeddings": 8192,
                "original_max_position_embeddings": 4096,
                "partial_rotary_factor": 1.0,
            },
        ),
    ],
    ids=[
        "llama-tied",
        "llama-untied",
        "llama-mqa",
        "llama3-rope",
        "qwen2-bias",
        "mistral",
        "qwen3-qk-norm",
        "gemma3-window",
        "smollm3-nope",
        "phi3-fused-window-partial",
        "phi3-full-rotary",
        "phi3-longrope",
    ],
)
def test_tiny_logits_match_transformers(
    make_tiny_model_dir: Any,
    tmp_path: Path,
    tiny_prompt: list[int],
    arch: str,
    tie: bool,
    overrides: dict[str, Any],
) -> None:
    import transformers

    model_dir = make_tiny_model_dir(tmp_path, arch=arch, tie=tie, **overrides)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([tiny_prompt])).logits[0]
    ours = paged_logits(build(load_checkpoint(model_dir)), tiny_prompt)
    assert ours.shape == expected.shape
    assert rel_error(ours, expected) < 1e-5


def test_chunked_prefill_equals_whole(tiny_llama_dir: Path, tiny_prompt: list[int]) -> None:
    model = build(load_checkpoint(tiny_llama_dir))
    whole = paged_logits(model, tiny_prompt)
    for chunk in (1, 3, 7):
        assert rel_error(paged_logits(model, tiny_prompt, chunk), whole) < 1e-6
    # In batch-invariant mode the chunking leaves no trace at all.
    assert torch.equal(paged_logits(model, tiny_prompt, 7), whole)


def test_bfloat16_is_close(tiny_llama_dir: Path, tiny_prompt: list[int]) -> None:
    checkpoint = load_checkpoint(tiny_llama_dir)
    fp32 = paged_logits(build(checkpoint), tiny_prompt)
    bf16 = paged_logits(build(checkpoint, dtype=torch.bfloat16), tiny_prompt)
    assert bf16.dtype == torch.float32  # logits always come back in float32
    assert rel_error(bf16, fp32) < 0.05


def test_weights_are_not_copied_twice(tiny_llama_dir: Path) -> None:
    model = build(load_checkpoint(tiny_llama_dir))
    assert model.lm_head is model.embed  # tied: one tensor
    qkv = model.layers[0].qkv
    assert isinstance(qkv, torch.Tensor) and qkv.is_contiguous()


# -- the embedded model, against transformers' own load of the same GGUF ----------------------

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
)


@pytest.fixture(scope="module")
def embedded_model(embedded_checkpoint: Checkpoint) -> LlamaModel:
    return LlamaModel.from_tensors(
        embedded_checkpoint.config, embedded_checkpoint.tensors(), max_positions=2048
    )


@pytest.fixture(scope="module")
def long_prompt(embedded_checkpoint: Checkpoint) -> list[int]:
    text = " ".join(
        f"Paragraph {i}: the committee reviewed item {i * 7} and approved {i % 5} amendments."
        for i in range(60)
    )
    ids = embedded_checkpoint.tokenizer.encode(text)
    assert 900 <= len(ids) <= 1300
    return ids


@pytest.mark.slow
def test_embedded_logits_match_transformers(
    embedded_model: LlamaModel,
    embedded_checkpoint: Checkpoint,
    hf_reference_model: Any,
    long_prompt: list[int],
) -> None:
    prompts = [embedded_checkpoint.tokenizer.encode(p) for p in PROMPTS] + [long_prompt]
    for ids in prompts:
        with torch.no_grad():
            expected = hf_reference_model(torch.tensor([ids])).logits[0]
        ours = paged_logits(embedded_model, ids, chunk=256)
        assert rel_error(ours, expected) < 1e-4, len(ids)


def hf_greedy(model: Any, ids: list[int], steps: int) -> list[int]:
    out = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


@pytest.fixture(scope="module")
def hf_greedy_tokens(embedded_checkpoint: Checkpoint, hf_reference_model: Any) -> list[list[int]]:
    """transformers' greedy 32 tokens for each of PROMPTS, computed once for every chunking."""
    tokenizer = embedded_checkpoint.tokenizer
    return [hf_greedy(hf_reference_model, tokenizer.encode(text), 32) for text in PROMPTS]


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [None, 7])
def test_embedded_greedy_matches_transformers(
    embedded_model: LlamaModel,
    embedded_checkpoint: Checkpoint,
    hf_greedy_tokens: list[list[int]],
    chunk: int | None,
) -> None:
    tokenizer = embedded_checkpoint.tokenizer
    engine = Engine.from_config(
        embedded_model,
        tokenizer,
        EngineConfig(
            max_model_len=512, max_num_batched_tokens=chunk or 512, kv_budget_bytes=1 << 27
        ),
    )
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    for index, text in enumerate(PROMPTS):
        ids = tokenizer.encode(text)
        engine.add_request(str(index), ids, params)
        got = [t for d in engine.run_until_done() for t in d.token_ids]
        assert got == hf_greedy_tokens[index], text
    engine.check_blocks()


@pytest.mark.parametrize("forms", ["torch", "kernels"])
def test_the_last_layer_carries_only_the_sampled_rows(
    forms: str,
    tiny_llama_checkpoint: Checkpoint,
    tiny_llama_weights: dict[str, torch.Tensor],
    tiny_mixed_checkpoint: Checkpoint,
    tiny_mixed_sources: dict[str, Any],
) -> None:
    """A prefill plan's default logits (its last layer cut to the chunks' last tokens) are
    the whole forward's bit for bit: a fresh prompt, a chunk after a cached prefix and a
    decode row in one plan, on torch's ops and on the kernels over every weight type."""
    from nanoserve.core import BlockTable, PrefillChunk, plan_prefill

    if forms == "torch":
        ck, weights, quantize = tiny_llama_checkpoint, tiny_llama_weights, None
    else:
        ck, weights, quantize = tiny_mixed_checkpoint, tiny_mixed_sources, "gguf"
    model = LlamaModel.from_tensors(
        ck.config, weights.items(), batch_invariant=True, max_positions=64, quantize=quantize
    )
    pool = fresh_pool(model, max_blocks=12)  # blocks of 4 slots
    kv = pool.plan
    tables = [BlockTable(4, [0, 1, 2]), BlockTable(4, [5, 3, 4]), BlockTable(4, [8, 6, 7])]
    # Sequences 1 and 2 cache a prefix first; then one plan: 1 continues by 5 tokens, 2 by
    # one (a decode row), 3 is a fresh prompt of 7.
    first = plan_prefill(
        [PrefillChunk(1, (5, 17, 3), 0, tables[0]), PrefillChunk(2, (9, 8, 7, 6), 0, tables[1])],
        sink_slot=kv.sink_slot,
    )
    model.forward(first, pool.view(first.seq_ids))
    plan = plan_prefill(
        [
            PrefillChunk(1, (99, 25, 31, 7, 7), 3, tables[0]),
            PrefillChunk(2, (12,), 4, tables[1]),
            PrefillChunk(3, (120, 64, 8, 200, 2, 11, 13), 0, tables[2]),
        ],
        sink_slot=kv.sink_slot,
    )
    cache = pool.view(plan.seq_ids)
    trimmed = model.forward(plan, cache)  # [3, vocab]
    whole = model.forward(plan, cache, logit_rows=plan.last_token_idx)  # every row, every layer
    assert trimmed.shape == (3, model.config.vocab_size)
    assert torch.equal(trimmed, whole)

"""A whole model on every ISA path: the tiny GGUF of every weight type, greedy, two sequences
decoding side by side, gives the same tokens and bit-identical logits on each path this CPU runs
(the portable C++ always among them). The op-level tests (tests/runtime/kernels) compare each
kernel alone; this closes the gap between them and a served model: norms, rotary, the pool's
rounding, attention, every linear type and the output projection, composed over steps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from nanoserve.core import BlockTable, PrefillChunk, plan_prefill
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.kernels.cpu_kernels import ISAS, CpuKernels, load_cpu_kernels
from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.model.llama import LlamaModel
from tests.runtime.paged_logits import fresh_pool

PROMPTS = ((5, 17, 3, 99, 25, 31, 7), (120, 64, 8, 200, 2))
STEPS = 12


@pytest.fixture(scope="module")
def runnable_isas() -> Iterator[list[str]]:
    best = load_cpu_kernels().isa
    yield list(ISAS[: ISAS.index(best) + 1])
    CpuKernels.force_isa("auto")


@pytest.fixture(scope="module")
def model(tiny_mixed_checkpoint: Checkpoint, tiny_mixed_sources: dict[str, Any]) -> LlamaModel:
    ck = tiny_mixed_checkpoint
    return LlamaModel.from_tensors(
        ck.config, tiny_mixed_sources.items(), batch_invariant=True, max_positions=64,
        quantize="gguf",
    )  # fmt: skip


def greedy(model: LlamaModel) -> tuple[list[list[int]], torch.Tensor]:
    """Both prompts prefilled in one plan, then STEPS decode steps of both rows: the tokens of
    each sequence and every step's logits, [STEPS + 1, 2, vocab]."""
    pool = fresh_pool(model, max_blocks=16)
    sink = pool.plan.sink_slot
    tables = [BlockTable(4, [3, 0, 5, 7, 9]), BlockTable(4, [1, 2, 4, 6, 8])]
    tokens: list[list[int]] = [[], []]
    fed = [list(p) for p in PROMPTS]
    chunks = [PrefillChunk(i, tuple(p), 0, tables[i]) for i, p in enumerate(PROMPTS)]
    steps = []
    for _ in range(STEPS + 1):
        plan = plan_prefill(chunks, sink_slot=sink)
        logits = model.forward(plan, pool.view(plan.seq_ids))  # [2, vocab]
        steps.append(logits.clone())
        picked = logits.argmax(dim=-1).tolist()
        chunks = []
        for i, token in enumerate(picked):
            tokens[i].append(token)
            chunks.append(PrefillChunk(i, (token,), len(fed[i]), tables[i]))
            fed[i].append(token)
    return tokens, torch.stack(steps)


def test_greedy_tokens_and_logits_are_the_same_bits_on_every_isa(
    runnable_isas: list[str], model: LlamaModel
) -> None:
    results = {}
    for isa in runnable_isas:
        assert CpuKernels.force_isa(isa) == isa
        results[isa] = greedy(model)
    CpuKernels.force_isa("auto")
    tokens, logits = results["portable"]
    assert len(set(tokens[0])) > 1 or len(set(tokens[1])) > 1  # not one token repeated
    for isa, (got_tokens, got_logits) in results.items():
        assert got_tokens == tokens, f"{isa}: other greedy tokens than portable"
        assert torch.equal(got_logits, logits), f"{isa}: logits differ from portable"


def test_an_engine_serves_the_same_answer_on_every_isa(
    runnable_isas: list[str], model: LlamaModel, tiny_mixed_checkpoint: Checkpoint
) -> None:
    """Through the engine (scheduler, sampler, logprobs), batched: the same tokens and the same
    logprobs on every path."""
    params = SamplingParams(max_tokens=STEPS, temperature=0.0, logprobs=3, ignore_eos=True)
    answers = {}
    for isa in runnable_isas:
        assert CpuKernels.force_isa(isa) == isa
        engine = Engine.from_config(
            model,
            tiny_mixed_checkpoint.tokenizer,
            EngineConfig(block_size=4, max_model_len=64, max_batch=4, kv_budget_bytes=1 << 22),
            name="tiny",
        )
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{i}", list(prompt), params)
        answers[isa] = [
            (d.request_id, d.token_ids, d.logprobs, d.top_logprobs) for d in engine.run_until_done()
        ]
        engine.check_blocks()
    CpuKernels.force_isa("auto")
    assert sum(len(a[1]) for a in answers["portable"]) == STEPS * len(PROMPTS)
    for isa, answer in answers.items():
        assert answer == answers["portable"], f"{isa}: another answer than portable"

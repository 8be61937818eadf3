"""A tiny hybrid through the engine, for the hybrid families' tests (shared; test modules
cannot import each other): an engine over a model directory, and greedy generation that counts
preemptions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel

PROMPT = [5, 17, 3, 99, 250, 31, 7, 7, 7, 120, 64, 8, 200, 2, 11, 13, 17, 19, 23, 29, 31, 37]
PROMPTS = [PROMPT[i:] + PROMPT[:i] for i in range(0, 20, 4)]  # five distinct prompts
NEW_TOKENS = 12


def engine_of(model_dir: Path, quantize: str | None = None, **config: Any) -> Engine:
    checkpoint = load_checkpoint(model_dir)
    settings: dict[str, Any] = {
        "max_model_len": 128,
        "max_batch": 4,
        "block_size": 4,
        "kv_budget_bytes": 1 << 20,
        "quantize": quantize,
        **config,
    }
    model = LlamaModel.from_tensors(
        checkpoint.config, checkpoint.tensors(), max_positions=128, quantize=quantize
    )
    return Engine.from_config(model, checkpoint.tokenizer, EngineConfig(**settings))


def greedy(engine: Engine, prompts: list[list[int]]) -> tuple[dict[str, list[int]], int]:
    """Every prompt at once, greedy, NEW_TOKENS each: the tokens, and how many preemptions."""
    preempted = 0
    scheduler = engine.scheduler
    preempt = scheduler._preempt

    def counting(seq: Any) -> None:
        nonlocal preempted
        preempted += 1
        preempt(seq)

    scheduler._preempt = counting  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {}
    for delta in engine.run_until_done():
        tokens.setdefault(delta.request_id, []).extend(delta.token_ids)
    engine.check_blocks()
    return tokens, preempted


def transformers_greedy(model: Any, prompt: list[int]) -> list[int]:
    """NEW_TOKENS greedy tokens from a transformers model recomputing the whole sequence."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def kv_bytes_per_slot(model_dir: Path) -> int:
    """One token's float32 K and V over the model's attention layers."""
    config = load_checkpoint(model_dir).config
    return 2 * len(config.attention_layers) * config.kv_size * 4

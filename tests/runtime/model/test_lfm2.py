"""LFM2, the first hybrid: short convolutions that carry a state beside attention's K/V.

Greedy tokens against transformers recomputing the whole sequence each step, with prompts cut
into chunks; a preempted sequence recomputes its state with its K/V; its state slots come back;
the prefix cache is off (a hit would need the state at the prefix's end) and speculation is
refused in one line (a rejected draft would stay in the state). Alone, batched, eager,
bucketed, recorded and the GGUF form are in test_architectures.py with the other families."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.runtime.engine.config.speculative_config import SpeculativeConfig
from nanoserve.runtime.engine.speculation.speculator import SpeculativeConfigError
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from tests.runtime.hybrid_engine import (
    PROMPT,
    PROMPTS,
    engine_of,
    greedy,
    kv_bytes_per_slot,
    transformers_greedy,
)


@pytest.fixture(scope="module")
def lfm2_dir(
    tmp_path_factory: pytest.TempPathFactory, make_tiny_model_dir: Callable[..., Path]
) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("lfm2"), arch="lfm2")


def test_greedy_tokens_are_transformers_recomputing_everything(lfm2_dir: Path) -> None:
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(lfm2_dir).eval()
    expected = transformers_greedy(reference, PROMPT)
    # The prompt in chunks of 7: the state crosses three chunk boundaries before decoding.
    tokens, _ = greedy(engine_of(lfm2_dir, max_num_batched_tokens=7), [PROMPT])
    assert tokens["0"] == expected


def test_a_preempted_sequence_recomputes_its_state(lfm2_dir: Path) -> None:
    alone = {str(i): greedy(engine_of(lfm2_dir), [p])[0]["0"] for i, p in enumerate(PROMPTS)}
    config = load_checkpoint(lfm2_dir).config
    per_slot = kv_bytes_per_slot(lfm2_dir)
    state = StatePoolPlan(4, config.state_shapes).total_bytes
    # 20 blocks of 4 slots for 4 rows of up to 34 tokens: someone is preempted
    engine = engine_of(lfm2_dir, kv_budget_bytes=state + per_slot * (4 * 20 + 1))
    assert engine.pool_plan.num_blocks == 20
    tokens, preempted = greedy(engine, PROMPTS)
    assert preempted > 0
    assert tokens == alone
    assert engine.scheduler.state_slots.num_used == 0  # every slot given back
    assert engine.blocks.num_in_use == 0


def test_the_state_is_planned_and_shown_and_the_prefix_cache_is_off(lfm2_dir: Path) -> None:
    engine = engine_of(lfm2_dir)
    assert engine.state_plan == StatePoolPlan(4, ((64, 2),) * 3)  # three conv layers' windows
    assert engine.pool_plan.num_layers == 1  # K/V for the one attention layer only
    assert not engine.prefix_caching
    first, _ = greedy(engine, [PROMPT])
    again, _ = greedy(engine, [PROMPT])
    status = engine.status()
    assert again == first
    assert status.prefix_cache.hit_tokens == 0
    assert (status.state.bytes_per_slot, status.state_slots_in_use) == (3 * 64 * 2 * 4, 0)


def test_speculation_is_refused_in_one_line(lfm2_dir: Path) -> None:
    with pytest.raises(
        SpeculativeConfigError,
        match=r"^speculative decoding is not built for lfm2's recurrent state \(the model's\)",
    ):
        engine_of(lfm2_dir, speculative=SpeculativeConfig())

"""The three hybrid families through the engine: a preempted sequence recomputes its state; the
state pool is planned with its checkpoints; a prefix-cache hit restores the deepest checkpoint
and gives transformers' tokens; checkpoints go with their blocks; speculation is refused in one
line (a rejected draft would stay in the state). Each family's own forward is tested in its
module (test_lfm2.py, test_qwen3_5.py, test_granite_hybrid.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.core.state_slots import check_state_conservation
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

ARCHS = ["lfm2", "qwen3_5", "granitemoehybrid"]
# Block size 4, a checkpoint every 2 blocks: PROMPT's 22 tokens save states at 8, 16 and 20
# (its last block boundary before its final token).
CHECKPOINTED: dict[str, Any] = {"state_checkpoints": 8, "state_checkpoint_interval": 2}


@pytest.fixture(scope="module", params=ARCHS)
def hybrid_dir(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    make_tiny_model_dir: Callable[..., Path],
) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param)


@pytest.fixture(scope="module")
def reference(hybrid_dir: Path) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(hybrid_dir).eval()


def test_a_preempted_sequence_recomputes_its_state(hybrid_dir: Path) -> None:
    alone = {str(i): greedy(engine_of(hybrid_dir), [p])[0]["0"] for i, p in enumerate(PROMPTS)}
    config = load_checkpoint(hybrid_dir).config
    state = StatePoolPlan(4 + 2, config.state_shapes, 2).total_bytes
    # 20 blocks of 4 slots for 4 rows of up to 34 tokens: someone is preempted
    budget = state + kv_bytes_per_slot(hybrid_dir) * (4 * 20 + 1)
    engine = engine_of(hybrid_dir, kv_budget_bytes=budget, state_checkpoints=2)
    assert engine.pool_plan.num_blocks == 20
    tokens, preempted = greedy(engine, PROMPTS)
    assert preempted > 0
    assert tokens == alone
    assert engine.scheduler.state_slots.num_used == 0  # every slot given back
    assert engine.blocks.num_in_use == 0
    check_state_conservation(engine.scheduler.state_slots)


def test_the_state_is_planned_with_its_checkpoints(hybrid_dir: Path) -> None:
    config = load_checkpoint(hybrid_dir).config
    engine = engine_of(hybrid_dir, **CHECKPOINTED)
    assert engine.state_plan == StatePoolPlan(4 + 8, config.state_shapes, 8)
    assert engine.pool_plan.num_layers == len(config.attention_layers) == 1
    assert engine.prefix_caching
    off = engine_of(hybrid_dir, state_checkpoints=0)
    assert off.state_plan == StatePoolPlan(4, config.state_shapes)
    assert not off.prefix_caching  # no checkpoint to restore: no hit
    assert off.memory.checkpoints is None


def test_a_prefix_hit_restores_the_deepest_checkpoint(hybrid_dir: Path, reference: Any) -> None:
    engine = engine_of(hybrid_dir, **CHECKPOINTED)
    shared = [*PROMPT[:18], 77, 78, 79, 80]  # its blocks 0-3 are PROMPT's, block 4 is not
    first, _ = greedy(engine, [PROMPT])
    # Saved at 8, 16 and 20 by the prompt, at 24 and 32 while decoding
    assert len(engine.blocks.checkpoints or ()) == 5
    restores: list[tuple[int, int]] = []
    schedule = engine.scheduler.schedule

    def watching() -> Any:
        out = schedule()
        restores.extend(out.restores)
        return out

    engine.scheduler.schedule = watching  # type: ignore[method-assign]
    second, _ = greedy(engine, [shared])
    again, _ = greedy(engine, [PROMPT])
    assert first["0"] == again["0"] == transformers_greedy(reference, PROMPT)
    assert second["0"] == transformers_greedy(reference, shared)
    assert len(restores) == 2
    # 16 tokens restored for `shared` (the checkpoint at 16), 20 for the repeat (at 20)
    assert engine.status().prefix_cache.hit_tokens == 16 + 20
    check_state_conservation(engine.scheduler.state_slots)
    engine.check_blocks()


def test_checkpoints_go_with_their_blocks(hybrid_dir: Path, reference: Any) -> None:
    """A pool of 12 blocks holds one prompt's blocks at a time: each new prompt evicts the last
    one's, and its checkpoints with them; the tokens stay transformers'."""
    config = load_checkpoint(hybrid_dir).config
    state = StatePoolPlan(4 + 8, config.state_shapes, 8).total_bytes
    budget = state + kv_bytes_per_slot(hybrid_dir) * (4 * 12 + 1)
    engine = engine_of(hybrid_dir, kv_budget_bytes=budget, **CHECKPOINTED)
    assert engine.pool_plan.num_blocks == 12
    for prompt in PROMPTS[:3]:
        tokens, _ = greedy(engine, [prompt])
        assert tokens["0"] == transformers_greedy(reference, prompt)
        engine.check_blocks()  # every checkpoint's block still named
        check_state_conservation(engine.scheduler.state_slots)
    assert engine.status().prefix_cache.hit_tokens == 0


def test_reset_drops_every_checkpoint(hybrid_dir: Path) -> None:
    engine = engine_of(hybrid_dir, **CHECKPOINTED)
    greedy(engine, [PROMPT])
    assert engine.reset_prefix_cache() > 0
    assert len(engine.blocks.checkpoints or ()) == 0
    assert engine.scheduler.state_slots.checkpoints == set()
    check_state_conservation(engine.scheduler.state_slots)


def test_speculation_is_refused_in_one_line(hybrid_dir: Path) -> None:
    arch = load_checkpoint(hybrid_dir).config.architecture
    with pytest.raises(
        SpeculativeConfigError,
        match=rf"^speculative decoding is not built for {arch}'s recurrent state \(the model's\)",
    ):
        engine_of(hybrid_dir, speculative=SpeculativeConfig())

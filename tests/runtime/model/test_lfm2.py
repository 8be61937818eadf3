"""LFM2, the first hybrid: short convolutions that carry a state beside attention's K/V.

Greedy tokens against transformers recomputing the whole sequence each step, with prompts cut
into chunks. Preemption, the prefix cache's checkpoints and speculation's refusal are in
test_hybrid_engine.py; alone, batched, eager, bucketed, recorded and the GGUF form are in
test_architectures.py with the other families."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runtime.hybrid_engine import (
    PROMPT,
    engine_of,
    greedy,
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

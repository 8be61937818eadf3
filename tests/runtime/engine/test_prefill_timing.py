"""The boot's prefill budget: measured over padding on a CPU (touching no real slot), fixed
when asked, and off on a GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from nanoserve.core import PrefillBudget
from nanoserve.runtime.engine.prefill_timing import resolve_prefill_budget
from nanoserve.runtime.engine_config import EngineConfig

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_auto_is_measured_and_touches_no_slot(make_tiny_engine: Any) -> None:
    engine = make_tiny_engine(mixed=True, quantize="gguf", dtype=torch.bfloat16)
    before = engine.pool.snapshot()
    config = EngineConfig(max_batch=8, max_model_len=128, prefill_budget="auto")
    budget = resolve_prefill_budget(engine.runner.model, config.resolve(model_max_len=128))
    assert isinstance(budget, PrefillBudget)
    assert budget.per_token_s > 0 and budget.decode_step_s(8) > 0
    assert budget.max_rows == 8 and budget.max_tokens == config.max_num_batched_tokens
    assert all(torch.equal(a, b) for a, b in zip(before, engine.pool.pools(), strict=True))


def test_a_count_is_fixed_and_off_is_none() -> None:
    model: Any = SimpleNamespace(device=torch.device("cpu"))
    fixed = resolve_prefill_budget(
        model, EngineConfig(prefill_budget=24).resolve(model_max_len=128)
    )
    assert fixed == PrefillBudget.fixed(24, max_tokens=512)
    assert (
        resolve_prefill_budget(model, EngineConfig(prefill_budget="off").resolve(model_max_len=128))
        is None
    )


def test_a_gpu_is_not_timed_on_a_cpus_terms() -> None:
    gpu: Any = SimpleNamespace(device=torch.device("cuda"))
    assert (
        resolve_prefill_budget(gpu, EngineConfig(prefill_budget="auto").resolve(model_max_len=128))
        is None
    )

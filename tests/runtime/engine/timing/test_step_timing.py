"""The boot's prefill budget: measured over padding on a CPU (touching no real slot), fixed
when asked, and off on a GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from nanoserve.core import PrefillBudget
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.timing.step_timing import resolve_prefill_budget, step_timings

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_auto_is_measured_and_touches_no_slot(make_tiny_engine: Any) -> None:
    engine = make_tiny_engine(mixed=True, quantize="gguf", dtype=torch.bfloat16)
    before = engine.pool.snapshot()
    config = EngineConfig(max_batch=8, max_model_len=128, prefill_budget="auto")
    resolved = config.resolve(model_max_len=128)
    timings = step_timings(engine.runner.model, resolved)
    assert timings is not None and timings.remembered is None  # built in memory: no file
    assert (timings.rows, timings.tokens) == (8, 32)
    budget = resolve_prefill_budget(resolved, timings)
    assert isinstance(budget, PrefillBudget)
    assert budget.per_token_s > 0 and budget.decode_step_s(8) > 0
    assert budget.max_rows == 8 and budget.max_tokens == config.max_num_batched_tokens
    assert all(torch.equal(a, b) for a, b in zip(before, engine.pool.pools(), strict=True))


def test_a_count_is_fixed_and_off_is_none() -> None:
    model: Any = SimpleNamespace(device=torch.device("cpu"))
    fixed = EngineConfig(prefill_budget=24).resolve(model_max_len=128)
    assert step_timings(model, fixed) is None  # nothing is timed for a fixed budget
    assert resolve_prefill_budget(fixed, None) == PrefillBudget.fixed(24, max_tokens=512)
    off = EngineConfig(prefill_budget="off").resolve(model_max_len=128)
    assert step_timings(model, off) is None and resolve_prefill_budget(off, None) is None


def test_a_gpu_is_not_timed_on_a_cpus_terms() -> None:
    gpu: Any = SimpleNamespace(device=torch.device("cuda"))
    auto = EngineConfig(prefill_budget="auto").resolve(model_max_len=128)
    assert step_timings(gpu, auto) is None
    assert resolve_prefill_budget(auto, None) is None

"""FaultyEngine: the failures NANOSERVE_FAULT asks for, on cue, wrapped around a production
Engine that carries no fault code of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from tests.faults import FaultPlan, FaultSpecError, FaultyEngine, InjectedFault

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def faulty(make_tiny_engine: Callable[..., Engine], kind: str, at: int) -> FaultyEngine:
    engine = make_tiny_engine()
    return FaultyEngine(engine.model, engine.tokenizer, engine.config, faults=FaultPlan(kind, at))


def test_the_plan_is_read_from_the_environment() -> None:
    assert FaultPlan.from_env({}) is None
    assert FaultPlan.from_env({"NANOSERVE_FAULT": " sampler@3 "}) == FaultPlan("sampler", 3)
    for bad in ("meteor@1", "forward", "forward@0", "forward@x"):
        with pytest.raises(FaultSpecError, match="expected <kind>@<n>"):
            FaultPlan.from_env({"NANOSERVE_FAULT": bad})


@pytest.mark.parametrize("kind", ["forward", "sampler", "alloc"])
def test_a_step_fails_at_its_count_and_not_before(make_tiny_engine: Any, kind: str) -> None:
    engine = faulty(make_tiny_engine, kind, 2)
    engine.add_request("a", [5, 6, 7], GREEDY)
    assert [d.token_ids for d in engine.step()] != []  # step 1: the prefill, and a token
    with pytest.raises(InjectedFault, match=f"{kind} at 2"):
        engine.step()
    assert engine.num_attempts == 2
    engine.abort("a")


def test_the_nth_prompt_encoded_fails_and_decoding_never_does(make_tiny_engine: Any) -> None:
    engine = faulty(make_tiny_engine, "tokenizer", 2)
    first = engine.tokenizer.encode("hello world")
    with pytest.raises(InjectedFault, match="tokenizer at 2"):
        engine.tokenizer.encode("hello world")
    assert engine.tokenizer.encode("hello world") == first
    assert engine.tokenizer.decode(first) == "hello world"


def test_the_production_engine_has_no_fault_hooks(make_tiny_engine: Any) -> None:
    engine = make_tiny_engine()
    assert not hasattr(engine, "faults") and not hasattr(engine, "num_attempts")
    assert type(engine.tokenizer).__name__ == "Tokenizer"

"""The decode modes give the same tokens, bit for bit, as rows join and leave."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanoserve.core import SlotTable
from nanoserve.runtime.engine_config import EngineConfigError
from tests.runtime.capture_helpers import MODES, run_joining_workload, tiny_engine


@pytest.fixture(scope="module")
def eager_tokens(tiny_llama_dir: Path) -> dict[str, list[int]]:
    return run_joining_workload(tiny_engine(tiny_llama_dir))


@pytest.mark.parametrize("mode", ["bucketed", "persistent", "recorded"])
def test_modes_match_eager(tiny_llama_dir: Path, eager_tokens: dict, mode: str) -> None:
    engine = tiny_engine(tiny_llama_dir, **MODES[mode])
    assert run_joining_workload(engine) == eager_tokens
    assert sum(len(t) for t in eager_tokens.values()) == 6 + 15 + 24 + 20 + 20


def test_recorded_mode_records_and_replays(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **MODES["recorded"])
    run_joining_workload(engine)
    graphs = engine.runner.graphs
    assert graphs is not None
    # Lazy recordings are bound to the rows they saw, so a changed row set re-records.
    assert graphs.num_recorded == graphs.num_cold > len(graphs.recordings)
    assert graphs.num_replays > 0
    assert all(r.rows for r in graphs.recordings.values())


def test_persistent_inputs_never_move(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, **MODES["persistent"])
    runner = engine.runner
    assert isinstance(runner.table, SlotTable) and runner.buffers is not None
    before = (runner.table.address, runner.buffers.addresses())
    run_joining_workload(engine)
    assert (runner.table.address, runner.buffers.addresses()) == before


def test_modes_build_on_each_other() -> None:
    from nanoserve.runtime.engine_config import EngineConfig

    with pytest.raises(EngineConfigError, match="persist_inputs needs bucket_decode"):
        EngineConfig(persist_inputs=True)
    with pytest.raises(EngineConfigError, match="capture_decode needs persist_inputs"):
        EngineConfig(bucket_decode=True, capture_decode=True)

"""build_engine: the boot path threads the switches and the warm list, then prints one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanoserve.runtime.build import build_engine
from nanoserve.runtime.engine_config import EngineConfig, EngineConfigError
from nanoserve.runtime.errors import CheckpointError


def boot(model_dir: Path, **config: object) -> tuple[object, list[str]]:
    lines: list[str] = []
    engine = build_engine(
        EngineConfig(model=str(model_dir), max_model_len=64, kv_budget_bytes=1 << 22, **config),  # type: ignore[arg-type]
        say=lines.append,
    )
    return engine, lines


def test_eager_boot_line(tiny_llama_dir: Path) -> None:
    engine, lines = boot(tiny_llama_dir)
    assert lines[-1].startswith("nanoserve ready: model=")
    assert "dtype=float32 device=cpu" in lines[-1] and "graphs=" not in lines[-1]
    # The boot request left no trace: counters reset, every block free.
    assert engine.stats()["generation_tokens"] == 0 and engine.blocks.num_in_use == 0


def test_capture_boot_warms_the_trimmed_list(tiny_llama_dir: Path) -> None:
    engine, lines = boot(
        tiny_llama_dir,
        bucket_decode=True,
        persist_inputs=True,
        capture_decode=True,
        max_batch=8,
        width_multiple=16,
        warm_max_rows=2,
        warm_max_width=32,
    )
    report = engine.warm_report
    assert report is not None and report.num_recorded == 2 * 2  # rows 1, 2 x widths 16, 32
    assert "graphs=4 (frozen-call" in lines[-1] and "skipped 0 by budget" in lines[-1]
    assert engine.warm_plan.max_rows == 2 and engine.warm_plan.max_width == 32
    assert engine.pool.resident
    engine.check_warm()


def test_lazy_capture_boot_records_nothing(tiny_llama_dir: Path) -> None:
    engine, lines = boot(
        tiny_llama_dir, bucket_decode=True, persist_inputs=True, capture_decode=True, warm=False
    )
    assert engine.warm_report is None and "graphs=lazy" in lines[-1]


def test_bad_model_path_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="nothing: no such file or directory"):
        build_engine(EngineConfig(model=str(tmp_path / "nothing")))


def test_bad_limits_are_named() -> None:
    with pytest.raises(EngineConfigError, match="max_batch"):
        EngineConfig(max_batch=0)
    with pytest.raises(EngineConfigError, match="dtype"):
        EngineConfig(dtype="float8")

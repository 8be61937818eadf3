"""build_engine: the boot path threads the switches and the warm list, then prints one line."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.core import Shape
from nanoserve.runtime.decode.warmup import WarmupCancelled
from nanoserve.runtime.engine.boot.build import build_engine
from nanoserve.runtime.engine.config.engine_config import (
    EngineConfig,
    EngineConfigError,
    available_cpus,
)
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.errors import CheckpointError
from nanoserve.runtime.model.llama import LlamaModel
from tests.runtime.capture_helpers import recordings_of


def boot(model_dir: Path, **config: Any) -> tuple[Engine, list[str]]:
    lines: list[str] = []
    engine = build_engine(
        EngineConfig(model=str(model_dir), max_model_len=64, kv_budget_bytes=1 << 22, **config),
        say=lines.append,
    )
    return engine, lines


def test_eager_boot_line(tiny_llama_dir: Path) -> None:
    engine, lines = boot(tiny_llama_dir)
    assert lines[-1].startswith("nanoserve ready: model=")
    assert "dtype=float32 device=cpu" in lines[-1] and "recordings=" not in lines[-1]
    # The boot request left no trace: counters reset, every block free.
    assert engine.status().generation_tokens == 0 and engine.blocks.num_in_use == 0


def test_capture_boot_warms_the_trimmed_list(tiny_llama_dir: Path) -> None:
    engine, lines = boot(
        tiny_llama_dir,
        decode_mode="recorded",
        max_batch=8,
        width_multiple=16,
        warm_max_rows=2,
        warm_max_width=32,
    )
    report = engine.warm_report
    assert report is not None and report.num_recorded == 2 * 2  # rows 1, 2 x widths 16, 32
    assert "recordings=4 (frozen-call, est " in lines[-1]
    assert "skipped 0 by memory, 0 by time)" in lines[-1]
    # The report carries its plan: the limits and both budgets (/health reads them off it).
    plan, estimate = report.plan, report.estimate
    assert (plan.max_rows, plan.max_width, report.max_width) == (2, 32, 32)
    assert plan.width_ceiling > 0 and plan.budget_bytes > 0
    assert estimate.budget_seconds == 30.0 and estimate.time_ceiling == 32
    assert estimate.seconds > 0
    body = report.as_dict()
    assert (body["max_rows"], body["max_width"]) == (2, 32)
    assert (body["width_ceiling"], body["budget_bytes"]) == (plan.width_ceiling, plan.budget_bytes)
    # The estimate was said before the work, in the line /health shows as the phase.
    pricing, warming = (line for line in lines if line.startswith(("pricing", "warming")))
    assert pricing == "pricing 4 decode shapes: timing one recording at 2x32 and 1x16"
    assert warming.startswith("warming 4 decode shapes (rows <= 2, width <= 32): estimated ")
    assert "s/shape measured at 1x16 and 2x32); time budget 30 s, memory ceiling " in warming
    assert warming.endswith(" tokens, 0 skipped")
    assert engine.pool.resident
    assert recordings_of(engine) is not None and recordings_of(engine).num_cold == 0


def test_lazy_capture_boot_records_nothing(tiny_llama_dir: Path) -> None:
    engine, lines = boot(tiny_llama_dir, decode_mode="recorded", warm=False)
    assert engine.warm_report is None and "recordings=lazy" in lines[-1]


def test_bad_model_path_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="nothing: no such file or directory"):
        build_engine(EngineConfig(model=str(tmp_path / "nothing")))


def test_bad_limits_are_named() -> None:
    with pytest.raises(EngineConfigError, match="max_batch"):
        EngineConfig(max_batch=0)
    with pytest.raises(EngineConfigError, match="dtype"):
        EngineConfig(dtype="float8")


CAPTURE: dict[str, Any] = {"decode_mode": "recorded"}


def test_a_tiny_time_budget_warms_nothing_and_says_why(tiny_llama_dir: Path) -> None:
    engine, lines = boot(
        tiny_llama_dir, **CAPTURE, max_batch=4, width_multiple=32, warm_seconds=1e-6
    )
    report = engine.warm_report
    assert report is not None
    # rows 1, 2, 4 x widths 32, 64: every width is over the budget.
    assert report.num_recorded == 0 and report.num_over_time == 6 and report.max_width == 0
    assert {why for _, why in report.skipped} == {"over the time budget of 1e-06 s"}
    assert Shape(4, 64) not in recordings_of(engine).by_shape  # the probe, dropped
    (warming,) = (line for line in lines if line.startswith("warming"))
    assert warming.startswith("warming 0 decode shapes (rows <= 4, width <= 0): estimated ")
    assert "time budget 1e-06 s" in warming and ", 6 skipped; probe 4x64 (" in warming
    assert "skipped 0 by memory, 6 by time)" in lines[-1]
    body: dict[str, Any] = report.as_dict()
    assert body["skipped"][0] == {
        "shape": [4, 64],
        "why": "over the time budget of 1e-06 s",
    }


def test_a_cancelled_boot_stops_between_phases(tiny_llama_dir: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(WarmupCancelled, match=r"^boot stopped after loading the weights$"):
        build_engine(EngineConfig(model=str(tiny_llama_dir)), cancel=cancel, say=lambda _: None)


def test_a_cancel_during_the_warm_up_stops_it(tiny_llama_dir: Path) -> None:
    cancel = threading.Event()
    lines: list[str] = []

    def say(line: str) -> None:  # a shutdown arriving as the estimate is said
        lines.append(line)
        if line.startswith("warming"):
            cancel.set()

    config = EngineConfig(
        model=str(tiny_llama_dir), max_model_len=64, width_multiple=16, max_batch=4, **CAPTURE
    )
    with pytest.raises(WarmupCancelled, match=r"^boot stopped after 2 of 12 warm recordings$"):
        build_engine(config, say=say, cancel=cancel)
    assert not any(line.startswith("running one real forward") for line in lines)


def test_warm_seconds_default_by_device_and_refusals() -> None:
    assert EngineConfig().resolve(model_max_len=8192).warm_seconds == 30.0
    assert EngineConfig(device="cuda").resolve(model_max_len=8192).warm_seconds == 3.0
    assert EngineConfig(warm_seconds=7).resolve(model_max_len=8192).warm_seconds == 7
    for bad in (0, -1.0, float("nan"), float("inf"), True, "30"):
        with pytest.raises(EngineConfigError, match=r"^warm_seconds must be a positive number"):
            EngineConfig(warm_seconds=bad)  # type: ignore[arg-type]


# -- quantize "auto": a GGUF's own block form on the CPU kernels ---------------------------------


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, write_tiny_gguf):
    from gguf import GGMLQuantizationType as Q

    folder = tmp_path_factory.mktemp("gguf")
    return {
        kind: write_tiny_gguf(tiny_llama_dir, folder / f"tiny-{kind}.gguf", qtype=getattr(Q, kind))
        for kind in ("Q4_1", "Q8_0", "F16")
    }


@pytest.mark.parametrize(
    ("kind", "quantize", "dtype", "kernels"),
    [
        ("Q4_1", "gguf", "bfloat16", "gguf nanoserve/"),
        ("Q8_0", "gguf", "bfloat16", "gguf nanoserve/"),
        ("F16", None, None, "torch/"),
    ],
)
def test_quantize_auto_serves_the_gguf_s_own_form(
    tiny_gguf: dict[str, Path],
    kind: str,
    quantize: str | None,
    dtype: str | None,
    kernels: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nanoserve.runtime.kernels.cpu_features import cpu_features
    from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels

    load_cpu_kernels()  # built (or found) where every test finds them, before the cache moves
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a conversion would land here

    engine, lines = boot(tiny_gguf[kind], quantize="auto", dtype="auto")
    config = engine.config
    assert config.quantize == quantize
    assert config.dtype == (dtype or cpu_features().auto_dtype())  # dense: bf16 only if native
    assert f"kernels={engine.runner.model.kernels}" in lines[-1]
    assert kernels in lines[-1]
    loaded = [line for line in lines if line.startswith("loading ")]
    assert loaded == [f"loading {tiny_gguf[kind]}"]  # read in place, never converted
    assert not (tmp_path / "nanoserve").exists()
    # 14 layer matrices and the tied embedding, each served in its own type (or dense)
    assert (f"weights=[{kind.lower()}×15]" in lines[-1]) == (quantize is not None)


def test_a_mixed_gguf_names_its_types_and_fallbacks(tiny_mixed_gguf: Path) -> None:
    engine, lines = boot(tiny_mixed_gguf, quantize="auto", dtype="auto")
    model = engine.runner.model
    assert engine.config.quantize == "gguf"
    assert "weights without a kernel of their own: f16×1 as q8_0 (re-quantized)" in lines
    assert model.weight_types is not None
    served = {t: n for t, n in (part.split("×") for part in model.weight_types.split())}
    assert served == {
        "q6_k": "3", "q4_k": "2", "q8_0": "3", "q5_0": "2", "q5_k": "1", "q4_0": "1",
        "q3_k": "1", "q5_1": "1", "q4_1": "1", "q2_k": "1",
    }  # fmt: skip
    assert f"weights=[{model.weight_types}]" in lines[-1]


def test_the_prefill_budget_is_measured_at_boot(tiny_mixed_gguf: Path) -> None:
    engine, lines = boot(tiny_mixed_gguf, quantize="auto", dtype="auto", prefill_budget="auto")
    budget = engine.prefill_budget
    assert budget is not None and budget.per_token_s > 0 and budget.base_s + budget.per_row_s > 0
    assert engine.scheduler.prefill_budget is budget
    said = next(line for line in lines if line.startswith("prefill budget:"))
    assert f"carries {budget.tokens(1)} prompt tokens at 1 row" in said


def test_quantize_auto_on_a_float_checkpoint_is_the_dtype(tiny_llama_dir: Path) -> None:
    engine, _ = boot(tiny_llama_dir, quantize="auto", dtype="float32")
    assert engine.config.quantize is None
    assert isinstance(engine.runner.model, LlamaModel)
    assert engine.runner.model.ops.name == "torch"


def test_quantize_auto_without_kernels_says_so_and_serves_dequantized(
    tiny_gguf: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nanoserve.runtime.engine.boot import build

    monkeypatch.setattr(build, "kernels_available", lambda: False)
    engine, lines = boot(tiny_gguf["Q4_1"], quantize="auto", dtype="float32")
    assert engine.config.quantize is None
    assert any("cannot be built here, so gguf is served dequantized" in line for line in lines)


def test_explicit_q4_on_a_float_checkpoint_quantizes_it(tiny_llama_dir: Path) -> None:
    engine, lines = boot(tiny_llama_dir, quantize="q4", dtype="auto")
    assert engine.config.dtype == "bfloat16"
    assert "dtype=bfloat16+q4" in lines[-1]


def test_the_collector_is_off_during_the_boot_and_restored_after(tiny_llama_dir: Path) -> None:
    seen: list[bool] = []
    build_engine(
        EngineConfig(model=str(tiny_llama_dir), max_model_len=64, kv_budget_bytes=1 << 22),
        say=lambda _line: seen.append(gc.isenabled()),
    )
    assert seen and not any(seen)
    assert gc.isenabled()
    # A boot that fails restores it too, and one begun with it off leaves it off.
    with pytest.raises(CheckpointError):
        build_engine(EngineConfig(model=str(tiny_llama_dir / "missing")))
    assert gc.isenabled()
    gc.disable()
    try:
        build_engine(
            EngineConfig(model=str(tiny_llama_dir), max_model_len=64, kv_budget_bytes=1 << 22)
        )
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_threads_set_torch_s_count_and_are_on_the_boot_line(tiny_llama_dir: Path) -> None:
    before = torch.get_num_threads()
    try:
        engine, lines = boot(tiny_llama_dir, threads=1)
        assert torch.get_num_threads() == 1
        assert " threads=1 " in lines[-1] and engine.status().threads == 1
        assert not any(line.startswith("warning:") for line in lines)
        too_many = available_cpus() + 1
        engine, lines = boot(tiny_llama_dir, threads=too_many)
        assert torch.get_num_threads() == too_many and engine.status().threads == too_many
        assert f"warning: {too_many} threads on {available_cpus()} available CPUs" in lines[0]
    finally:
        torch.set_num_threads(before)


def test_the_library_leaves_torch_s_thread_count_alone(tiny_llama_dir: Path) -> None:
    before = torch.get_num_threads()
    engine, lines = boot(tiny_llama_dir)
    assert torch.get_num_threads() == before and engine.status().threads == before
    assert f" threads={before} " in lines[-1]


@pytest.mark.parametrize("threads", [0, -1, True, "4"])
def test_a_thread_count_must_be_positive(threads: object) -> None:
    with pytest.raises(EngineConfigError, match="threads must be a positive integer or auto"):
        EngineConfig(threads=threads)  # type: ignore[arg-type]

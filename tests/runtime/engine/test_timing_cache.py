"""The boot's step timings, remembered per machine and model: read back only for the same key,
and trusted only when this boot's 1-row step agrees."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from nanoserve.runtime.engine import prefill_timing
from nanoserve.runtime.engine.prefill_timing import time_steps, timing_key
from nanoserve.runtime.engine.timing_cache import StepTimings, TimingCache, file_identity

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TIMINGS = StepTimings(one_row_s=0.04, rows=8, rows_s=0.2, tokens=32, tokens_s=0.25)
KEY = {"weights": [["/m.gguf", 10, 1]], "shapes": [8, 32], "forms": ("bfloat16", "gguf")}


def test_agreement_is_within_the_tolerance_either_way() -> None:
    assert TIMINGS.agrees(0.04) and TIMINGS.agrees(0.05) and TIMINGS.agrees(0.032)
    assert not TIMINGS.agrees(0.0501) and not TIMINGS.agrees(0.0319)


def test_two_boots_remember_the_faster_of_each() -> None:
    later = StepTimings(one_row_s=0.05, rows=8, rows_s=0.18, tokens=32, tokens_s=0.3)
    merged = later.fastest_with(TIMINGS)
    assert merged == StepTimings(0.04, 8, 0.18, 32, 0.25, boots=2)
    assert merged.trusted and not TIMINGS.trusted


def test_a_stored_timing_reads_back_under_its_key_only(tmp_path: Path) -> None:
    cache = TimingCache(tmp_path / "timings")
    assert cache.load(KEY) is None
    cache.store(KEY, TIMINGS)
    path = cache.path(KEY)
    assert cache.load(KEY) == dataclasses.replace(TIMINGS, remembered=path)
    assert cache.load({**KEY, "shapes": [16, 32]}) is None
    assert [p.name for p in (tmp_path / "timings").iterdir()] == [path.name]  # no temp left


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda saved: "{not json",
        lambda saved: json.dumps({**saved, "version": 0}),
        lambda saved: json.dumps({**saved, "key": {"other": 1}}),  # a hash collision
        lambda saved: json.dumps({**saved, "timings": {"one_row_s": 0.04}}),
    ],
)
def test_a_file_that_does_not_say_what_was_stored_is_none(tmp_path: Path, corrupt: Any) -> None:
    cache = TimingCache(tmp_path)
    cache.store(KEY, TIMINGS)
    path = cache.path(KEY)
    path.write_text(corrupt(json.loads(path.read_text())))
    assert cache.load(KEY) is None


def test_an_unwritable_cache_is_no_cache(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    cache = TimingCache(blocked / "timings")  # its parent is a file: mkdir fails
    cache.store(KEY, TIMINGS)
    assert cache.load(KEY) is None


def test_the_cache_folder_follows_the_environment(tmp_path: Path) -> None:
    assert TimingCache.from_env({"NANOSERVE_TIMING_CACHE": "off"}) is None
    chosen = TimingCache.from_env({"NANOSERVE_TIMING_CACHE": str(tmp_path)})
    assert chosen == TimingCache(tmp_path)
    xdg = TimingCache.from_env({"XDG_CACHE_HOME": str(tmp_path)})
    assert xdg == TimingCache(tmp_path / "nanoserve" / "timings")


def test_a_rewritten_file_is_another_identity(tmp_path: Path) -> None:
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF" + bytes(8))
    before = file_identity(weights)
    assert before == [[str(weights.resolve()), 12, weights.stat().st_mtime_ns]]
    os.utime(weights, ns=(1, 2))
    assert file_identity(weights) != before
    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "b.safetensors").write_bytes(b"xy")
    (directory / "a.json").write_bytes(b"{}")
    assert [Path(str(f[0])).name for f in file_identity(directory)] == ["a.json", "b.safetensors"]


class FakeClock:
    """prefill_timing.fastest replaced: each call returns the next of the given seconds."""

    def __init__(self, *seconds: float) -> None:
        self.seconds = list(seconds)
        self.calls = 0
        self.runs: list[int] = []

    def __call__(self, run: Any, *, warm: bool = True, runs: int = 2) -> float:
        self.calls += 1
        self.runs.append(runs)
        return self.seconds.pop(0)


def test_a_later_boot_times_one_step_and_trusts_the_rest_only_if_it_agrees(
    make_tiny_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_tiny_engine().runner.model
    assert timing_key(model, 8, 32) is None  # built in memory: nothing to key it by
    model.source = tmp_path / "m.gguf"
    model.source.write_bytes(b"GGUF")
    cache = TimingCache(tmp_path / "timings")

    def boot(*seconds: float) -> tuple[StepTimings, int]:
        clock = FakeClock(*seconds)
        monkeypatch.setattr(prefill_timing, "fastest", clock)
        timed = time_steps(
            model, max_batch=8, max_tokens=512, block_size=16, max_positions=128, cache=cache
        )
        return timed, clock.calls

    first, calls = boot(0.04, 0.2, 0.25)
    assert (first, calls) == (TIMINGS, 3)
    key = timing_key(model, 8, 32) or {}
    path = cache.path(key)
    second, calls = boot(0.045, 0.22, 0.24)  # one boot is not trusted: timed again
    assert (second, calls) == (StepTimings(0.04, 8, 0.2, 32, 0.24, boots=2), 3)
    third, calls = boot(0.049)  # two are, within 1.25x: the other shapes are not run
    assert (third, calls) == (dataclasses.replace(second, remembered=path), 1)
    fourth, calls = boot(0.08, 0.4, 0.5)  # twice as slow: timed again, the file started over
    assert (fourth, calls) == (StepTimings(0.08, 8, 0.4, 32, 0.5), 3)
    assert cache.load(key) == dataclasses.replace(fourth, remembered=path)
    fifth, calls = boot(0.079, 0.41, 0.45)
    assert (fifth, calls) == (StepTimings(0.079, 8, 0.4, 32, 0.45, boots=2), 3)
    assert boot(0.09)[1] == 1
    clock = FakeClock(0.04, 0.1, 0.25)
    monkeypatch.setattr(prefill_timing, "fastest", clock)
    other_rows = time_steps(
        model, max_batch=4, max_tokens=512, block_size=16, max_positions=128, cache=cache
    )
    assert other_rows == StepTimings(0.04, 4, 0.1, 32, 0.25)  # another shape, another key
    assert clock.runs == [2, 1, 1]  # remembered: the wide shapes once a boot
    clock = FakeClock(0.04, 0.1, 0.25)
    monkeypatch.setattr(prefill_timing, "fastest", clock)
    time_steps(model, max_batch=4, max_tokens=512, block_size=16, max_positions=128, cache=None)
    assert clock.runs == [2, 2, 2]  # nothing remembered: each the faster of two runs

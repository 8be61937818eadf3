"""The boot's step timings, remembered per machine and model: read back only for the same key,
trusted only after two boots and only when this boot's 1-row step agrees."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from nanoserve.runtime.engine.timing.step_timing import REPEATS, time_steps, timing_key
from nanoserve.runtime.engine.timing.timing_cache import StepTimings, TimingCache, file_identity

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TIMINGS = StepTimings(one_row_s=0.04, rows=8, rows_s=0.2, tokens=32, tokens_s=0.25)
KEY = {"weights": [["/m.gguf", 10, 1]], "shapes": [8, 32], "forms": ("bfloat16", "gguf")}


def test_agreement_is_within_the_tolerance_either_way() -> None:
    assert TIMINGS.agrees(0.04) and TIMINGS.agrees(0.0599) and TIMINGS.agrees(0.0267)
    assert not TIMINGS.agrees(0.0601) and not TIMINGS.agrees(0.0266)


def test_two_boots_remember_the_faster_of_each() -> None:
    later = StepTimings(one_row_s=0.05, rows=8, rows_s=0.18, tokens=32, tokens_s=0.3)
    remembered = dataclasses.replace(TIMINGS, remembered=Path("/t.json"))
    merged = later.fastest_with(remembered)
    assert merged == StepTimings(0.04, 8, 0.18, 32, 0.25, boots=2, remembered=Path("/t.json"))
    assert merged.trusted and not TIMINGS.trusted


def test_a_stored_timing_reads_back_under_its_key_only(tmp_path: Path) -> None:
    cache = TimingCache(tmp_path)
    assert cache.load(KEY) is None
    assert cache.store(KEY, TIMINGS)
    path = cache.path(KEY)
    assert cache.load(KEY) == dataclasses.replace(TIMINGS, remembered=path)
    assert cache.load({**KEY, "forms": ("float32", "gguf")}) is None
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left


def test_timings_of_other_shapes_than_the_key_names_are_none(tmp_path: Path) -> None:
    cache = TimingCache(tmp_path)
    cache.store(KEY, dataclasses.replace(TIMINGS, rows=16))
    assert cache.load(KEY) is None


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda saved: "{not json",
        lambda saved: "[]",
        lambda saved: "null",
        lambda saved: json.dumps({**saved, "version": 0}),
        lambda saved: json.dumps({**saved, "key": {"other": 1}}),  # a hash collision
        lambda saved: json.dumps({**saved, "timings": {"one_row_s": 0.04}}),
        lambda saved: json.dumps({**saved, "timings": {**saved["timings"], "rows_s": "0.2"}}),
        lambda saved: json.dumps({**saved, "timings": {**saved["timings"], "boots": None}}),
        lambda saved: json.dumps({**saved, "timings": {**saved["timings"], "boots": True}}),
        lambda saved: json.dumps({**saved, "timings": {**saved["timings"], "tokens_s": -1}}),
        lambda saved: json.dumps({**saved, "timings": {**saved["timings"], "rows": 8.5}}),
    ],
)
def test_a_file_that_does_not_say_what_was_stored_is_none(tmp_path: Path, corrupt: Any) -> None:
    cache = TimingCache(tmp_path)
    cache.store(KEY, TIMINGS)
    path = cache.path(KEY)
    path.write_text(corrupt(json.loads(path.read_text())))
    assert cache.load(KEY) is None


def test_a_cache_that_cannot_be_written_is_none(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert TimingCache.from_env({"NANOSERVE_TIMING_CACHE": str(blocked / "timings")}) is None
    gone = TimingCache(tmp_path / "missing")
    assert not gone.store(KEY, TIMINGS) and gone.load(KEY) is None


def test_the_cache_folder_follows_the_environment(tmp_path: Path) -> None:
    assert TimingCache.from_env({"NANOSERVE_TIMING_CACHE": "off"}) is None
    chosen = TimingCache.from_env({"NANOSERVE_TIMING_CACHE": str(tmp_path / "t")})
    assert chosen == TimingCache(tmp_path / "t") and (tmp_path / "t").is_dir()
    xdg = TimingCache.from_env({"XDG_CACHE_HOME": str(tmp_path)})
    assert xdg == TimingCache(tmp_path / "nanoserve" / "timings")


def test_a_rewritten_file_is_another_identity(tmp_path: Path) -> None:
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF" + bytes(8))
    before = file_identity(weights)
    assert before == [[str(weights.resolve()), 12, weights.stat().st_mtime_ns]]
    os.utime(weights, ns=(1, 2))
    assert file_identity(weights) != before
    assert file_identity(tmp_path / "gone.gguf") is None
    directory = tmp_path / "hf"
    (directory / "sub").mkdir(parents=True)
    (directory / "b.safetensors").write_bytes(b"xy")
    (directory / "a.json").write_bytes(b"{}")
    (directory / "sub" / "c.bin").write_bytes(b"z")  # a subfolder's files are not the model's
    named = [Path(str(f[0])).name for f in file_identity(directory) or []]
    assert named == ["a.json", "b.safetensors"]


class FakeClock:
    """Stands in for step_timing.fastest: each call returns the next of the given seconds."""

    def __init__(self, *seconds: float) -> None:
        self.seconds = list(seconds)
        self.runs: list[int] = []

    def __call__(self, run: Any, *, warm: bool = True, runs: int = REPEATS) -> float:
        self.runs.append(runs)
        return self.seconds.pop(0)


@pytest.fixture()
def model(make_tiny_engine: Any, tmp_path: Path) -> Any:
    model = make_tiny_engine().runner.model
    assert timing_key(model, 8, 32) is None  # built in memory: nothing to key it by
    model.weights_path = tmp_path / "m.gguf"
    model.weights_path.write_bytes(b"GGUF")
    return model


def boot(
    model: Any, cache: TimingCache | None, *seconds: float, rows: int = 8
) -> tuple[StepTimings, list[int]]:
    clock = FakeClock(*seconds)
    timed = time_steps(
        model,
        max_batch=rows,
        max_tokens=512,
        block_size=16,
        max_positions=128,
        cache=cache,
        timer=clock,
    )
    assert not clock.seconds  # every time given was asked for
    return timed, clock.runs


def test_a_later_boot_times_one_step_and_trusts_the_rest_only_if_it_agrees(
    model: Any, tmp_path: Path
) -> None:
    cache = TimingCache(tmp_path / "timings")
    cache.root.mkdir()
    key = timing_key(model, 8, 32) or {}
    path = cache.path(key)
    first, runs = boot(model, cache, 0.04, 0.2, 0.25)
    assert (first, runs) == (TIMINGS, [REPEATS, 1, 1])  # remembered: the wide shapes once a boot
    second, runs = boot(model, cache, 0.045, 0.22, 0.24)  # one boot is not trusted: timed again
    assert second == StepTimings(0.04, 8, 0.2, 32, 0.24, boots=2, remembered=path)
    third, runs = boot(model, cache, 0.049)  # two are, within 1.5x: the wide shapes not run
    assert (third, runs) == (second, [REPEATS])
    fourth, _ = boot(model, cache, 0.08, 0.4, 0.5)  # twice as slow: timed again, started over
    assert fourth == StepTimings(0.08, 8, 0.4, 32, 0.5)
    assert cache.load(key) == dataclasses.replace(fourth, remembered=path)
    fifth, _ = boot(model, cache, 0.05, 0.3, 0.3)  # a one-boot file that disagrees: over again
    assert fifth == StepTimings(0.05, 8, 0.3, 32, 0.3) and cache.load(key) is not None
    sixth, _ = boot(model, cache, 0.051, 0.29, 0.31)
    assert sixth == StepTimings(0.05, 8, 0.29, 32, 0.3, boots=2, remembered=path)
    assert boot(model, cache, 0.055)[1] == [REPEATS]


def test_another_shape_is_another_key(model: Any, tmp_path: Path) -> None:
    cache = TimingCache(tmp_path)
    boot(model, cache, 0.04, 0.2, 0.25)
    boot(model, cache, 0.04, 0.2, 0.25)
    wider, runs = boot(model, cache, 0.04, 0.1, 0.25, rows=4)  # the 1-row step agrees
    assert (wider, runs) == (StepTimings(0.04, 4, 0.1, 32, 0.25), [REPEATS, 1, 1])
    eight = cache.load(timing_key(model, 8, 32) or {})
    assert eight is not None and (eight.rows, eight.boots) == (8, 2)


def test_with_nothing_to_remember_each_shape_runs_twice(model: Any, tmp_path: Path) -> None:
    assert boot(model, None, 0.04, 0.2, 0.25)[1] == [REPEATS, REPEATS, REPEATS]
    cache = TimingCache(tmp_path / "timings")
    cache.root.mkdir()
    model.weights_path = None  # a model built in memory: the cache is there, but no key
    assert boot(model, cache, 0.04, 0.2, 0.25)[1] == [REPEATS, REPEATS, REPEATS]
    assert list(cache.root.iterdir()) == []

"""A shutdown during the boot stops it: the server's cancel event reaches the warm-up between
recordings, the boot says so in one line and is not a failure, and `nanoserve serve` exits
within a couple of seconds of SIGTERM or Ctrl-C, even from inside one long recording."""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from nanoserve.api.server import state as state_module
from nanoserve.api.server.settings import ServerSettings, add_options, values_from_args
from nanoserve.api.server.state import ServerState

CAPTURE = {"capture": True, "max_batch": 4, "max_model_len": 64, "width_multiple": 16}


def test_warm_seconds_from_flag_and_env() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser)
    args = parser.parse_args(["--warm-seconds", "12.5"])
    assert ServerSettings.from_values(values_from_args(args)).engine.warm_seconds == 12.5
    env = ServerSettings.from_env({"NANOSERVE_WARM_SECONDS": "4"})
    assert env.engine.warm_seconds == 4.0
    assert ServerSettings.from_env({}).engine.warm_seconds is None  # resolved by device


def run_boot(
    model_dir: Path, hold: Callable[[str, threading.Event], object]
) -> tuple[ServerState, list[str]]:
    """Start a ServerState's lifespan, let `hold` (called in the boot thread with each line)
    pause the boot, leave the lifespan (a shutdown) once the warm-up has been announced."""
    lines: list[str] = []
    announced = threading.Event()

    def say(line: str) -> None:
        lines.append(line)
        if line.startswith("warming"):
            announced.set()
            hold(line, server.cancel)

    values = {"model": str(model_dir), "kv_budget_bytes": 1 << 22, **CAPTURE}
    server = ServerState(ServerSettings.from_values(values), say=say)

    async def serve_until_warming() -> None:
        async with server.lifespan(None):  # type: ignore[arg-type]
            assert await asyncio.to_thread(announced.wait, 60)

    asyncio.run(serve_until_warming())
    return server, lines


def test_shutdown_during_the_warm_up_is_a_clean_stop(tiny_model_dir: Path) -> None:
    # The boot waits in its announcement until the shutdown sets the event, as a long list would.
    server, lines = run_boot(tiny_model_dir, lambda _, cancel: cancel.wait(30))
    assert server.engine is None and server.boot_error is None
    assert lines[-1] == "boot stopped after 2 of 12 warm recordings: shutting down"
    assert server.phase == "stopped" and not server.booting


def test_shutdown_does_not_wait_out_a_long_step(tiny_model_dir: Path) -> None:
    release = threading.Event()
    started = time.monotonic()
    # The boot is stuck in one step that ignores the event (a load, a wide CPU recording).
    server, lines = run_boot(tiny_model_dir, lambda _, __: release.wait(30))
    waited = time.monotonic() - started
    assert lines[-1].startswith("shutting down without waiting for the boot (at: warming 12")
    assert state_module.STOP_WAIT_SECONDS <= waited < state_module.STOP_WAIT_SECONDS + 10
    assert server.booting and server.boot_error is None
    release.set()  # the step ends; the boot then stops at its next boundary
    assert server.boot_thread is not None
    server.boot_thread.join(30)
    assert not server.booting and server.engine is None and server.boot_error is None


def serve_and_signal(
    start_server: Callable[..., Any], args: list[str], until: str, sig: signal.Signals
) -> tuple[int, float, str]:
    """Start `nanoserve serve`, wait until /health's phase starts with `until`, send `sig`;
    returns the exit code, the seconds from the signal to the exit, and the log."""
    live = start_server(*args, wait=False)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert live.proc.poll() is None, live.log()
        try:
            phase = httpx.get(f"{live.url}/health", timeout=2).json()["phase"]
        except httpx.TransportError:
            phase = ""
        if phase.startswith(until):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"never saw a phase starting with {until!r}:\n{live.log()}")
    live.proc.send_signal(sig)
    signalled = time.monotonic()
    try:
        code = live.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        live.kill()
        pytest.fail(f"still running 30 s after {sig.name}:\n{live.log()}")
    return code, time.monotonic() - signalled, live.log()


@pytest.mark.slow
def test_sigterm_during_the_warm_up_stops_it_between_recordings(
    start_server: Callable[..., Any],
) -> None:
    # 256 narrow shapes, a fraction of a second each: the signal lands between two of them.
    args = ["--capture", "--max-batch", "8", "--max-model-len", "1024", "--kv-budget", "256MiB"]
    args += ["--width-multiple", "16", "--warm-seconds", "600"]
    code, seconds, output = serve_and_signal(start_server, args, "warming", signal.SIGTERM)
    assert code == 0 and seconds < 3.0, (code, seconds, output)
    assert "warming 256 decode shapes (rows <= 8, width <= 1024): estimated " in output
    assert "boot stopped after " in output and " warm recordings: shutting down" in output
    assert "Traceback" not in output and "failed to start" not in output


@pytest.mark.slow
def test_ctrl_c_inside_a_long_step_exits_without_waiting_for_it(
    start_server: Callable[..., Any],
) -> None:
    # Pricing 32 x 4096 allocates a 1 GiB pool and records a step seconds long on a CPU: the
    # signal lands inside it, and the server leaves without waiting for its end.
    args = ["--capture", "--max-batch", "32", "--max-model-len", "4096"]
    args += ["--width-multiple", "64", "--warm-seconds", "600"]
    code, seconds, output = serve_and_signal(start_server, args, "pricing", signal.SIGINT)
    assert code == 0 and seconds < 3.0, (code, seconds, output)
    assert "shutting down without waiting for the boot (at: pricing 384 decode shapes" in output
    assert "Traceback" not in output and "failed to start" not in output

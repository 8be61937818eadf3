"""Ways to start the server, configured by NANOSERVE_* variables; the CLI's answers to bad input
as a process's exit (the answers themselves, in-process: test_cli.py)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def _check_configured(live: Any, max_model_len: int) -> None:
    """The NANOSERVE_* variables reached the engine: /v1/models reports the context limit."""
    models = httpx.get(f"{live.url}/v1/models", timeout=10)
    assert models.status_code == 200, models.text
    assert models.json()["data"][0]["max_model_len"] == max_model_len
    out = httpx.post(
        f"{live.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60
    )
    assert out.status_code == 200, out.text
    too_long = httpx.post(
        f"{live.url}/v1/completions", json={"prompt": "hi", "max_tokens": max_model_len}, timeout=60
    )
    assert too_long.status_code == 400, too_long.text


def _stop(live: Any) -> None:
    code = live.stop()
    # litestar's runner is plain uvicorn, which re-raises SIGTERM after a clean shutdown
    # (`nanoserve serve` exits 0 instead).
    assert code in (0, -signal.SIGTERM), f"exit {code}:\n{live.log()}"
    log = live.log()
    assert "Application shutdown complete" in log, log
    assert "Traceback" not in log, log


@pytest.fixture()
def nanoserve_env(tiny_model_dir: Path, clean_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return clean_env(
        NANOSERVE_MODEL=str(tiny_model_dir),
        NANOSERVE_MAX_BATCH="4",
        NANOSERVE_MAX_MODEL_LEN="128",
        NANOSERVE_KV_BUDGET="16MiB",
        NANOSERVE_GRACE_SECONDS="1",
    )


def test_litestar_app_factory(
    start_server: Callable[..., Any], litestar_bin: str, nanoserve_env: dict[str, str]
) -> None:
    live = start_server(
        cmd=[litestar_bin, "--app", "nanoserve.api.app:create_app", "run", "--port", "{port}"],
        env=nanoserve_env,
    )
    _check_configured(live, 128)
    _stop(live)


def test_litestar_run_from_repo_root(
    start_server: Callable[..., Any], litestar_bin: str, nanoserve_env: dict[str, str]
) -> None:
    live = start_server(
        cmd=[litestar_bin, "run", "--port", "{port}"], env=nanoserve_env, cwd=REPO_ROOT
    )
    _check_configured(live, 128)
    _stop(live)


def test_nanoserve_serve_reads_env(
    start_server: Callable[..., Any], nanoserve_env: dict[str, str]
) -> None:
    live = start_server(env=nanoserve_env)  # no flags: everything from NANOSERVE_*
    _check_configured(live, 128)
    code = live.stop()
    assert code == 0, live.log()


def test_chat_default_max_tokens_fits_a_small_pool(
    start_server: Callable[..., Any], tiny_model_dir: Path
) -> None:
    """A pool smaller than max_model_len: a chat that leaves max_tokens unset is served to what
    the pool holds, not refused."""
    live = start_server(str(tiny_model_dir), "--kv-budget", "64KiB", "--max-batch", "2")
    try:
        slots = httpx.get(f"{live.url}/health", timeout=10).json()["kv_pool"]["num_slots"]
        assert slots < 256  # the tiny model's max_model_len
        body = {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
        response = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == slots
    finally:
        code = live.stop()
    assert code == 0, live.log()


def test_boot_failure_exits_non_zero(
    run_cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """A model path that exists but is no model: the load fails after the port opened; the
    process still ends, non-zero, its last line the reason."""
    result = run_cli("serve", str(tmp_path), "--port", "0")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("nanoserve: ") and "config.json" in last, result.stderr


def test_serve_missing_model(run_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = run_cli("serve", "/no/such/path", "--port", "1")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "/no/such/path" in lines[0]
    assert result.stdout == ""


def test_generate(run_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = run_cli("generate", "hi", "--max-tokens", "4")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), result.stderr
    assert "Traceback" not in result.stderr


def test_kernels_that_cannot_be_built_are_one_line(
    run_cli: Callable[..., subprocess.CompletedProcess[str]],
    clean_env: Callable[..., dict[str, str]],
    tmp_path: Path,
) -> None:
    """An explicit q4 on a machine without a compiler: the reason, one line, exit non-zero;
    `--quantize auto` on the same machine says so and answers from dequantized weights."""
    env = clean_env(NANOSERVE_KERNEL_CACHE=str(tmp_path), CXX=str(tmp_path / "no-compiler"))
    result = run_cli("generate", "hi", "--max-tokens", "2", "--quantize", "q4", env=env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("nanoserve: the CPU kernels need a C++ compiler"), result.stderr
    result = run_cli("generate", "hi", "--max-tokens", "2", env=env)
    assert result.returncode == 0, result.stderr
    assert "cannot be built here, so gguf is served dequantized" in result.stderr
    assert result.stdout.strip()

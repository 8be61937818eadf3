"""A server started with --capture warms before it serves: /health is 503 while it records
the warm list, then 200 with the warm plan beside the pool plan, and no cold recording."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

pytestmark = pytest.mark.slow


def test_health_is_503_while_warming_then_reports_the_warm_plan() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable, "-m", "nanoserve.api.cli", "serve", "--port", str(port),
        "--max-batch", "4", "--max-model-len", "512", "--kv-budget", "256MiB",
        "--capture", "--width-multiple", "32", "--warm-max-width", "256",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    phases: list[str] = []
    body: dict = {}
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            try:
                response = httpx.get(url + "/health", timeout=2)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            if response.status_code == 200:
                body = response.json()
                break
            assert response.status_code == 503 and response.headers["retry-after"]
            phases.append(response.json()["phase"])
            time.sleep(0.05)
        assert body, f"not ready in time; phases seen: {phases[-3:]}"
        assert any(p.startswith("warming 24 decode shapes") for p in phases), set(phases)
        warm = body["warm"]
        # rows 1, 2, 4 x widths 32 .. 256: recorded biggest first, every one before serving.
        assert warm["num_shapes"] == 24 and warm["shapes"][0] == [4, 256]
        assert warm["max_rows"] == 4 and warm["max_width"] == 256 and warm["skipped"] == []
        assert warm["seconds"] > 0 and body["kv_pool"]["num_blocks"] > 0
        completion = httpx.post(
            url + "/v1/completions",
            json={
                "prompt": "Once upon a time",
                "max_tokens": 40,
                "temperature": 0,
                "ignore_eos": True,
            },
            timeout=60,
        )
        assert completion.status_code == 200
        metrics = httpx.get(url + "/metrics", timeout=5).text
        assert "nanoserve:graph_cold_recordings_total 0.0" in metrics
        assert "nanoserve:graph_replays_total 0.0" not in metrics  # the replays happened
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert "graphs=24 (frozen-call" in output

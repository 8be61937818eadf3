"""A server started with --capture warms before it serves: /health is 503 while it records
the warm list (its phase the estimate, said before the work), then 200 with the warm plan
beside the pool plan, the estimate beside the actual seconds, and no cold recording."""

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
        "--warm-seconds", "300",  # the whole list, however busy the machine
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
        # The estimate is the phase while the list is recorded (24 x ~0.1 s on a CPU).
        warming = [p for p in phases if p.startswith("warming 24 decode shapes")]
        assert warming, set(phases)
        head, tail = warming[0].split(" estimated ")
        assert head == "warming 24 decode shapes (rows <= 4, width <= 256):"
        assert "s/shape measured at 1x32 and 4x256); time budget 300 s, memory ceiling " in tail
        warm = body["warm"]
        # rows 1, 2, 4 x widths 32 .. 256: recorded biggest first, every one before serving.
        assert warm["num_shapes"] == 24 and warm["shapes"][0] == [4, 256]
        assert warm["max_rows"] == 4 and warm["max_width"] == 256 and warm["skipped"] == []
        assert warm["seconds"] > 0 and warm["estimated_seconds"] > 0
        assert warm["budget_seconds"] == 300.0 and warm["time_ceiling"] == 256
        assert [p["shape"] for p in warm["probes"]] == [[4, 256], [1, 32]]
        assert warm["width_ceiling"] > 256 and warm["budget_bytes"] > 0
        assert body["kv_pool"]["num_blocks"] > 0
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
        assert "nanoserve:decode_eager_fallback_steps_total 0.0" in metrics  # all listed
        assert "nanoserve:graph_replays_total 0.0" not in metrics  # the replays happened
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert "recordings=24 (frozen-call, est " in output and "0 by memory, 0 by time)" in output

"""Injected faults against live servers (NANOSERVE_FAULT, read by the test launcher
`python -m tests.faults serve`): each answers as the README's "Failure behaviour" says.

An engine failure (forward, sampler, K/V allocation, a hung step past --step-timeout): the
stream in flight ends with an error event in OpenAI's shape, a waiting non-streamed request gets
a 500 with that body, /health turns 503 with the reason, new requests get 503, and the process
exits non-zero within a bounded time. A tokenizer failure fails its one request (a 500) and the
server goes on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

ARGS = (
    "--max-batch",
    "4",
    "--max-model-len",
    "512",
    "--kv-budget",
    "64MiB",
    "--grace-seconds",
    "1",
)
# `nanoserve serve` with the engine NANOSERVE_FAULT asks for (the production boot reads no fault)
FAULTY = [sys.executable, "-m", "tests.faults", "serve", "--port", "{port}"]
LONG = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
EXIT_WITHIN_S = 30.0


def data_lines(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize(
    ("fault", "extra", "reason"),
    [
        ("forward@40", (), "injected fault: forward at 40"),
        ("sampler@40", (), "injected fault: sampler at 40"),
        ("alloc@40", (), "injected fault: alloc at 40"),
        ("hang@40", ("--step-timeout", "2"), "has not returned in 2 s"),
    ],
)
def test_an_engine_fault_fails_in_flight_turns_503_and_exits_non_zero(
    start_server: Callable[..., Any], clean_env, assert_openai_error, fault, extra, reason
) -> None:
    live = start_server(*ARGS, *extra, cmd=FAULTY, env=clean_env(NANOSERVE_FAULT=fault))
    results: dict[str, httpx.Response] = {}

    def whole() -> None:
        results["whole"] = httpx.post(f"{live.url}/v1/completions", json=LONG, timeout=60)

    other = threading.Thread(target=whole)
    other.start()
    time.sleep(0.05)  # both admitted long before step 40: in flight when it fails
    stream = httpx.post(f"{live.url}/v1/completions", json={**LONG, "stream": True}, timeout=60)
    other.join(60)
    # The stream: some tokens, then OpenAI's error object, then [DONE].
    lines = data_lines(stream)
    assert lines[-1] == "[DONE]", stream.text[-300:]
    error = json.loads(lines[-2])["error"]
    assert reason in error["message"] and error["type"] == "internal_server_error"
    assert len(lines) > 2  # tokens were streamed before the fault
    body = assert_openai_error(results["whole"], 500)
    assert reason in body["message"]
    # Until it exits: /health says why, new requests are refused with 503.
    try:
        health = httpx.get(f"{live.url}/health", timeout=5)
        assert health.status_code == 503 and reason in health.json()["error"]
        late = httpx.post(f"{live.url}/v1/completions", json={"prompt": "hi"}, timeout=5)
        assert_openai_error(late, 503)
    except httpx.TransportError:
        pass  # already gone: also as specified
    code = live.proc.wait(timeout=EXIT_WITHIN_S)
    assert code != 0, live.log()
    assert reason in live.log()


def test_a_tokenizer_fault_fails_one_request_and_the_server_goes_on(
    start_server: Callable[..., Any], clean_env, assert_openai_error
) -> None:
    live = start_server(*ARGS, cmd=FAULTY, env=clean_env(NANOSERVE_FAULT="tokenizer@2"))
    with httpx.Client(base_url=live.url, timeout=60) as http:
        first = http.post("/v1/completions", json={"prompt": "one", "max_tokens": 2})
        second = http.post("/v1/completions", json={"prompt": "two", "max_tokens": 2})
        third = http.post("/v1/completions", json={"prompt": "three", "max_tokens": 2})
        health = http.get("/health")
    assert first.status_code == 200 and third.status_code == 200
    error = assert_openai_error(second, 500)
    assert "injected fault: tokenizer at 2" in error["message"]
    assert health.status_code == 200 and health.json()["kv_pool"]["blocks_in_use"] == 0
    assert live.stop() == 0


def test_a_bad_fault_spec_is_one_line_and_a_non_zero_exit(clean_env) -> None:
    done = subprocess.run(
        [*(part.format(port=0) for part in FAULTY)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(NANOSERVE_FAULT="meteor@1"),
        cwd=Path(__file__).resolve().parents[3],
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode != 0
    assert "NANOSERVE_FAULT='meteor@1'" in done.stderr and "Traceback" not in done.stderr

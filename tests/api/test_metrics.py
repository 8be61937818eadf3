"""/metrics (Prometheus text, parsed by prometheus_client), /schema, and a client that leaves
mid-stream: its request is aborted and its blocks freed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

GAUGES = (
    "nanoserve:num_requests_running",
    "nanoserve:num_requests_waiting",  # the Gateway API Inference Extension's queue depth
    "nanoserve:kv_cache_usage_perc",  # ... and its KV utilization
    "nanoserve:kv_cache_blocks_total",
)
COUNTERS = (
    "nanoserve:prompt_tokens_total",
    "nanoserve:generation_tokens_total",
    'nanoserve:request_success_total{finished_reason="stop"}',
    'nanoserve:request_success_total{finished_reason="length"}',
    'nanoserve:request_success_total{finished_reason="abort"}',
)
HISTOGRAMS = (
    "nanoserve:time_to_first_token_seconds",
    "nanoserve:inter_token_latency_seconds",
    "nanoserve:e2e_request_latency_seconds",
)
ABORTED = 'nanoserve:request_success_total{finished_reason="abort"}'


def wait_freed(
    live: Any, metrics_of: Callable[..., dict[str, float]], timeout_s: float = 20.0
) -> dict[str, float]:
    """Poll /metrics until nothing runs and no K/V block is held."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics_of(live)
        if m["nanoserve:kv_cache_usage_perc"] == 0 and m["nanoserve:num_requests_running"] == 0:
            return m
        if time.monotonic() > deadline:
            gauges = {k: v for k, v in m.items() if k in GAUGES}
            pytest.fail(f"blocks still held {timeout_s:.0f} s after the client left: {gauges}")
        time.sleep(0.1)


def test_metric_names(server: Any, metrics_of: Callable[..., dict[str, float]]) -> None:
    m = metrics_of(server)
    for name in (*GAUGES, *COUNTERS):
        assert name in m, name
    for name in HISTOGRAMS:
        assert f"{name}_count" in m, name
        assert f"{name}_sum" in m, name
        assert f'{name}_bucket{{le="+Inf"}}' in m, name
    assert m["nanoserve:kv_cache_blocks_total"] > 0
    assert 0.0 <= m["nanoserve:kv_cache_usage_perc"] <= 1.0


def test_metrics_content_type(http: httpx.Client) -> None:
    response = http.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")


def test_counters_move(server: Any, http: httpx.Client, metrics_of: Callable[..., Any]) -> None:
    before = metrics_of(server)
    body = {"prompt": "Count: one, two,", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    assert http.post("/v1/completions", json=body).status_code == 200
    chunks = 0
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        chunks = sum(1 for line in response.iter_lines() if line.startswith("data: {"))
    assert chunks == 5
    after = metrics_of(server)
    prompt_len = before["nanoserve:prompt_tokens_total"]
    assert after["nanoserve:prompt_tokens_total"] > prompt_len
    assert (
        after["nanoserve:generation_tokens_total"]
        == before["nanoserve:generation_tokens_total"] + 10
    )
    key = 'nanoserve:request_success_total{finished_reason="length"}'
    assert after[key] == before[key] + 2
    for name in HISTOGRAMS:
        assert after[f"{name}_count"] > before[f"{name}_count"], name
        assert after[f"{name}_count"] == after[f'{name}_bucket{{le="+Inf"}}'], name
    ttft = "nanoserve:time_to_first_token_seconds_count"
    assert after[ttft] == before[ttft] + 2
    itl = "nanoserve:inter_token_latency_seconds_count"
    assert after[itl] >= before[itl] + 8  # 4 gaps per 5-token request
    assert after["nanoserve:num_requests_running"] == 0
    assert after["nanoserve:num_requests_waiting"] == 0


def test_schema(http: httpx.Client) -> None:
    response = http.get("/schema/openapi.json")
    assert response.status_code == 200
    spec = response.json()
    assert spec["openapi"].startswith("3.")
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"):
        assert path in spec["paths"], path
    assert http.get("/schema").status_code == 200


def test_health(http: httpx.Client) -> None:
    body = http.get("/health").json()
    assert body["status"] == "ok"
    assert body["kv_pool"]["blocks_in_use"] == 0
    assert body["kv_pool"]["num_blocks"] > 0


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_disconnect_mid_stream_frees_blocks(
    server: Any, metrics_of: Callable[..., dict[str, float]], route: str
) -> None:
    before = wait_freed(server, metrics_of)
    body: dict[str, Any] = {"max_tokens": 900, "stream": True, "ignore_eos": True, "n": 2}
    if route == "/v1/completions":
        body["prompt"] = "Write a very long story about a dragon."
    else:
        body["messages"] = [{"role": "user", "content": "Write a very long story."}]
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        client.stream("POST", route, json=body) as response,
    ):
        assert response.status_code == 200
        data: list[str] = []
        for line in response.iter_lines():
            if line.startswith("data: "):
                data.append(line)
            if len(data) >= 5:
                break
        during = metrics_of(server)
        assert during["nanoserve:num_requests_running"] == 2  # n=2: two sequences
        assert during["nanoserve:kv_cache_usage_perc"] > 0
    # The connection is closed: the server must notice, abort both samples, free their blocks.
    after = wait_freed(server, metrics_of)
    assert after["nanoserve:num_requests_waiting"] == 0
    assert after[ABORTED] >= before[ABORTED] + 2
    # ... and stay healthy.
    response = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_disconnect_before_answer_frees_blocks(
    server: Any, metrics_of: Callable[..., dict[str, float]], route: str
) -> None:
    """A client that gives up on a non-streamed answer: its request is aborted, not left to run
    to max_tokens for nobody."""
    before = wait_freed(server, metrics_of)
    body: dict[str, Any] = {"max_tokens": 900, "ignore_eos": True}
    if route == "/v1/completions":
        body["prompt"] = "Write a very long story about a dragon."
    else:
        body["messages"] = [{"role": "user", "content": "Write a very long story."}]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}{route}", json=body, timeout=httpx.Timeout(60, read=1.5))
    after = wait_freed(server, metrics_of, timeout_s=10)
    assert after[ABORTED] == before[ABORTED] + 1
    assert (
        after["nanoserve:generation_tokens_total"]
        < before["nanoserve:generation_tokens_total"] + 900
    )

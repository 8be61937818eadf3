"""/metrics (Prometheus text, parsed by prometheus_client), and a client that leaves mid-stream:
its request is aborted and its blocks freed.

Names and values are read from the engine's status: shown exactly over a FakeEngine. That the
numbers move with real work, and that a client gone frees real blocks: the live server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nanoserve.core.draft_budget import DraftCost
from nanoserve.runtime.decode.recordings import RecordingStats
from nanoserve.runtime.engine.engine_status import PrefixCacheCounts
from nanoserve.runtime.engine.speculation.speculator import SpecCounts
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server

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
ZERO_GRAPHS = {
    "nanoserve:graph_recordings_total": 0.0,
    "nanoserve:graph_cold_recordings_total": 0.0,
    "nanoserve:graph_replays_total": 0.0,
    "nanoserve:decode_eager_fallback_steps_total": 0.0,
    "nanoserve:graph_needed_bytes": 0.0,
    "nanoserve:graph_pool_bytes": 0.0,
    "nanoserve:graph_pool_sharing_ratio": 0.0,
}
ZERO_SPEC = {  # speculation off: its series are there, at zero
    "nanoserve:spec_decode_num_drafts_total": 0.0,
    "nanoserve:spec_decode_num_draft_tokens_total": 0.0,
    "nanoserve:spec_decode_num_accepted_tokens_total": 0.0,
    "nanoserve:spec_decode_acceptance_rate": 0.0,
    "nanoserve:spec_decode_verify_steps_total": 0.0,
}


def samples(text: str) -> dict[str, float]:
    """{sample name{labels}: value} of a Prometheus text body."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def engine_series(text: str) -> dict[str, float]:
    """The series read from the engine's status (the latency histograms left out)."""
    return {k: v for k, v in samples(text).items() if not k.startswith(HISTOGRAMS)}


# -- in-process, over a FakeEngine ---------------------------------------------------------------


@pytest.mark.anyio
async def test_metric_values_are_the_engine_status() -> None:
    fake = FakeEngine(
        num_pending=1,
        status_fields={
            "running": 3,
            "waiting_requests": 2,
            "waiting": 4,  # samples, not requests: not what the endpoint picker reads
            "kv_cache_usage": 0.375,
            "prefix_cache": PrefixCacheCounts(queried_tokens=40, hit_tokens=10),
            "prompt_tokens": 123,
            "generation_tokens": 456,
            "finished": {"stop": 4, "length": 2},
            "pooling_requests": 7,
            "pooling_tokens": 89,
        },
    )
    async with fake_server(fake) as (client, _):
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert engine_series(response.text) == {
        "nanoserve:num_requests_running": 3.0,
        "nanoserve:num_requests_waiting": 2.0 + 1.0,  # waiting requests + not yet handed over
        "nanoserve:kv_cache_usage_perc": 0.375,
        "nanoserve:kv_cache_blocks_total": 8.0,
        'nanoserve:cache_config_info{block_size="16",cache_dtype="float32",num_gpu_blocks="8"}': 1.0,
        "nanoserve:prefix_cache_hit_rate": 0.25,
        "nanoserve:prompt_tokens_total": 123.0,
        "nanoserve:generation_tokens_total": 456.0,
        "nanoserve:pooling_requests_total": 7.0,
        "nanoserve:pooling_prompt_tokens_total": 89.0,
        "nanoserve:prefix_cache_queries_total": 40.0,
        "nanoserve:prefix_cache_hits_total": 10.0,
        'nanoserve:request_success_total{finished_reason="stop"}': 4.0,
        'nanoserve:request_success_total{finished_reason="length"}': 2.0,
        'nanoserve:request_success_total{finished_reason="abort"}': 0.0,
        **ZERO_GRAPHS,  # eager: no recordings, the series still there
        **ZERO_SPEC,
    }


@pytest.mark.anyio
async def test_speculation_metrics_are_the_speculators_counters() -> None:
    counts = SpecCounts(
        method="ngram",
        num_speculative_tokens=3,
        cost=DraftCost(base_s=0.02, per_row_s=0.001, switch_s=0.0005, per_draft_s=0.002),
        prices={"decode_s": {1: 0.021}, "draft_s": {1: 0.003}},
        drafts=10,
        draft_tokens=24,
        accepted_tokens=18,
        accepted_per_position=(9, 6, 3),
        verify_steps=8,
        proposer="prompt lookup of 1..3-grams",
    )
    async with fake_server(FakeEngine(status_fields={"speculation": counts})) as (client, _):
        series = engine_series((await client.get("/metrics")).text)
        health = (await client.get("/health")).json()
    assert {k: series[k] for k in ZERO_SPEC} == {
        "nanoserve:spec_decode_num_drafts_total": 10.0,
        "nanoserve:spec_decode_num_draft_tokens_total": 24.0,
        "nanoserve:spec_decode_num_accepted_tokens_total": 18.0,
        "nanoserve:spec_decode_acceptance_rate": 0.75,
        "nanoserve:spec_decode_verify_steps_total": 8.0,
    }
    per_position = "nanoserve:spec_decode_num_accepted_tokens_per_pos_total"
    assert [series[f'{per_position}{{position="{i}"}}'] for i in range(3)] == [9.0, 6.0, 3.0]
    assert health["speculation"]["acceptance_rate"] == 0.75
    assert health["speculation"]["proposer"] == "prompt lookup of 1..3-grams"
    assert health["speculation"]["cost"]["per_draft_s"] == 0.002
    assert health["speculation"]["prices"] == {"decode_s": {"1": 0.021}, "draft_s": {"1": 0.003}}


@pytest.mark.anyio
async def test_graph_metrics_are_the_recordings_counters() -> None:
    recordings = RecordingStats(
        backend="cuda-graph",
        recordings=24,
        cold_recordings=1,
        replays=900,
        eager_fallback_steps=7,
        shapes=24,
        logits_buffer_bytes=1 << 20,
        needed_bytes=5 << 25,
        pool_bytes=1 << 26,
        pool_sharing_ratio=2.5,
    )
    async with fake_server(FakeEngine(recordings=recordings)) as (client, _):
        series = engine_series((await client.get("/metrics")).text)
    assert {k: series[k] for k in ZERO_GRAPHS} == {
        "nanoserve:graph_recordings_total": 24.0,
        "nanoserve:graph_cold_recordings_total": 1.0,
        "nanoserve:graph_replays_total": 900.0,
        "nanoserve:decode_eager_fallback_steps_total": 7.0,
        "nanoserve:graph_needed_bytes": float(5 << 25),
        "nanoserve:graph_pool_bytes": float(1 << 26),
        "nanoserve:graph_pool_sharing_ratio": 2.5,
    }


@pytest.mark.anyio
async def test_latency_histograms_are_fed_by_each_answer() -> None:
    # "Hello!": 6 tokens, the k-th at k/4 s on the fake clock.
    async with fake_server(FakeEngine()) as (client, _):
        before = samples((await client.get("/metrics")).text)
        assert (await client.post("/v1/completions", json={"prompt": "Hi"})).status_code == 200
        body = {"prompt": "Hi", "n": 2, "stream": True}
        assert (await client.post("/v1/completions", json=body)).status_code == 200
        after = samples((await client.get("/metrics")).text)
    assert all(before[f"{name}_count"] == 0 for name in HISTOGRAMS)
    ttft, itl, e2e = HISTOGRAMS
    # The first answer: one request, 5 gaps; the second, n=2 samples interleaved on one clock.
    assert (after[f"{ttft}_count"], after[f"{ttft}_sum"]) == (2, 0.25 + 0.25)
    assert after[f'{ttft}_bucket{{le="0.1"}}'] == 0 and after[f'{ttft}_bucket{{le="0.25"}}'] == 2
    assert (after[f"{itl}_count"], after[f"{itl}_sum"]) == (5 + 10, 5 * 0.25 + 10 * 0.5)
    assert (after[f"{e2e}_count"], after[f"{e2e}_sum"]) == (2, 1.5 + 3.0)
    for name in HISTOGRAMS:
        assert after[f"{name}_count"] == after[f'{name}_bucket{{le="+Inf"}}'], name


# -- against the live server ---------------------------------------------------------------------


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


@pytest.mark.slow
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


@pytest.mark.slow
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
        # Held, not dropped: a finalized iter_lines generator closes the stream, and the server
        # would see the client leave before `during` is read.
        lines = response.iter_lines()
        for line in lines:
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


@pytest.mark.slow
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

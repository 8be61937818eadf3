"""The app around the routes: /health from the engine's status, the boot's 503s, the lifespan's
start and shutdown of the engine, the OpenAPI schema. In-process, over a FakeEngine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import anyio
import pytest

from nanoserve.api.server.engine_client import EngineClient
from nanoserve.api.server.settings import ServerSettings
from nanoserve.api.server.state import ServerState
from nanoserve.core import Shape
from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.core.warm_list import RecordingCost
from nanoserve.runtime.decode.recordings import RecordingStats
from nanoserve.runtime.decode.warmup import WarmEstimate, WarmPlan, WarmupCancelled, WarmupReport
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error

pytestmark = pytest.mark.anyio

KV_POOL = {  # fake_engine.POOL: 8 blocks of 16 slots, 2 layers x 2 heads x 16 dims, fp32
    "num_layers": 2,
    "num_kv_heads": 2,
    "head_dim": 16,
    "dtype": "float32",
    "kv_cache_dtype": "float32",
    "block_size": 16,
    "num_blocks": 8,
    "num_slots": 128,
    "sink_slot": 128,
    "bytes_per_block": 16 * 2 * 2 * 2 * 16 * 4,
    "total_bytes": 129 * 2 * 2 * 2 * 16 * 4,
}
GRAPHS = RecordingStats(
    backend="frozen-call",
    recordings=3,
    cold_recordings=0,
    replays=40,
    eager_fallback_steps=2,
    shapes=3,
    logits_buffer_bytes=4096,
    needed_bytes=3 << 20,
    pool_bytes=0,
    pool_sharing_ratio=0.0,
)
SHAPES = (Shape(2, 32), Shape(1, 32))
REPORT = WarmupReport(
    plan=WarmPlan(
        shapes=SHAPES, skipped=(), max_rows=2, max_width=32, budget_bytes=1 << 20, width_ceiling=64
    ),
    estimate=WarmEstimate(
        shapes=SHAPES,
        skipped=(),
        probes=((Shape(2, 32), 0.5), (Shape(1, 32), 0.25)),
        cost=RecordingCost(fixed_seconds=0.25, seconds_per_position=0.00390625),
        pool_seconds=0.125,
        seconds=0.875,
        budget_seconds=30.0,
        time_ceiling=None,
    ),
    seconds=(0.5, 0.25),
    total_seconds=0.875,
    pool_bytes=0,
    backend="frozen-call",
)


async def test_health_when_ready() -> None:
    async with fake_server(FakeEngine(status_fields={"blocks_in_use": 3})) as (client, _):
        response = await client.get("/health")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "model": "fake-model",
        "dtype": "float32",
        "quantize": None,
        "device": "cpu",
        "cpu": "AVX2 (avx2 fma f16c)",
        "threads": 2,
        "kernels": "float32 torch/mkl",
        "weights": None,
        "weight_fallbacks": None,
        "decode_mode": "eager",
        "prefill_budget": None,
        "ready_seconds": 0.25,
        "kv_pool": {**KV_POOL, "blocks_in_use": 3},
        "kv_cache_dtype": "float32",
        "state_pool": None,
        "warm": None,
        "capture": None,
        "speculation": None,
        "task": "generate",
        "pooler": None,
        "experts": None,
    }


async def test_health_shows_a_hybrids_state_pool() -> None:
    # 6 slots (2 of them checkpoints) + the sink, two conv windows of 8x2 fp32
    state = StatePoolPlan(6, ((8, 2), (8, 2)), checkpoint_slots=2)
    fields = {"state": state, "state_slots_in_use": 1}
    async with fake_server(FakeEngine(status_fields=fields)) as (client, _):
        body = (await client.get("/health")).json()
    assert body["state_pool"] == {
        "num_state_slots": 6,
        "sink_state_slot": 6,
        "state_bytes_per_slot": 128,
        "state_total_bytes": 896,
        "state_checkpoint_slots": 2,
        "state_checkpoint_bytes": 256,
        "tensors": 2,
        "state_slots_in_use": 1,
    }


async def test_health_names_the_weight_types_served() -> None:
    fields = {"weights": "q5_0×133 q8_0×13", "weight_fallbacks": "f16×1 as q8_0 (re-quantized)"}
    async with fake_server(FakeEngine(status_fields=fields)) as (client, _):
        body = (await client.get("/health")).json()
    assert body["weights"] == "q5_0×133 q8_0×13"
    assert body["weight_fallbacks"] == "f16×1 as q8_0 (re-quantized)"


async def test_health_reports_the_warm_up_and_the_recordings() -> None:
    fake = FakeEngine(warm=REPORT, recordings=GRAPHS)
    async with fake_server(fake) as (client, _):
        body = (await client.get("/health")).json()
    assert body["decode_mode"] == "recorded"
    assert body["capture"] == {
        "backend": "frozen-call",
        "recordings": 3,
        "cold_recordings": 0,
        "replays": 40,
        "eager_fallback_steps": 2,
        "shapes": 3,
        "logits_buffer_bytes": 4096,
        "needed_bytes": 3 << 20,
        "pool_bytes": 0,
        "pool_sharing_ratio": 0.0,
    }
    warm = body["warm"]
    assert warm == REPORT.as_dict()
    assert warm["shapes"] == [[2, 32], [1, 32]] and warm["num_shapes"] == 2
    assert warm["probes"] == [
        {"shape": [2, 32], "seconds": 0.5},
        {"shape": [1, 32], "seconds": 0.25},
    ]


def held_boot(
    config: EngineConfig, say: Callable[[str], None], cancel: threading.Event
) -> EngineClient:
    """A boot that loads until the shutdown cancels it, as a long warm-up would."""
    say("loading fake-model")
    cancel.wait(10)
    raise WarmupCancelled("boot stopped during the load")


async def test_503_while_booting() -> None:
    async with fake_server(factory=held_boot, wait=False) as (client, server):
        with anyio.fail_after(5):
            while server.phase != "loading fake-model":
                await asyncio.sleep(0.001)
        health = await client.get("/health")
        assert health.status_code == 503
        assert health.json() == {"status": "starting", "phase": "loading fake-model", "error": None}
        assert health.headers["retry-after"] == "2"
        for method, path, body in (
            ("POST", "/v1/completions", {"prompt": "hi"}),
            ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            ("GET", "/v1/models", None),
        ):
            response = await client.request(method, path, json=body)
            openai_error(
                response,
                503,
                type="service_unavailable",
                message="the model is still loading; retry shortly",
            )
            assert response.headers["retry-after"] == "2"
        # /metrics answers from the start: the latency series, no engine series yet.
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert "nanoserve:time_to_first_token_seconds_count 0.0" in metrics.text
        assert "nanoserve:num_requests_running" not in metrics.text
    # The shutdown cancelled the boot: a clean stop, not a failure.
    assert server.phase == "stopped" and server.boot_error is None and server.engine is None


def failed_boot(
    config: EngineConfig, say: Callable[[str], None], cancel: threading.Event
) -> EngineClient:
    say("loading /models/missing")
    raise FileNotFoundError("no config.json in /models/missing")


async def test_503_after_a_failed_boot() -> None:
    """The reason is given, less its path: the console and the log have that."""
    error = "FileNotFoundError: no config.json in <path>"
    async with fake_server(factory=failed_boot) as (client, server):
        health = await client.get("/health")
        response = await client.post("/v1/completions", json={"prompt": "hi"})
    assert server.boot_error == error
    assert health.status_code == 503
    assert health.json() == {"status": "failed", "phase": "loading <path>", "error": error}
    openai_error(response, 503, message=f"the engine failed to start: {error}")
    assert "retry-after" not in response.headers  # retrying will not help


async def test_a_failed_boot_is_reported_to_its_owner() -> None:
    failures: list[BaseException] = []
    server = ServerState(
        ServerSettings(),
        say=lambda _: None,
        on_boot_failure=failures.append,
        engine_factory=failed_boot,
    )
    async with server.lifespan(None):  # type: ignore[arg-type]
        with anyio.fail_after(5):
            while server.boot_error is None:
                await asyncio.sleep(0.001)
    assert [type(f) for f in failures] == [FileNotFoundError]


async def test_the_lifespan_starts_and_shuts_down_the_engine() -> None:
    fake = FakeEngine()
    async with fake_server(fake, grace_seconds=3.0) as (_, server):
        assert server.engine is fake and server.phase == "ready"
        assert fake.started and fake.shutdown_grace is None
        assert fake.observer == server.metrics.observe  # streams' times reach /metrics
    assert fake.shutdown_grace == 3.0


async def test_schema_lists_every_route() -> None:
    async with fake_server() as (client, _):
        response = await client.get("/schema/openapi.json")
        assert (await client.get("/schema")).status_code == 200
    assert response.status_code == 200
    spec = response.json()
    assert spec["openapi"].startswith("3.")
    assert spec["info"]["title"] == "nanoserve"
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"):
        assert path in spec["paths"], path

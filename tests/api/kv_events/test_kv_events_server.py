"""KV events wired into the server: `--kv-events-config` starts the publisher, /metrics counts
it, /reset_prefix_cache clears; on a live `nanoserve serve`, the stored blocks' token ids are
the render route's ids, block by block (what llm-d's indexer hashes)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from nanoserve.api.kv_events.config import KVEventsConfig
from nanoserve.runtime.engine.step.kv_events import BlockStored
from tests.api import kv_subscriber as sub
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server


@pytest.mark.anyio
async def test_the_config_starts_the_publisher_and_metrics_count_it(tmp_path: Path) -> None:
    fake = FakeEngine()
    config = KVEventsConfig(
        enable_kv_cache_events=True,
        endpoint=f"ipc://{tmp_path}/pub",
        replay_endpoint=f"ipc://{tmp_path}/replay",
    )
    async with fake_server(fake, kv_events=config) as (client, server):
        assert fake.kv_sink is not None and server.kv_events is not None
        fake.kv_sink([BlockStored((1, 2), None, (5, 6, 7, 8), 2)])
        deadline = time.monotonic() + 5
        while server.kv_events.counts()[0] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        text = (await client.get("/metrics")).text
        reset = await client.post("/reset_prefix_cache")
    assert "nanoserve:kv_events_published_total 1.0" in text  # one event (of two blocks)
    assert "nanoserve:kv_events_batches_dropped_total 0.0" in text
    assert "nanoserve:kv_events_publisher_up 1.0" in text
    assert reset.status_code == 200 and reset.json() == {"cleared_blocks": 0}
    assert fake.resets == 1


@pytest.mark.anyio
async def test_off_by_default() -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, server):
        text = (await client.get("/metrics")).text
    assert fake.kv_sink is None and server.kv_events is None
    assert "kv_events" not in text


@pytest.mark.slow
def test_a_live_server_publishes_the_blocks_it_caches(
    start_server: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config: dict[str, Any] = {
        "enable_kv_cache_events": True,
        "endpoint": f"ipc://{tmp_path}/pub",
        "replay_endpoint": f"ipc://{tmp_path}/replay",
        "topic": "kv@pod@tiny",
    }
    args = ["--block-size", "16", "--kv-events-config", json.dumps(config)]
    live = start_server(str(tiny_model_dir), *args)
    assert "KV-cache events: map events on ipc://" in live.log()
    system = {"role": "system", "content": "You are a helpful assistant. " * 6}
    body: dict[str, Any] = {
        "messages": [system, {"role": "user", "content": "hi"}],
        "max_tokens": 3,
    }
    with httpx.Client(base_url=live.url, timeout=30) as http:
        ids = http.post("/v1/chat/completions/render", json=body).json()["token_ids"]
        for question in ("hi", "hello", "hey"):
            body["messages"][1]["content"] = question
            assert http.post("/v1/chat/completions", json=body).status_code == 200
        time.sleep(0.3)  # the publisher thread sends within milliseconds
        messages = sub.replay(config["replay_endpoint"], 0)
        assert http.post("/reset_prefix_cache").json()["cleared_blocks"] > 0
        time.sleep(0.3)
        after = sub.replay(config["replay_endpoint"], 0)
    assert messages[0].batch.events == [sub.Cleared()]  # the stream starts from a known state
    stored = [e for m in messages for e in m.batch.events if isinstance(e, sub.Stored)]
    first = stored[0]
    assert first.parent_block_hash is None and first.block_size == 16
    assert first.token_ids == ids[: len(first.token_ids)]  # the render's ids, whole blocks
    assert len(sub.held(messages)) >= len(ids) // 16  # the shared prompt, cached once
    assert after[-1].batch.events == [sub.Cleared()] and sub.held(after) == frozenset()
    assert live.stop() == 0

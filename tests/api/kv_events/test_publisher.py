"""The KV-event publisher over real ZMQ sockets, checked by a subscriber written from the wire
format (kv_subscriber.py): live and replayed streams rebuild the engine's cached block set
exactly; a late subscriber catches up; a dead one costs nothing; vLLM's older array format."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nanoserve.api.kv_events.config import KVEventsConfig
from nanoserve.api.kv_events.publisher import KVEventPublisher
from nanoserve.runtime.engine.config.engine_config import EngineConfigError
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step.kv_events import AllBlocksCleared, BlockStored
from tests.api import kv_subscriber as sub

TOPIC = "kv@127.0.0.1:8000@tiny"
IDS = itertools.count()


def test_the_config_takes_vllm_keys_and_defaults() -> None:
    on = KVEventsConfig.parse('{"enable_kv_cache_events": true}')
    assert on.enabled and on.publisher == "zmq" and on.endpoint == "tcp://*:5557"
    assert (on.buffer_steps, on.hwm, on.max_queue_size, on.topic) == (10_000, 100_000, 100_000, "")
    assert on.binds and not KVEventsConfig(endpoint="tcp://10.0.0.1:5557").binds
    assert not KVEventsConfig.parse("{}").enabled
    assert not KVEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "null"}').enabled


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope", "not JSON"),
        ("[]", "JSON object"),
        ('{"enable_kv_cache_events": 1}', "true or false"),
        ('{"publisher": "kafka"}', "null or zmq"),
        ('{"buffer_steps": 0}', "positive integer"),
        ('{"event_format": "xml"}', "map or array"),
        ('{"endpont": "tcp://*:1"}', "unknown key 'endpont'"),
    ],
)
def test_a_bad_config_is_one_line(text: str, message: str) -> None:
    with pytest.raises(EngineConfigError, match=message):
        KVEventsConfig.parse(text)


@pytest.fixture(scope="module")
def tiny_engine_factory(tiny_model_dir: Path) -> Callable[..., Any]:
    from nanoserve.runtime.engine.boot.build import build_engine
    from nanoserve.runtime.engine.config.engine_config import EngineConfig

    def build(blocks: int = 256) -> Any:
        config = EngineConfig(
            model=str(tiny_model_dir),
            dtype="float32",
            quantize="none",
            block_size=4,
            max_model_len=128,
            kv_budget_bytes=blocks
            * 4
            * 2
            * 2
            * 2
            * 16
            * 4,  # blocks x 4 slots x K,V x layers x heads x dim x fp32
            prefill_budget="off",
        )
        engine = build_engine(config, say=lambda _: None)
        assert blocks - 2 <= engine.pool_plan.num_blocks <= blocks
        return engine

    return build


@pytest.fixture
def publish(tmp_path: Path) -> Iterator[Callable[..., tuple[KVEventPublisher, str, str]]]:
    made: list[KVEventPublisher] = []

    def start(**config: Any) -> tuple[KVEventPublisher, str, str]:
        endpoint, replay = (
            f"ipc://{tmp_path}/pub-{len(made)}",
            f"ipc://{tmp_path}/replay-{len(made)}",
        )
        settings = KVEventsConfig(
            enable_kv_cache_events=True,
            endpoint=endpoint,
            replay_endpoint=replay,
            topic=TOPIC,
            **config,
        )
        publisher = KVEventPublisher(settings, medium="CPU")
        made.append(publisher)
        return publisher, endpoint, replay

    yield start
    for publisher in made:
        publisher.close()


def workload(engine: Any, seed: int, count: int, *, shared: int, max_tokens: int = 8) -> None:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 320) for _ in range(shared)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(count):
        prompt = prefix + [rng.randrange(3, 320) for _ in range(rng.randint(1, 24))]
        engine.add_request(f"r{next(IDS)}", prompt, params)
        if i % 3 == 2:
            engine.step()
    engine.run_until_done()


def settled(publisher: KVEventPublisher) -> int:
    """Wait until every offered batch is sent; the number of the last one."""
    deadline = time.monotonic() + 10
    while publisher.counts()[0] < publisher.queue.offered_batches:
        assert time.monotonic() < deadline, "the publisher fell behind"
        time.sleep(0.005)
    return publisher.counts()[0] - 1


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny-model steps on 2 shared cores run far faster on one intra-op thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_live_and_replayed_streams_rebuild_the_cache(tiny_engine_factory, publish) -> None:
    engine = tiny_engine_factory(blocks=24)  # small: preemption and eviction happen
    publisher, endpoint, replay_at = publish()
    live = sub.subscribe(endpoint, b"kv@")
    time.sleep(0.2)  # a SUB joins late (ZMQ's slow joiner): whatever it missed, replay has
    engine.attach_kv_events(publisher.sink)
    checks = []
    for round_, shared in enumerate((16, 16, 0, 30)):
        workload(engine, round_, 10, shared=shared, max_tokens=12)
        if round_ == 2:
            engine.reset_prefix_cache()
        last = settled(publisher)
        replayed = sub.replay(replay_at, 0)
        assert [m.seq for m in replayed] == list(range(last + 1))
        assert sub.held(replayed) == engine.blocks.cached_keys()
        checks.append(len(engine.blocks.cached_keys()))
    assert checks[2] == 0 < min(checks[0], checks[1], checks[3])  # round 2 ended in a reset
    assert engine.status().prefix_cache.hit_tokens > 0
    streamed = sub.drain(live, until_seq=last)
    seen = {m.seq for m in streamed}
    missed = [m for m in sub.replay(replay_at, 0) if m.seq not in seen]
    assert sub.held(streamed + missed) == engine.blocks.cached_keys()
    first = sorted(streamed + missed, key=lambda m: m.seq)[0]
    assert first.topic == TOPIC.encode() and first.batch.events == [sub.Cleared()]
    assert first.batch.data_parallel_rank == 0
    stored = [e for m in streamed for e in m.batch.events if isinstance(e, sub.Stored)]
    assert stored and all(e.medium == "CPU" and e.lora_id is None for e in stored)
    assert any(isinstance(e, sub.Removed) for m in streamed for e in m.batch.events)
    live.close()


def test_a_late_subscriber_catches_up_from_where_it_starts(publish) -> None:
    publisher, _, replay_at = publish(buffer_steps=5)
    for i in range(8):
        publisher.sink([BlockStored((i,), None, (i, i), 2)])
    settled(publisher)
    kept = sub.replay(replay_at, 0)
    assert [m.seq for m in kept] == [3, 4, 5, 6, 7]  # buffer_steps: the last 5
    assert [m.seq for m in sub.replay(replay_at, 6)] == [6, 7]
    assert sub.replay(replay_at, 100) == []
    assert sub.held(kept) == {3, 4, 5, 6, 7}


def test_a_dead_subscriber_costs_nothing(publish) -> None:
    publisher, endpoint, _ = publish(hwm=10)
    dead = sub.subscribe(endpoint)
    dead.setsockopt(sub.zmq.RCVHWM, 1)
    time.sleep(0.1)
    for i in range(3000):  # never read: ZMQ drops past the high-water mark, nothing waits
        publisher.sink([BlockStored((i,), None, (i,), 1)])
        if i == 1500:
            dead.close()
    settled(publisher)
    batches, events, dropped, _ = publisher.counts()
    assert (batches, events, dropped) == (3000, 3000, 0)


def test_the_older_array_format(publish) -> None:
    publisher, _, replay_at = publish(event_format="array")
    publisher.sink([AllBlocksCleared(), BlockStored((7, 8), None, (1, 2, 3, 4), 2)])
    settled(publisher)
    [message] = sub.replay(replay_at, 0, arrays=True)
    cleared, stored = message.batch.events
    assert isinstance(cleared, sub.ClearedArray)
    assert stored == sub.StoredArray([7, 8], None, [1, 2, 3, 4], 2, None, "CPU", None)


def test_a_full_queue_drops_and_counts() -> None:
    from nanoserve.runtime.engine.step.kv_events import KVEventQueue

    queue = KVEventQueue(1)
    assert queue.offer([AllBlocksCleared()]) and not queue.offer([AllBlocksCleared()])
    assert queue.dropped_batches == 1

"""KV-cache events: the publisher's throughput, and the engine's step time with events on and off.

    python -m benchmarks.kv_events [--rounds 5] [--batches 20000]

- publish: `--batches` batches of 4 events (BlockStored of one 16-token block each, the common
  case: a step fills a block for several sequences) offered to a KVEventPublisher as fast as
  the step thread could, with a live SUB subscriber decoding every message in a thread of its
  own. events/s is events sent / seconds from the first offer to the last send; received
  counts what the subscriber decoded (a PUB drops what a slow subscriber cannot take).
- step: the embedded model as `nanoserve serve` builds it, 8 chat-sized requests at once (a
  shared 96-token system prefix and distinct questions, 48 tokens each, greedy), run to the
  end; ms/step is wall seconds / steps. Rounds alternate events off and on (a publisher with a
  subscriber attached), so the machine's drift moves both; the ratio is the median of the
  rounds' on / off.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time

import msgspec

from benchmarks.common import cpu_line, pin_threads, table, write_csv
from nanoserve.api.kv_events.config import KVEventsConfig
from nanoserve.api.kv_events.publisher import KVEventPublisher
from nanoserve.runtime.engine.boot.build import build_engine
from nanoserve.runtime.engine.config.engine_config import SERVER_DEFAULTS, EngineConfig
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step.kv_events import BlockStored


def reader(endpoint: str, stop: threading.Event, counts: list[int]) -> threading.Thread:
    import zmq

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(endpoint)

    def run() -> None:
        while not stop.is_set() or sub.poll(50):
            if sub.poll(50):
                _, _, payload = sub.recv_multipart()
                counts[0] += len(msgspec.msgpack.decode(payload)[1])
        sub.close(linger=0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.3)  # the subscription reaches the publisher
    return thread


def publish_round(batches: int, folder: str, round_: int) -> dict[str, object]:
    endpoint = f"ipc://{folder}/bench-{round_}"
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint, hwm=0)
    publisher = KVEventPublisher(config, medium="CPU")
    stop, received = threading.Event(), [0]
    thread = reader(endpoint, stop, received)
    rng = random.Random(round_)
    events = [
        [BlockStored((rng.getrandbits(64),), None, tuple(range(16)), 16) for _ in range(4)]
        for _ in range(1000)
    ]
    started = time.perf_counter()
    offer_seconds = 0.0
    for i in range(batches):
        before = time.perf_counter()
        publisher.sink(events[i % len(events)])
        offer_seconds += time.perf_counter() - before
    while publisher.counts()[0] + publisher.queue.dropped_batches < batches:
        time.sleep(0.001)
    seconds = time.perf_counter() - started
    _, sent_events, dropped, _ = publisher.counts()
    time.sleep(0.2)
    stop.set()
    thread.join()
    publisher.close()
    return {
        "events/s": sent_events / seconds,
        "offer us/batch": offer_seconds / batches * 1e6,
        "dropped batches": dropped,
        "received events": received[0],
        "sent events": sent_events,
    }


def step_round(engine, on: bool, publisher: KVEventPublisher | None, seed: int) -> float:
    engine.attach_kv_events(publisher.sink if on and publisher else None)
    engine.reset_prefix_cache()
    rng = random.Random(seed)
    prefix = engine.tokenizer.encode("You are a careful assistant. " * 16)[:96]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    for i in range(8):
        question = [rng.randrange(100, 10_000) for _ in range(rng.randint(8, 40))]
        engine.add_request(f"{seed}-{i}", prefix + question, params)
    steps, started = 0, time.perf_counter()
    while engine.has_unfinished:
        engine.step()
        steps += 1
    return (time.perf_counter() - started) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=20_000)
    args = parser.parse_args()
    pin_threads()
    print(cpu_line())
    with tempfile.TemporaryDirectory() as folder:
        rounds = [publish_round(args.batches, folder, r) for r in range(args.rounds)]
        publish = [
            {"stat": f"median of {args.rounds}"}
            | {k: statistics.median(float(r[k]) for r in rounds) for k in rounds[0]}
        ]
        print(table(publish, f"publisher: {args.batches} batches of 4 events"))
        engine = build_engine(EngineConfig(**SERVER_DEFAULTS), say=lambda _: None)  # as served
        config = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"ipc://{folder}/steps")
        publisher = KVEventPublisher(config, medium="CPU")
        stop, received = threading.Event(), [0]
        thread = reader(config.endpoint, stop, received)
        step_round(engine, False, None, -1)  # warm
        off, on = [], []
        for r in range(args.rounds):
            off.append(step_round(engine, False, None, r))
            on.append(step_round(engine, True, publisher, r))
        stop.set()
        thread.join()
        events = publisher.counts()[1]
        publisher.close()
    steps = [
        {
            "events": "off",
            "ms/step": statistics.median(off),
            "on/off": 1.0,
            "events sent": 0,
        },
        {
            "events": "on",
            "ms/step": statistics.median(on),
            "on/off": statistics.median(b / a for a, b in zip(off, on, strict=True)),
            "events sent": events,
        },
    ]
    print(table(steps, f"engine step, 8 streams, median of {args.rounds} rounds"))
    print(
        "csv:", write_csv("kv_events_publish.csv", publish), write_csv("kv_events_step.csv", steps)
    )


if __name__ == "__main__":
    main()

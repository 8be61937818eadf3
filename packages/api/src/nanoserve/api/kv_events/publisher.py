"""KVEventPublisher: the engine's KV-cache events on a ZMQ PUB socket, in vLLM's wire format,
for llm-d's KV-cache indexer (precise prefix-cache routing).

Each step's events are one message of three frames: the topic, an 8-byte big-endian sequence
number (0, 1, ...), and a msgpack `EventBatch` `[ts, events, data_parallel_rank]`. An event is
a map keyed by `"type"` (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`: vLLM's current
format) or, with `event_format: "array"`, vLLM's older positional array, its tag first. The
last `buffer_steps` messages are kept; a ROUTER socket at `replay_endpoint` answers a client's
8-byte starting sequence number with each kept message from there
(`[identity, "", topic, seq, payload]`) and then the end marker (an empty topic, sequence -1,
an empty payload), so a late subscriber catches up.

The engine's step thread only offers each batch to a bounded queue (runtime kv_events.py);
this publisher's own thread encodes and sends, so a slow, absent or dead subscriber never
costs the step anything: ZMQ's PUB drops what a subscriber past its high-water mark cannot
take, and a full queue drops (and counts) a whole batch. pyzmq is imported only here, when
events are on: `pip install nanoserve-api[kv-events]`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from typing import Any

import msgspec

from nanoserve.api.kv_events.config import KVEventsConfig
from nanoserve.runtime import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineConfigError,
    KVEvent,
    KVEventBatch,
    KVEventQueue,
)

log = logging.getLogger("nanoserve.kv_events")
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay's end marker
POLL_SECONDS = 0.02  # the publisher thread waits this long for a batch, between replay polls


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = 0


# The events' fields, in vLLM's order. Fields without a default are always sent, null or not.
_STORED = [
    ("block_hashes", list[int]),
    ("parent_block_hash", int | None),
    ("token_ids", list[int]),
    ("block_size", int),
    ("lora_id", int | None),
    ("medium", str | None),
    ("lora_name", str | None),
]
_REMOVED = [("block_hashes", list[int]), ("medium", str | None)]


def _event_types(arrays: bool) -> tuple[type, type, type]:
    """vLLM's current format: maps keyed by "type"; its older one: positional arrays, the tag
    first. The same fields either way."""
    form: dict[str, Any] = {"array_like": True} if arrays else {"tag_field": "type"}
    return tuple(  # type: ignore[return-value]
        msgspec.defstruct(name, fields, tag=name, gc=False, **form)
        for name, fields in (
            ("BlockStored", _STORED),
            ("BlockRemoved", _REMOVED),
            ("AllBlocksCleared", []),
        )
    )


MAP_EVENTS, ARRAY_EVENTS = _event_types(False), _event_types(True)


def wire_event(event: KVEvent, medium: str, *, arrays: bool = False) -> msgspec.Struct:
    """One engine event in vLLM's shape (no LoRA: lora_id and lora_name are null)."""
    stored, removed, cleared = ARRAY_EVENTS if arrays else MAP_EVENTS
    if isinstance(event, BlockStored):
        return stored(
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            None,
            medium,
            None,
        )
    if isinstance(event, BlockRemoved):
        return removed(list(event.block_hashes), medium)
    assert isinstance(event, AllBlocksCleared)
    return cleared()


def encode_batch(batch: KVEventBatch, medium: str, *, arrays: bool = False) -> bytes:
    events = [wire_event(e, medium, arrays=arrays) for e in batch.events]
    return msgspec.msgpack.encode(EventBatch(batch.ts, events, 0))


class KVEventPublisher:
    def __init__(self, config: KVEventsConfig, *, medium: str) -> None:
        try:
            import zmq
        except ImportError:
            raise EngineConfigError(
                "--kv-events-config needs pyzmq: pip install 'nanoserve-api[kv-events]'"
            ) from None
        self.config = config
        self.medium = medium
        self.queue = KVEventQueue(config.max_queue_size)
        self._topic = config.topic.encode()
        self._arrays = config.event_format == "array"
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._lock = threading.Lock()
        self.published_batches = 0
        self.published_events = 0
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay = None
        try:
            (self._pub.bind if config.binds else self._pub.connect)(config.endpoint)
            if config.replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as error:
            self._context.destroy(linger=0)
            raise EngineConfigError(f"--kv-events-config: cannot open a socket: {error}") from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nanoserve-kv-events", daemon=True)
        self._thread.start()

    def sink(self, events: list[KVEvent]) -> None:
        """The engine's sink, called on the step thread: never blocks."""
        self.queue.offer(events)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self.queue.get(POLL_SECONDS)
                if batch is not None:
                    self._publish(batch)
                self._serve_replays()
            while (batch := self.queue.get(0)) is not None:  # what was offered before close
                self._publish(batch)
        except Exception:  # a publisher failure must not take the server down: it stops
            log.exception("the KV-event publisher stopped")
        finally:
            self._context.destroy(linger=0)

    def _publish(self, batch: KVEventBatch) -> None:
        import zmq

        payload = encode_batch(batch, self.medium, arrays=self._arrays)
        seq = batch.seq
        with contextlib.suppress(zmq.Again):  # PUB drops rather than blocks; so do we
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)
        self._buffer.append((seq, payload))
        with self._lock:
            self.published_batches += 1
            self.published_events += len(batch.events)

    def _serve_replays(self) -> None:
        replay = self._replay
        while replay is not None and replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue  # not a replay request
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    replay.send_multipart(
                        (identity, b"", self._topic, seq.to_bytes(8, "big"), payload)
                    )
            replay.send_multipart((identity, b"", b"", END_SEQ, b""))

    @property
    def alive(self) -> bool:
        """False once the publisher thread has stopped (closed, or failed: see the log)."""
        return self._thread.is_alive()

    def counts(self) -> tuple[int, int, int, int]:
        """(batches published, events published, batches dropped, events dropped)."""
        with self._lock:
            published = (self.published_batches, self.published_events)
        return (*published, self.queue.dropped_batches, self.queue.dropped_events)

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

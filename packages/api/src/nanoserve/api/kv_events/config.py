"""KVEventsConfig: `--kv-events-config '<json>'`, vLLM's keys and defaults.

`{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
"replay_endpoint": "tcp://*:5558", "topic": "kv@<pod-ip>:<port>@<model>"}`; `buffer_steps`
(batches kept for replay), `hwm` (ZMQ's high-water mark, in messages) and `max_queue_size`
(batches waiting for the publisher thread; past it a batch is dropped and counted) as vLLM's.
nanoserve adds `event_format`: `"map"` (each event a map keyed by `"type"`, vLLM's current wire
format, the default) or `"array"` (vLLM's older positional arrays).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from nanoserve.runtime import EngineConfigError

PUBLISHERS = ("null", "zmq")
EVENT_FORMATS = ("map", "array")


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None  # unset: "zmq" when enabled, else "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    event_format: str = "map"

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"

    @property
    def binds(self) -> bool:
        """vLLM's rule: a wildcard or local endpoint is bound, any other connected to."""
        return _binds(self.endpoint)

    @classmethod
    def parse(cls, text: str) -> KVEventsConfig:
        try:
            given = json.loads(text)
        except json.JSONDecodeError as error:
            raise EngineConfigError(f"not JSON: {error}") from None
        if not isinstance(given, dict):
            raise EngineConfigError("must be a JSON object")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise EngineConfigError(f"unknown key {unknown[0]!r} (known: {', '.join(known)})")
        for key, value in given.items():
            _check(key, value)
        config = cls(**given)
        if config.publisher is None:
            config = cls(
                **{**given, "publisher": "zmq" if config.enable_kv_cache_events else "null"}
            )
        return config


def _check(key: str, value: Any) -> None:
    def bad(expected: str) -> EngineConfigError:
        return EngineConfigError(f"{key} must be {expected}, got {value!r}")

    if key == "enable_kv_cache_events" and not isinstance(value, bool):
        raise bad("true or false")
    if key == "publisher" and value not in PUBLISHERS:
        raise bad(" or ".join(PUBLISHERS))
    if key == "event_format" and value not in EVENT_FORMATS:
        raise bad(" or ".join(EVENT_FORMATS))
    if key in ("endpoint", "topic") and not isinstance(value, str):
        raise bad("a string")
    if key == "replay_endpoint" and value is not None and not isinstance(value, str):
        raise bad("a string or null")
    if key in ("buffer_steps", "hwm", "max_queue_size") and (
        not isinstance(value, int) or isinstance(value, bool) or value < 1
    ):
        raise bad("a positive integer")


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))

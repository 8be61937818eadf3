"""EngineClient is what the server may use of an engine: the real AsyncEngine and the tests'
FakeEngine both honour it, member for member, with the same parameters. (No type checker runs
here: this is the check that the fake-engine tests test the real surface.) And the real factory,
`build_async_engine`, freezes the boot's heap for the engine's life."""

from __future__ import annotations

import gc
import inspect
import threading
from pathlib import Path
from typing import Any

import pytest

from nanoserve.api.server.engine_client import (
    DeltaStream,
    EngineClient,
    TokenCodec,
    build_async_engine,
)
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.serving.async_engine import AsyncEngine
from nanoserve.runtime.engine.serving.request_stream import RequestStream
from nanoserve.runtime.text.tokenizer import Tokenizer
from tests.api.fake_engine import FakeEngine, FakeStream, FakeTokenizer

DUNDERS = {"__aiter__", "__call__"}


def members(protocol: type) -> dict[str, Any]:
    """The protocol's own members: methods and properties by value, attributes as None."""
    own = {k: v for k, v in vars(protocol).items() if not k.startswith("_") or k in DUNDERS}
    return {**dict.fromkeys(protocol.__annotations__), **own}


def signature(fn: Any) -> list[tuple[str, Any]]:
    """Parameter names and kinds after self; an implementation may add optional ones."""
    params = inspect.signature(fn).parameters.values()
    return [(p.name, p.kind) for p in params if p.name != "self"]


@pytest.mark.parametrize(
    ("protocol", "implementation", "make"),
    [
        (EngineClient, AsyncEngine, lambda: AsyncEngine(None)),  # type: ignore[arg-type]
        (EngineClient, FakeEngine, FakeEngine),
        (TokenCodec, Tokenizer, None),
        (TokenCodec, FakeTokenizer, FakeTokenizer),
        (DeltaStream, RequestStream, None),
        (DeltaStream, FakeStream, None),
    ],
    ids=["async-engine", "fake-engine", "tokenizer", "fake-tokenizer", "stream", "fake-stream"],
)
def test_implementations_honour_the_protocol(
    protocol: type, implementation: type, make: Any
) -> None:
    instance = make() if make is not None else None
    for name, member in members(protocol).items():
        theirs = inspect.getattr_static(implementation, name, None)
        if member is None or (isinstance(member, property) and not isinstance(theirs, property)):
            # an attribute, or a property served by one (a dataclass field): on each instance
            assert instance is not None and hasattr(instance, name), name
            continue
        if isinstance(member, property):
            continue
        assert theirs is not None, name
        ours, impl = signature(member), signature(theirs)
        assert impl[: len(ours)] == ours, name
        extra = inspect.signature(theirs).parameters.values()
        optional = [p for p in list(extra)[len(ours) + 1 :] if p.kind not in (p.VAR_KEYWORD,)]
        assert all(p.default is not p.empty for p in optional), name


@pytest.mark.anyio
async def test_the_real_engine_freezes_its_boot_heap_and_thaws_it_at_shutdown(
    tiny_model_dir: Path,
) -> None:
    assert gc.get_freeze_count() == 0
    config = EngineConfig(model=str(tiny_model_dir), max_model_len=64, kv_budget_bytes=4 << 20)
    engine = build_async_engine(config, lambda line: None, threading.Event())
    await engine.start()
    try:
        assert gc.get_freeze_count() > 0  # the boot's objects: no full collection rescans them
    finally:
        await engine.shutdown(0)
    assert gc.get_freeze_count() == 0

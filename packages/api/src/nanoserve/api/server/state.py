"""ServerState: what one app instance owns — settings, the engine once built, its metrics.

The lifespan starts the build in a worker thread and returns at once, so the port is open
during the warm-up and /health can say 503 until the engine is warm and has run one real
forward; every other route answers 503 with Retry-After until then. What is built is an
`EngineClient`: the real `AsyncEngine` by default, or whatever `engine_factory` returns (the
tests' fake engine, which boots in no time and loads no model).

A shutdown during the boot sets `cancel`: the build stops at its next phase or recording
boundary (WarmupCancelled, one line, not a failure). The thread is a daemon and the lifespan
waits for it only `STOP_WAIT_SECONDS`, so one long step (a load, a recording of a wide shape
on a CPU) does not hold up the shutdown. An interpreter that exits while a daemon thread is
inside torch aborts, so an exit hook joins it (the cancel stops it at its next boundary);
`nanoserve serve` does not wait even that long (cli.py).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from litestar import Litestar

from nanoserve.api.server.engine_client import EngineClient, EngineFactory, build_async_engine
from nanoserve.api.server.errors import APIError, without_paths
from nanoserve.api.server.metrics import ServerMetrics
from nanoserve.api.server.settings import ServerSettings
from nanoserve.runtime import WarmupCancelled

if TYPE_CHECKING:
    from nanoserve.api.kv_events.publisher import KVEventPublisher

log = logging.getLogger("nanoserve")
STOP_WAIT_SECONDS = 1.0  # how long a shutdown waits for the boot to reach a boundary
T = TypeVar("T")


class ServerState:
    def __init__(
        self,
        settings: ServerSettings,
        *,
        say: Callable[[str], None] | None = None,
        on_boot_failure: Callable[[BaseException], None] | None = None,
        engine_factory: EngineFactory = build_async_engine,
    ) -> None:
        self.settings = settings
        self.started = time.time()
        self.engine: EngineClient | None = None
        self._engine_factory = engine_factory
        self.boot_error: str | None = None
        self.engine_error: str | None = None  # set if the engine dies while serving
        self.metrics = ServerMetrics(lambda: self.engine, lambda: self.kv_events)
        self._print = say or log.info
        self.phase = "starting"
        self._on_boot_failure = on_boot_failure
        self._boot: asyncio.Task[None] | None = None
        self.cancel = threading.Event()  # set at shutdown: the boot stops at its next boundary
        self.boot_thread: threading.Thread | None = None
        self.kv_events: KVEventPublisher | None = None  # with --kv-events-config

    def _say(self, line: str) -> None:
        """Boot progress: printed, and the latest line is what /health's 503 body reports."""
        self.phase = line
        self._print(line)

    def _engine_died(self, error: BaseException) -> None:
        """The engine's step failed or hung: refuse everything (503) and ask the process to
        exit non-zero, so that a supervisor starts a fresh one."""
        self.engine_error = without_paths(str(error))  # /health's body, as the errors'
        self.phase = "failed"
        if self._on_boot_failure is not None:
            self._on_boot_failure(error)

    def require_engine(self) -> EngineClient:
        if self.engine_error is not None:
            raise APIError(503, f"the engine has failed: {self.engine_error}", retry_after=5)
        if self.engine is None:
            if self.boot_error:
                raise APIError(503, f"the engine failed to start: {self.boot_error}")
            raise APIError(503, "the model is still loading; retry shortly", retry_after=2)
        return self.engine

    @property
    def booting(self) -> bool:
        """The boot thread is still running (a shutdown stopped waiting for it)."""
        return self.boot_thread is not None and self.boot_thread.is_alive()

    async def boot(self) -> None:
        try:
            if self.settings.kv_events.enabled:  # its sockets first: a port in use fails fast
                self.kv_events = self._open_kv_events()
            engine = await self._in_boot_thread(
                self._engine_factory, self.settings.engine, self._say, self.cancel
            )
            self.phase = "ready"
            engine.observer = self.metrics.observe
            engine.on_fatal = self._engine_died
            if self.kv_events is not None:
                engine.attach_kv_events(self.kv_events.sink)
            await engine.start()
            self.engine = engine
        except WarmupCancelled as stop:
            self.phase = "stopped"
            self._print(f"{stop}: shutting down")
        except Exception as error:
            log.error("engine failed to start: %s: %s", type(error).__name__, error)
            self.boot_error = without_paths(f"{type(error).__name__}: {error}")
            if self._on_boot_failure is not None:
                self._on_boot_failure(error)

    def _open_kv_events(self) -> KVEventPublisher:
        from nanoserve.api.kv_events.publisher import KVEventPublisher  # imports pyzmq

        config = self.settings.kv_events
        device = self.settings.engine.device or "cpu"
        medium = "GPU" if device.split(":")[0] == "cuda" else "CPU"
        publisher = KVEventPublisher(config, medium=medium)
        replay = f", replay on {config.replay_endpoint}" if config.replay_endpoint else ""
        self._print(
            f"KV-cache events: {config.event_format} events on {config.endpoint}"
            f" (topic {config.topic!r}{replay})"
        )
        return publisher

    @asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        self._boot = asyncio.create_task(self.boot(), name="nanoserve-boot")
        try:
            yield
        finally:
            self.cancel.set()
            if not self._boot.done():
                await asyncio.wait({self._boot}, timeout=STOP_WAIT_SECONDS)
            if not self._boot.done():
                phase = self.phase if len(self.phase) <= 60 else self.phase[:57] + "..."
                self._print(f"shutting down without waiting for the boot (at: {phase})")
                self._boot.cancel()
            if self.engine is not None:
                await self.engine.shutdown(self.settings.grace_seconds)
            if self.kv_events is not None:
                self.kv_events.close()

    async def _in_boot_thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) in a daemon thread, awaited: asyncio.to_thread's pool threads
        are joined at interpreter exit, which would keep a stopping server alive until fn ends."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if not future.done():  # a shutdown may have stopped waiting
                (future.set_result if ok else future.set_exception)(value)

        def run() -> None:
            outcome: tuple[bool, T | BaseException]
            try:
                outcome = (True, fn(*args, **kwargs))
            except BaseException as error:  # handed to the awaiting task, which decides
                outcome = (False, error)
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(settle, *outcome)

        thread = threading.Thread(target=run, name="nanoserve-boot", daemon=True)
        self.boot_thread = thread
        thread.start()
        atexit.register(lambda: thread.join() if thread.is_alive() else None)
        return await future

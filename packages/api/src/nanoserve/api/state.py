"""ServerState: what one app instance owns — settings, the engine once built, its metrics.

The lifespan starts the build in a worker thread and returns at once, so the port is open
during the warm-up and /health can say 503 until the engine is warm and has run one real
forward; every other route answers 503 with Retry-After until then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from litestar import Litestar

from nanoserve.api.errors import APIError
from nanoserve.api.metrics import ServerMetrics
from nanoserve.api.settings import ServerSettings
from nanoserve.runtime.async_engine import AsyncEngine
from nanoserve.runtime.build import build_engine

log = logging.getLogger("nanoserve")


class ServerState:
    def __init__(
        self,
        settings: ServerSettings,
        *,
        say: Callable[[str], None] | None = None,
        on_boot_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.settings = settings
        self.started = time.time()
        self.engine: AsyncEngine | None = None
        self.boot_error: str | None = None
        self.metrics = ServerMetrics(lambda: self.engine)
        self._print = say or log.info
        self.phase = "starting"
        self._on_boot_failure = on_boot_failure
        self._boot: asyncio.Task[None] | None = None

    def _say(self, line: str) -> None:
        """Boot progress: printed, and the latest line is what /health's 503 body reports."""
        self.phase = line
        self._print(line)

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def require_engine(self) -> AsyncEngine:
        if self.engine is None:
            if self.boot_error:
                raise APIError(503, f"the engine failed to start: {self.boot_error}")
            raise APIError(503, "the model is still loading; retry shortly", retry_after=2)
        return self.engine

    async def boot(self) -> None:
        try:
            engine = await asyncio.to_thread(build_engine, self.settings.engine, say=self._say)
            self.phase = "ready"
            async_engine = AsyncEngine(engine)
            async_engine.observer = self.metrics.observe
            await async_engine.start()
            self.engine = async_engine
        except Exception as error:
            self.boot_error = f"{type(error).__name__}: {error}"
            log.error("engine failed to start: %s", self.boot_error)
            if self._on_boot_failure is not None:
                self._on_boot_failure(error)

    @asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        self._boot = asyncio.create_task(self.boot(), name="nanoserve-boot")
        try:
            yield
        finally:
            if not self._boot.done():
                self._boot.cancel()
            if self.engine is not None:
                await self.engine.shutdown(self.settings.grace_seconds)

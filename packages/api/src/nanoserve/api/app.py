"""create_app: the Litestar app factory (`litestar --app nanoserve.api.app:create_app run`)."""

from __future__ import annotations

import hmac

from litestar import Litestar, Response, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi import OpenAPIConfig

from nanoserve.api.messages.routes import MessagesController
from nanoserve.api.openai.routes import OpenAIController
from nanoserve.api.openai.token_routes import TokenController
from nanoserve.api.pooling.routes import PoolingController
from nanoserve.api.responses.routes import ResponsesController
from nanoserve.api.server.errors import EXCEPTION_HANDLERS, without_paths
from nanoserve.api.server.health import Health, HealthNotReady
from nanoserve.api.server.settings import ServerSettings
from nanoserve.api.server.state import ServerState


def require_api_key(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    server: ServerState = connection.app.state["server"]
    key = server.settings.api_key
    if not key or handler.opt.get("public"):
        return
    given = connection.headers.get("authorization", "")
    bearer = hmac.compare_digest(given.encode(), f"Bearer {key}".encode())
    # Anthropic's clients send the key as x-api-key
    anthropic = hmac.compare_digest(connection.headers.get("x-api-key", "").encode(), key.encode())
    if not (bearer or anthropic):
        raise NotAuthorizedException(
            "a valid API key is required: Authorization: Bearer <key> (or x-api-key: <key>)",
            headers={"WWW-Authenticate": "Bearer"},
        )


@get("/health", opt={"public": True}, sync_to_thread=False)
def health(server: NamedDependency[ServerState]) -> Response[Health | HealthNotReady]:
    """503 until the engine is warm and has run one real forward; then its two sizing plans."""
    if server.engine_error is not None:
        failed = HealthNotReady(status="failed", phase="failed", error=server.engine_error)
        return Response(failed, status_code=503)
    if server.engine is None:
        booting = HealthNotReady(
            status="failed" if server.boot_error else "starting",
            phase=without_paths(server.phase),  # the boot's console line, as the errors
            error=server.boot_error,
        )
        return Response(booting, status_code=503, headers={"Retry-After": "2"})
    return Response(Health.of(server.engine.status()))


@get("/metrics", sync_to_thread=False, media_type="text/plain; version=0.0.4")
def metrics(server: NamedDependency[ServerState]) -> Response[bytes]:
    return Response(server.metrics.render(), media_type="text/plain; version=0.0.4")


@post("/reset_prefix_cache", status_code=200)
async def reset_prefix_cache(server: NamedDependency[ServerState]) -> dict[str, int]:
    """vLLM's route: forget every cached block (blocks running requests hold stay theirs); with
    KV events on, subscribers are told AllBlocksCleared."""
    engine = server.require_engine()
    return {"cleared_blocks": await engine.reset_prefix_cache()}


def create_app(
    settings: ServerSettings | None = None, server: ServerState | None = None
) -> Litestar:
    """Configured from `settings`, else from NANOSERVE_* environment variables."""
    server = server or ServerState(settings or ServerSettings.from_env())
    return Litestar(
        route_handlers=[
            OpenAIController,
            ResponsesController,
            MessagesController,
            TokenController,
            PoolingController,
            health,
            metrics,
            reset_prefix_cache,
        ],
        dependencies={"server": Provide(lambda: server, sync_to_thread=False)},
        lifespan=[server.lifespan],
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        guards=[require_api_key],
        request_max_body_size=server.settings.max_body_bytes,
        openapi_config=OpenAPIConfig(title="nanoserve", version="0.1.0"),
        state=State({"server": server}),
    )

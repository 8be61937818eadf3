"""admit: what every POST route checks before its body is read (the `before_request` hook of
each protocol's controller)."""

from __future__ import annotations

from litestar import Request

from nanoserve.api.server.errors import APIError
from nanoserve.api.server.state import ServerState


def admit(request: Request) -> None:
    """Before a POST's body is read: JSON only (any other Content-Type, or none, is a 415; a
    parameter such as `; charset=utf-8` is fine, `application/*+json` is JSON too), and 429 at
    once when the waiting queue is already full, so a flood costs its headers and no more."""
    if request.method != "POST":
        return
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        shown = media or "none"
        raise APIError(415, f"the request body must be application/json (Content-Type: {shown})")
    server: ServerState = request.app.state["server"]
    if server.engine is not None:
        server.engine.check_room()  # a dead or closing engine's 503 comes from submit

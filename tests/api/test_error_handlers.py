"""Exception handlers keyed by type: the client's mistakes are 4xx, ours are a logged 500."""

from __future__ import annotations

import logging

import pytest
from litestar import Litestar, get
from litestar.testing import TestClient

from nanoserve.api.errors import EXCEPTION_HANDLERS
from nanoserve.core.errors import GeometryError
from nanoserve.runtime.engine.async_engine import EngineClosedError, EngineDeadError
from nanoserve.runtime.engine.engine import RequestError
from nanoserve.runtime.engine.sampling_params import SamplingParamsError
from nanoserve.runtime.engine.scheduler import QueueFullError
from nanoserve.runtime.errors import ChatTemplateError

CASES = {
    "params": (SamplingParamsError("top_p", "must be in (0, 1]"), 400, "top_p"),
    "request": (RequestError("max_tokens", "too long"), 400, "max_tokens"),
    "template": (ChatTemplateError("template", "no"), 400, None),
    "queue": (QueueFullError("the waiting queue is full"), 429, None),
    "closed": (EngineClosedError("shutting down"), 503, None),
    "geometry": (GeometryError("rows 3 exceed max_batch 2"), 500, None),
    "dead": (EngineDeadError("the step loop failed"), 500, None),
    "other": (KeyError("x"), 500, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_error_type_gets_its_status(name: str, caplog: pytest.LogCaptureFixture) -> None:
    error, status, param = CASES[name]

    @get("/raise", sync_to_thread=False)
    def raising() -> None:
        raise error

    app = Litestar([raising], exception_handlers=EXCEPTION_HANDLERS, logging_config=None)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="nanoserve.api"), TestClient(app) as client:
        response = client.get("/raise")
    assert response.status_code == status
    body = response.json()["error"]
    assert body["param"] == param and body["message"]
    # An internal failure (an invariant such as GeometryError) is ours: logged, never a 4xx.
    assert any("internal error" in r.message for r in caplog.records) == (status == 500)

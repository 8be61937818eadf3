"""Exception handlers keyed by type: the client's mistakes are 4xx, ours are a logged 500."""

from __future__ import annotations

import logging

import pytest
from litestar import Litestar, get
from litestar.testing import TestClient

from nanoserve.api.server.errors import EXCEPTION_HANDLERS, without_paths
from nanoserve.core.errors import GeometryError
from nanoserve.runtime.engine.engine import RequestError
from nanoserve.runtime.engine.requests.sampling_params import SamplingParamsError
from nanoserve.runtime.engine.serving.async_engine import EngineClosedError, EngineDeadError
from nanoserve.runtime.engine.step.scheduler import QueueFullError
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


def raised(error: Exception) -> dict[str, object]:
    @get("/raise", sync_to_thread=False)
    def raising() -> None:
        raise error

    app = Litestar([raising], exception_handlers=EXCEPTION_HANDLERS, logging_config=None)  # type: ignore[arg-type]
    with TestClient(app) as client:
        response = client.get("/raise")
    text = response.text
    assert "Traceback" not in text and 'File "' not in text
    return response.json()["error"]


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [
        (
            OSError("/srv/models/llama/model.gguf: short read"),
            500,
            "internal error: OSError: <path>: short read",
        ),
        (
            EngineDeadError("the engine died: OSError: [Errno 5] /dev/shm/k.bin failed"),
            500,
            "the engine died: OSError: [Errno 5] <path> failed",
        ),
        (
            ChatTemplateError("models/me", "the model has no chat template"),
            400,
            "the model has no chat template",
        ),
    ],
)
def test_errors_never_echo_paths(error: Exception, status: int, message: str) -> None:
    body = raised(error)
    assert body["message"] == message
    assert ("engine_dead" if isinstance(error, EngineDeadError) else None) == body["code"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/a/b", "<path>"),
        ("at /tmp/x.gguf, line 3", "at <path>, line 3"),
        ("rows 3 / 2 > 1", "rows 3 / 2 > 1"),  # a slash alone is not a path
        ("/health is 503", "/health is 503"),  # one part: a route, not a file
        ("see http://host/a/b", "see http://host/a/b"),
        ("a/b/c relative", "a/b/c relative"),
        ("'/x/y' and \"/p/q.json\"", "'<path>' and \"<path>\""),
    ],
)
def test_without_paths(text: str, expected: str) -> None:
    assert without_paths(text) == expected

"""Every failure as OpenAI's error body; a client's mistake is a 4xx, never a 500."""

from __future__ import annotations

import logging
import re

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from msgspec import Struct

from nanoserve.core.errors import FieldError
from nanoserve.runtime import (
    ChatTemplateError,
    EngineClosedError,
    EngineDeadError,
    QueueFullError,
    RequestError,
)

log = logging.getLogger("nanoserve.api")

ERROR_TYPES = {  # OpenAI's `type` for each status
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


# An absolute path of two parts or more (/home/me/model.gguf), not inside a word or a URL.
_PATH = re.compile(r"(?<![\w.:/~-])/(?:[\w.@+-]+/)+[\w.@+-]*")


class ErrorInfo(Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(Struct, kw_only=True):
    error: ErrorInfo


def without_paths(text: str) -> str:
    """What the server says of its own failures names no file: the log has the details."""
    return _PATH.sub("<path>", text)


class APIError(Exception):
    """Raised by handlers for a refusal that is already worded for the client."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    retry_after: int | None = None,
) -> Response[ErrorResponse]:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = error_body(status, message, param=param, code=code)
    return Response(body, status_code=status, headers=headers)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> ErrorResponse:
    """OpenAI's error object: a response's body, or a stream's last event. A 5xx is about the
    server, not the request: its message loses any file-system path."""
    if status >= 500:
        message = without_paths(message)
    return ErrorResponse(
        error=ErrorInfo(
            message=message, type=ERROR_TYPES.get(status, "error"), param=param, code=code
        )
    )


def handle_api_error(_: Request, error: APIError) -> Response[ErrorResponse]:
    return error_response(
        error.status,
        error.message,
        param=error.param,
        code=error.code,
        retry_after=error.retry_after,
    )


def handle_validation(_: Request, error: ValidationException) -> Response[ErrorResponse]:
    detail = error.detail or "invalid request"
    extra = error.extra
    param = None
    if isinstance(extra, list) and extra and isinstance(extra[0], dict):
        message = extra[0].get("message") or detail
        key = extra[0].get("key")
        param = str(key) if key else None
        detail = f"{detail}: {message}" if message != detail else detail
    return error_response(400, detail, param=param)


# Litestar's words (connection/request.py) when the client goes while its body is read: the
# client's doing (it hung up, or the read deadline cut it off), not a server error.
_CLIENT_GONE = "client disconnected prematurely"


def handle_http(_: Request, error: HTTPException) -> Response[ErrorResponse]:
    status = error.status_code
    if status == 500 and error.detail == _CLIENT_GONE:
        log.info("a client left before its request arrived whole")
        return error_response(400, "the request ended before its body arrived whole")
    if status >= 500:
        log.error("HTTP %s: %s", status, error.detail)
    response = error_response(status, error.detail or "error", retry_after=None)
    if error.headers:  # 405's Allow, which HTTP requires
        response.headers.update(error.headers)
    return response


def handle_too_deep(_: Request, error: RecursionError) -> Response[ErrorResponse]:
    """msgspec refuses a body nested past its depth limit with RecursionError (which Litestar
    does not translate): the client's mistake, not ours."""
    return error_response(400, "the request body is nested too deeply to decode")


def handle_bad_parameter(_: Request, error: FieldError | RequestError) -> Response:
    """A request the engine cannot serve as asked: 400, naming the field."""
    return error_response(400, str(error), param=error.field)


def handle_chat_template(_: Request, error: ChatTemplateError) -> Response[ErrorResponse]:
    # Its source is the model's directory, as the operator typed it (relative, perhaps): the
    # client is told the problem alone.
    return error_response(400, without_paths(error.problem))


def handle_queue_full(_: Request, error: QueueFullError) -> Response[ErrorResponse]:
    return error_response(429, str(error), code="queue_full", retry_after=1)


def handle_engine_closed(_: Request, error: EngineClosedError) -> Response[ErrorResponse]:
    return error_response(503, str(error), retry_after=5)


def handle_internal(_: Request, error: Exception) -> Response[ErrorResponse]:
    """Ours, not the client's: a failed invariant (GeometryError, a gate), a dead engine,
    anything unforeseen. Logged with its traceback; the body has the type and the message, less
    any path (error_body), never the traceback."""
    log.exception("internal error", exc_info=error)
    if isinstance(error, EngineDeadError):
        return error_response(500, str(error), code="engine_dead")
    return error_response(500, f"internal error: {type(error).__name__}: {error}")


EXCEPTION_HANDLERS = {
    APIError: handle_api_error,
    ValidationException: handle_validation,
    HTTPException: handle_http,
    RecursionError: handle_too_deep,
    # Keyed by type: Litestar picks the most specific class in the error's MRO.
    FieldError: handle_bad_parameter,  # SamplingParamsError, GrammarError
    RequestError: handle_bad_parameter,
    ChatTemplateError: handle_chat_template,
    QueueFullError: handle_queue_full,
    EngineClosedError: handle_engine_closed,
    Exception: handle_internal,
}

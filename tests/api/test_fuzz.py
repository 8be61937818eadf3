"""API fuzzing: every route of the served OpenAPI document (`/schema/openapi.json`), with cases
that Schemathesis draws from it through Hypothesis, against a live server on a tiny random model.

Each POST route gets cases that fit the document (positive) and cases that break it (negative),
and three in four positive ones are made plausible (the served model's name, a real role), so that
they reach the engine rather than stopping at the first check. Every answer must be:

- never a 5xx;
- a 4xx in OpenAI's error shape, its `type` the status's, echoing no path and no traceback;
- a 200 whole: JSON with its choices, or a stream of JSON events ending `data: [DONE]`.

Afterwards the server still answers and holds no K/V block. `NANOSERVE_FUZZ_CASES` (default
2,000) sets the number of cases; the figures go to pytest's closing summary.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from nanoserve.api.server.errors import ERROR_TYPES

pytestmark = pytest.mark.slow

CASES = int(os.environ.get("NANOSERVE_FUZZ_CASES", "2000"))
GET_CASES = 10  # GET routes take no parameters: a few cases say all there is to say
ROLES = ("system", "user", "assistant")
ANTHROPIC_ROLES = ("user", "assistant")  # the system prompt is a field of its own
LEAKS = ("Traceback", "site-packages", 'File "')


@pytest.fixture(scope="module")
def fuzzed(start_server: Callable[..., Any], tiny_model_dir: Path) -> Iterator[Any]:
    live = start_server(
        str(tiny_model_dir),
        "--served-model-name", "tiny",
        "--max-batch", "4",
        "--max-waiting", "8",
        "--max-model-len", "96",
        "--kv-budget", "8MiB",
        "--grace-seconds", "2",
    )  # fmt: skip
    yield live
    assert live.stop() == 0, live.log()


# Ranges a client who read the docs keeps to: (low, high) of each numeric field.
RANGES = {
    "n": (1, 3),
    "best_of": (1, 3),
    "max_tokens": (1, 24),
    "max_completion_tokens": (1, 24),
    "max_output_tokens": (1, 24),
    "logprobs": (0, 5),
    "top_logprobs": (0, 5),
    "temperature": (0, 2),
    "top_p": (0.05, 1),
    "top_k": (-1, 50),
    "min_p": (0, 1),
    "presence_penalty": (-2, 2),
    "frequency_penalty": (-2, 2),
    "repetition_penalty": (0.5, 2),
}


def plausible(body: Any, data: st.DataObject, *, anthropic: bool = False) -> Any:
    """The served model; real roles; numbers in range; a prompt that is text: past the cheap
    checks, into the engine. What is left random (stop strings, seeds, grammars, tools,
    streaming, the messages' content) is what the engine must survive."""
    if not isinstance(body, dict):
        return body
    body = {**body, "model": "tiny"}
    for name, (low, high) in RANGES.items():
        value = body.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        clamped = min(max(value, low), high)
        body[name] = int(clamped) if isinstance(low, int) else float(clamped)
    if isinstance(body.get("best_of"), int) and isinstance(body.get("n"), int):
        body["best_of"] = max(body["best_of"], body["n"])
    if "logit_bias" in body:
        body["logit_bias"] = {"5": 1.0}
    if "prompt" in body and not (isinstance(body["prompt"], str) and body["prompt"]):
        body["prompt"] = data.draw(st.text(min_size=1, max_size=40))
    if isinstance(body.get("messages"), list):
        roles = ANTHROPIC_ROLES if anthropic else ROLES
        body["messages"] = [
            plausible_message(m, data, roles) for m in body["messages"] if isinstance(m, dict)
        ] or [{"role": "user", "content": "hi"}]
    if anthropic and not isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = 8  # Anthropic requires it
    return body


def plausible_message(
    message: dict[str, Any], data: st.DataObject, roles: tuple[str, ...] = ROLES
) -> dict[str, Any]:
    role = data.draw(st.sampled_from(roles))
    message = {**message, "role": role}
    if role != "assistant":
        message.pop("tool_calls", None)
    if not isinstance(message.get("content"), str):
        message["content"] = data.draw(st.text(max_size=40))
    return message


def send(http: httpx.Client, case: Any) -> httpx.Response:
    """The case over httpx, read to its end (Schemathesis's own call stops a stream early)."""
    kwargs = case.as_transport_kwargs(base_url=str(http.base_url).rstrip("/"))
    body = {"json": kwargs["json"]} if "json" in kwargs else {"content": kwargs.get("data")}
    return http.request(
        kwargs["method"], kwargs["url"], headers=kwargs["headers"], params=kwargs["params"], **body
    )


# POST routes without a body: nothing to break, so positive cases only, as a GET.
BODILESS = {"/reset_prefix_cache"}
# The last event of a whole stream, for the routes that name their events.
STREAM_ENDS = {
    "/v1/responses": ("response.completed", "response.incomplete"),
    "/v1/messages": ("message_stop",),
}
# Generating routes that translate onto the chat path: a smaller share of the cases each.
TRANSLATED = {"/v1/responses", "/v1/messages"}
TRANSLATED_CASES = 40

# POST routes that generate nothing.
GENERATION_FREE_POSTS = {
    "/tokenize",
    "/detokenize",
    "/v1/completions/render",
    "/v1/chat/completions/render",
    "/v1/messages/count_tokens",
    "/reset_prefix_cache",
    # the pooling routes: the fuzzed model generates, so each is answered (a 400) at the door
    "/v1/embeddings",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/score",
    "/v1/score",
}


def check_answer(
    response: httpx.Response, leaks: tuple[str, ...], what: str, path: str = ""
) -> str:
    """One answer against the rules above; returns its kind for the tally."""
    status = response.status_code
    assert status < 500, f"{status} for {what}: {response.text[:2000]}"
    kind = response.headers.get("content-type", "")
    if status >= 400 and path.startswith("/v1/messages"):  # Anthropic's error shape
        body = response.json()
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"} and body["error"]["message"], body
        for leak in leaks:
            assert leak not in response.text, f"{leak!r} echoed: {response.text[:2000]}"
        return str(status)
    if status >= 400:
        assert kind.startswith("application/json"), f"{status} {kind} for {what}"
        body = response.json()
        assert set(body) == {"error"}, f"{status} {body} for {what}"
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"], error
        assert error["type"] == ERROR_TYPES[status], f"{status} {error} for {what}"
        for leak in leaks:
            assert leak not in response.text, f"{leak!r} echoed: {response.text[:2000]}"
        return str(status)
    if kind.startswith("text/event-stream") and path in STREAM_ENDS:
        names = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
        assert names and names[-1] in STREAM_ENDS[path], f"stream not whole for {what}: {names}"
        assert "error" not in names, f"stream failed for {what}: {response.text[-2000:]}"
        return "200 stream"
    if kind.startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", f"stream not whole for {what}: {events[-3:]}"
        for event in events[:-1]:
            assert "error" not in json.loads(event), f"stream failed for {what}: {event}"
        return "200 stream"
    if kind.startswith("application/json"):
        body = response.json()
        if "choices" in body:
            assert body["choices"], body
    return "200"


def test_fuzz_every_route(
    fuzzed: Any, tiny_model_dir: Path, figures: Callable[[str], None]
) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzzed.url}/schema/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    posts = [op for op in operations if op.method.upper() == "POST"]
    generating = {"/v1/completions", "/v1/chat/completions"}
    assert {op.path for op in posts} == generating | TRANSLATED | GENERATION_FREE_POSTS
    # The OpenAI routes get the budget; the translated ones a share; those that generate
    # nothing are cheap, and get as many cases as a GET.
    cheap = len(operations) - len(generating) - len(TRANSLATED)
    left = CASES - 2 * GET_CASES * cheap - 2 * TRANSLATED_CASES * len(TRANSLATED)
    per_post = left // (2 * len(generating))
    leaks = (*LEAKS, str(tiny_model_dir), str(Path(__file__).resolve().parents[2]))
    tally: Counter[str] = Counter()
    started = time.monotonic()

    def fuzz(http: httpx.Client, op: Any, mode: GenerationMode, cases: int) -> None:
        @given(case=op.as_strategy(generation_mode=mode), data=st.data())
        @settings(
            max_examples=cases,
            deadline=None,
            database=None,
            derandomize=True,  # no flaky CI from a lucky draw; NANOSERVE_FUZZ_CASES for more
            suppress_health_check=list(HealthCheck),
        )
        def one(case: Any, data: st.DataObject) -> None:
            # Chosen by the case itself, not drawn: a derandomized draw leans to one side.
            repair = zlib.crc32(repr(case.body).encode()) % 4 != 0
            if repair and mode is GenerationMode.POSITIVE:
                case.body = plausible(case.body, data, anthropic=op.path.startswith("/v1/messages"))
            response = send(http, case)
            what = f"{op.method.upper()} {op.path} ({mode.value}):\n{case.as_curl_command()}"
            answer = check_answer(response, leaks, what, op.path)
            tally[f"{op.path} {mode.value} {answer}"] += 1

        one()

    with httpx.Client(base_url=fuzzed.url, timeout=60) as http:
        for op in operations:
            if op.method.upper() == "POST" and op.path not in BODILESS:
                cases = (
                    GET_CASES
                    if op.path in GENERATION_FREE_POSTS
                    else TRANSLATED_CASES
                    if op.path in TRANSLATED
                    else per_post
                )
                fuzz(http, op, GenerationMode.POSITIVE, cases)
                fuzz(http, op, GenerationMode.NEGATIVE, cases)
            else:
                fuzz(http, op, GenerationMode.POSITIVE, GET_CASES)
    seconds = time.monotonic() - started

    # The server lived through it, and every request it admitted gave back its blocks.
    deadline = time.monotonic() + 10
    health = httpx.get(f"{fuzzed.url}/health", timeout=10)
    while health.json()["kv_pool"]["blocks_in_use"] and time.monotonic() < deadline:
        time.sleep(0.1)
        health = httpx.get(f"{fuzzed.url}/health", timeout=10)
    assert health.status_code == 200, health.text
    assert health.json()["kv_pool"]["blocks_in_use"] == 0
    total = sum(tally.values())
    figures(
        f"fuzz: {total} cases over {len(operations)} routes in {seconds:.1f} s, 0 5xx;"
        f" {dict(sorted(tally.items()))}"
    )
    assert total >= CASES * 0.9, tally  # Hypothesis may stop short of max_examples, not far
    engine_reached = sum(v for k, v in tally.items() if k.endswith(("200", "200 stream")))
    assert engine_reached > 0.2 * total, tally  # the fuzz reached the engine, not only the checks

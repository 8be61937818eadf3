"""The OpenAI routes over a FakeEngine: exact answers, SSE framing, n, echo, logprobs, usage,
and every engine refusal as its status and OpenAI error body. No model: milliseconds each."""

from __future__ import annotations

from typing import Any

import pytest

from nanoserve.core.errors import GeometryError
from nanoserve.runtime.engine.engine import RequestError
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams, SamplingParamsError
from nanoserve.runtime.engine.serving.async_engine import EngineClosedError, EngineDeadError
from nanoserve.runtime.engine.step.scheduler import QueueFullError
from nanoserve.runtime.engine.step.sequence import Delta
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error, sse_chunks, sse_data

pytestmark = pytest.mark.anyio

HI = [{"role": "user", "content": "Hi"}]
CHAT_PROMPT = "<user>Hi<assistant>"  # FakeEngine.render_chat of HI: 19 tokens
NO_CACHE = {"cached_tokens": 0}


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def head(body: dict[str, Any], object_: str) -> dict[str, Any]:
    """What every answer and chunk carries besides choices and usage, checked for its kind."""
    assert body["object"] == object_ and body["model"] == "fake-model", body
    assert isinstance(body["created"], int)
    return {"id": body["id"], "object": object_, "created": body["created"], "model": "fake-model"}


def completion_chunk(
    chunk: dict[str, Any], index: int, text: str, finish: str | None = None
) -> dict[str, Any]:
    """What a streamed completion chunk must be, given the id and time it carries."""
    return {
        **head(chunk, "text_completion"),
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


def chat_chunk(
    chunk: dict[str, Any], index: int, delta: dict[str, str], finish: str | None = None
) -> dict[str, Any]:
    """What a streamed chat chunk must be, given the id and time it carries."""
    return {
        **head(chunk, "chat.completion.chunk"),
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


# -- whole answers -------------------------------------------------------------------------------


async def test_completion_answer() -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        response = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("cmpl-")
    assert body == {
        **head(body, "text_completion"),
        "choices": [{"index": 0, "text": "Hell", "logprobs": None, "finish_reason": "length"}],
        "usage": usage(2, 4),
    }
    [submitted] = fake.submitted
    assert submitted.request_id == body["id"] + "-0"
    assert submitted.prompt_ids == [ord("H"), ord("i")]
    assert submitted.params == SamplingParams(max_tokens=4)
    assert fake.closed == [submitted.request_id]  # answered: the engine stream was closed


async def test_completion_default_max_tokens_is_16() -> None:
    fake = FakeEngine(replies=("a" * 20,))
    async with fake_server(fake) as (client, _):
        response = await client.post("/v1/completions", json={"prompt": "Hi"})
    assert response.json()["choices"][0] == {
        "index": 0,
        "text": "a" * 16,
        "logprobs": None,
        "finish_reason": "length",
    }
    assert fake.submitted[0].params.max_tokens == 16


async def test_chat_answer() -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        response = await client.post("/v1/chat/completions", json={"messages": HI})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("chatcmpl-")
    assert body == {
        **head(body, "chat.completion"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage(19, 6),
    }
    assert fake.chats == [HI]
    [submitted] = fake.submitted
    assert submitted.request_id == body["id"]
    assert submitted.prompt_ids == [ord(c) for c in CHAT_PROMPT]
    # Unset max_tokens: the engine's default for this prompt (64-token context - 19).
    assert submitted.params.max_tokens == 64 - 19


async def test_chat_max_completion_tokens_wins_over_max_tokens() -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        body = {"messages": HI, "max_tokens": 5, "max_completion_tokens": 2}
        response = await client.post("/v1/chat/completions", json=body)
    assert response.json()["choices"][0]["message"]["content"] == "He"
    assert fake.submitted[0].params.max_tokens == 2


async def test_chat_roles_and_content_parts() -> None:
    fake = FakeEngine()
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ]
    async with fake_server(fake) as (client, _):
        response = await client.post("/v1/chat/completions", json={"messages": messages})
    assert response.status_code == 200, response.text
    assert fake.chats == [
        [
            {"role": "system", "content": "Be brief."},  # developer is the system role
            {"role": "user", "content": "ab"},
            {"role": "assistant", "content": ""},
        ]
    ]


async def test_models() -> None:
    async with fake_server() as (client, server):
        response = await client.get("/v1/models")
    assert response.status_code == 200
    assert response.json() == {
        "object": "list",
        "data": [
            {
                "id": "fake-model",
                "object": "model",
                "created": int(server.started),
                "owned_by": "nanoserve",
                "max_model_len": 64,
                "task": "generate",
            }
        ],
    }


async def test_model_field_is_optional_and_may_name_the_model() -> None:
    body: dict[str, Any]
    async with fake_server() as (client, _):
        for body in ({"prompt": "Hi"}, {"prompt": "Hi", "model": "fake-model"}):
            assert (await client.post("/v1/completions", json=body)).status_code == 200
        for body in ({"messages": HI}, {"messages": HI, "model": "fake-model"}):
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200


# -- streams -------------------------------------------------------------------------------------


async def test_completion_stream_framing() -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        body = {"prompt": "Hi", "max_tokens": 3, "stream": True}
        response = await client.post("/v1/completions", json=body)
    data = sse_data(response)  # `data: ...\r\n\r\n` frames, nothing else
    assert data[-1] == "[DONE]"
    chunks = sse_chunks(response)
    assert [c["id"] for c in chunks] == [fake.submitted[0].request_id.removesuffix("-0")] * 3
    assert chunks == [
        completion_chunk(chunks[0], 0, "H"),
        completion_chunk(chunks[1], 0, "e"),
        completion_chunk(chunks[2], 0, "l", "length"),
    ]
    assert fake.closed == [fake.submitted[0].request_id]


async def test_chat_stream_opens_with_the_role() -> None:
    fake = FakeEngine(replies=("Yo",))
    async with fake_server(fake) as (client, _):
        response = await client.post("/v1/chat/completions", json={"messages": HI, "stream": True})
    chunks = sse_chunks(response)
    assert {c["id"] for c in chunks} == {fake.submitted[0].request_id}
    assert chunks == [
        chat_chunk(chunks[0], 0, {"role": "assistant", "content": ""}),
        chat_chunk(chunks[1], 0, {"content": "Y"}),
        chat_chunk(chunks[2], 0, {"content": "o"}, "stop"),
    ]


@pytest.mark.parametrize("include", [True, False])
async def test_completion_stream_usage(include: bool) -> None:
    fake = FakeEngine(replies=("ok",), cached_tokens=1)
    async with fake_server(fake) as (client, _):
        body = {"prompt": "Hi", "stream": True, "stream_options": {"include_usage": include}}
        chunks = sse_chunks(await client.post("/v1/completions", json=body))
    assert [c["usage"] for c in chunks[:2]] == [None, None]
    if include:
        assert chunks[2] == {
            **head(chunks[2], "text_completion"),
            "choices": [],
            "usage": usage(2, 2, 1),
        }
    else:
        assert len(chunks) == 2


@pytest.mark.parametrize("include", [True, False])
async def test_chat_stream_usage(include: bool) -> None:
    fake = FakeEngine(replies=("ok",))
    async with fake_server(fake) as (client, _):
        body = {"messages": HI, "stream": True, "stream_options": {"include_usage": include}}
        chunks = sse_chunks(await client.post("/v1/chat/completions", json=body))
    assert all(c["usage"] is None for c in chunks[:3])
    if include:
        last = chunks[3]
        assert last == {**head(last, "chat.completion.chunk"), "choices": [], "usage": usage(19, 2)}
    else:
        assert len(chunks) == 3


async def test_empty_deltas_are_not_sent() -> None:
    """A delta with nothing to say (a possible stop-string prefix held back) sends no chunk."""

    def script(request_id: str, _: list[int], __: SamplingParams) -> list[Delta]:
        def delta(text: str, ids: tuple[int, ...], finish: str | None) -> Delta:
            return Delta(request_id, 0, text, ids, None, None, finish, 2, len(ids))

        return [delta("", (), None), delta("a", (97,), None), delta("", (), "stop")]

    fake = FakeEngine(script=script)
    async with fake_server(fake) as (client, _):
        completion = sse_chunks(
            await client.post("/v1/completions", json={"prompt": "Hi", "stream": True})
        )
        chat = sse_chunks(
            await client.post("/v1/chat/completions", json={"messages": HI, "stream": True})
        )
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in completion] == [
        ("a", None),
        ("", "stop"),
    ]
    assert [(c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) for c in chat] == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "a"}, None),
        ({}, "stop"),
    ]


# -- n, several prompts, echo --------------------------------------------------------------------


async def test_completion_n_and_prompt_list() -> None:
    fake = FakeEngine(replies=("ab", "xyz"))
    async with fake_server(fake) as (client, _):
        body = {"prompt": ["Hi", "Yo!"], "n": 2}
        response = await client.post("/v1/completions", json=body)
    body = response.json()
    # index = prompt * n + sample
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "ab", "stop"),
        (1, "xyz", "stop"),
        (2, "ab", "stop"),
        (3, "xyz", "stop"),
    ]
    assert body["usage"] == usage(2 + 3, 2 * (2 + 3))
    ids = [s.request_id for s in fake.submitted]
    assert ids == [body["id"] + "-0", body["id"] + "-1"]
    assert [s.prompt_ids for s in fake.submitted] == [[72, 105], [89, 111, 33]]
    assert all(s.params.n == 2 for s in fake.submitted)
    assert sorted(fake.closed) == ids


async def test_best_of_returns_the_n_best_by_mean_token_logprob() -> None:
    """The fake's token logprobs fall with position (-1/8, -2/8, ...): the shorter a reply, the
    higher its mean. best_of 4 runs four samples; the two best come back, re-indexed."""
    fake = FakeEngine(replies=("abcd", "xy", "xyz", "q"))
    async with fake_server(fake) as (client, _):
        body = {"prompt": ["Hi", "Yo!"], "n": 2, "best_of": 4}
        response = await client.post("/v1/completions", json=body)
    body = response.json()
    assert [(c["index"], c["text"], c["logprobs"]) for c in body["choices"]] == [
        (0, "q", None),
        (1, "xy", None),
        (2, "q", None),
        (3, "xy", None),
    ]
    assert body["usage"] == usage(2 + 3, 2 * (4 + 2 + 3 + 1))  # every sample run is counted
    # Ranking needs the chosen tokens' logprobs: asked for (logprobs 0), not shown.
    assert all((s.params.n, s.params.logprobs) == (4, 0) for s in fake.submitted)


async def test_best_of_with_logprobs_shows_those_of_the_chosen() -> None:
    fake = FakeEngine(replies=("abc", "z"))
    async with fake_server(fake) as (client, _):
        body = {"prompt": "Hi", "best_of": 2, "logprobs": 1}
        choice = (await client.post("/v1/completions", json=body)).json()["choices"][0]
    assert choice["text"] == "z"
    assert choice["logprobs"]["token_logprobs"] == [-1 / 8]
    assert fake.submitted[0].params.logprobs == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"n": 2, "best_of": 1}, "best_of must be an integer in [n, 64] (n is 2)"),
        ({"best_of": 65}, "best_of must be an integer in [n, 64] (n is 1)"),
        ({"best_of": 0}, "best_of must be an integer in [n, 64] (n is 1)"),
        (
            {"best_of": True},
            "Validation failed for POST /v1/completions: Expected `int | null`, got `bool`",
        ),
        ({"best_of": 2, "stream": True}, "best_of > n cannot be streamed"),
    ],
)
async def test_best_of_refusals(fields: dict[str, Any], message: str) -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        response = await client.post("/v1/completions", json={"prompt": "Hi", **fields})
    openai_error(response, 400, param="best_of", message=message)
    assert fake.submitted == []


@pytest.mark.parametrize(
    "fields", [{"n": 65, "best_of": 65}, {"n": 0, "best_of": 1, "stream": True}]
)
async def test_a_bad_n_is_named_before_best_of(fields: dict[str, Any]) -> None:
    async with fake_server(FakeEngine()) as (client, _):
        response = await client.post("/v1/completions", json={"prompt": "Hi", **fields})
    openai_error(response, 400, param="n")


@pytest.mark.parametrize("best_of", [1, 64])
async def test_best_of_at_its_bounds_is_served(best_of: int) -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        body = {"prompt": "Hi", "best_of": best_of, "stream": best_of == 1}
        response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert fake.submitted[0].params.n == best_of


async def test_completion_n_stream_finishes_each_index_once() -> None:
    fake = FakeEngine(replies=("ab", "xyz"))
    async with fake_server(fake) as (client, _):
        body = {"prompt": ["Hi", "Yo!"], "n": 2, "stream": True}
        chunks = sse_chunks(await client.post("/v1/completions", json=body))
    texts: dict[int, str] = {}
    finished = []
    for chunk in chunks:
        [choice] = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finished.append(choice["index"])
    assert texts == {0: "ab", 1: "xyz", 2: "ab", 3: "xyz"}
    assert sorted(finished) == [0, 1, 2, 3]


async def test_chat_n() -> None:
    fake = FakeEngine(replies=("ab", "xyz"))
    async with fake_server(fake) as (client, _):
        whole = (await client.post("/v1/chat/completions", json={"messages": HI, "n": 2})).json()
        body = {"messages": HI, "n": 2, "stream": True}
        chunks = sse_chunks(await client.post("/v1/chat/completions", json=body))
    assert [(c["index"], c["message"]["content"]) for c in whole["choices"]] == [
        (0, "ab"),
        (1, "xyz"),
    ]
    assert whole["usage"] == usage(19, 5)
    # Every choice opens with its role before any content.
    assert chunks[:2] == [
        chat_chunk(chunks[i], i, {"role": "assistant", "content": ""}) for i in (0, 1)
    ]
    content = {0: "", 1: ""}
    for chunk in chunks[2:]:
        [choice] = chunk["choices"]
        content[choice["index"]] += choice["delta"].get("content", "")
    assert content == {0: "ab", 1: "xyz"}


async def test_completion_echo() -> None:
    fake = FakeEngine(replies=("ok",))
    async with fake_server(fake) as (client, _):
        text = (await client.post("/v1/completions", json={"prompt": "Hi", "echo": True})).json()
        ids = await client.post("/v1/completions", json={"prompt": [[72, 105]], "echo": True})
        body = {"prompt": "Hi", "echo": True, "n": 2, "stream": True}
        chunks = sse_chunks(await client.post("/v1/completions", json=body))
    assert text["choices"][0]["text"] == "Hiok"
    assert ids.json()["choices"][0]["text"] == "Hiok"  # token ids are decoded to echo them
    # Each choice's first chunk carries the prompt, once.
    assert [(c["choices"][0]["index"], c["choices"][0]["text"]) for c in chunks] == [
        (0, "Hio"),
        (1, "Hio"),
        (0, "k"),
        (1, "k"),
    ]


# -- logprobs ------------------------------------------------------------------------------------


async def test_completion_logprobs() -> None:
    fake = FakeEngine(replies=("ab",))
    async with fake_server(fake) as (client, _):
        body = {"prompt": "Hi", "logprobs": 2}
        whole = (await client.post("/v1/completions", json=body)).json()
        echoed = (await client.post("/v1/completions", json={**body, "echo": True})).json()
        chunks = sse_chunks(await client.post("/v1/completions", json={**body, "stream": True}))
    expected = {
        "tokens": ["a", "b"],
        "token_logprobs": [-0.125, -0.25],
        "top_logprobs": [{"a": -0.125, "b": -1.125}, {"b": -0.25, "c": -1.25}],
        "text_offset": [0, 1],
    }
    assert whole["choices"][0]["logprobs"] == expected
    assert fake.submitted[0].params.logprobs == 2
    # Echoed: the offsets count from the start of the echoed prompt.
    assert echoed["choices"][0]["logprobs"]["text_offset"] == [2, 3]
    # Streamed: each chunk carries its own tokens' logprobs, offsets from the chunk's start.
    assert [c["choices"][0]["logprobs"] for c in chunks] == [
        {
            "tokens": ["a"],
            "token_logprobs": [-0.125],
            "top_logprobs": [{"a": -0.125, "b": -1.125}],
            "text_offset": [0],
        },
        {
            "tokens": ["b"],
            "token_logprobs": [-0.25],
            "top_logprobs": [{"b": -0.25, "c": -1.25}],
            "text_offset": [0],
        },
    ]


def chat_token(token: str, logprob: float, top: list[tuple[str, float]]) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top],
    }


async def test_chat_logprobs() -> None:
    fake = FakeEngine(replies=("ab",))
    async with fake_server(fake) as (client, _):
        body = {"messages": HI, "logprobs": True, "top_logprobs": 2}
        whole = (await client.post("/v1/chat/completions", json=body)).json()
        bare = await client.post("/v1/chat/completions", json={"messages": HI, "logprobs": True})
        none = await client.post("/v1/chat/completions", json={"messages": HI})
        body = {**body, "stream": True}
        chunks = sse_chunks(await client.post("/v1/chat/completions", json=body))
    assert whole["choices"][0]["logprobs"] == {
        "content": [
            chat_token("a", -0.125, [("a", -0.125), ("b", -1.125)]),
            chat_token("b", -0.25, [("b", -0.25), ("c", -1.25)]),
        ]
    }
    # logprobs without top_logprobs: the chosen tokens' only.
    assert bare.json()["choices"][0]["logprobs"] == {
        "content": [chat_token("a", -0.125, []), chat_token("b", -0.25, [])]
    }
    assert none.json()["choices"][0]["logprobs"] is None
    assert [s.params.logprobs for s in fake.submitted] == [2, 0, None, 2]
    assert [c["choices"][0]["logprobs"] for c in chunks] == [
        None,  # the role chunk
        {"content": [chat_token("a", -0.125, [("a", -0.125), ("b", -1.125)])]},
        {"content": [chat_token("b", -0.25, [("b", -0.25), ("c", -1.25)])]},
    ]


# -- sampling fields reach the engine ------------------------------------------------------------


async def test_sampling_fields_reach_the_engine() -> None:
    fake = FakeEngine()
    fields = {
        "temperature": 0.5,
        "top_p": 0.75,
        "top_k": 4,
        "min_p": 0.125,
        "seed": -7,
        "stop": ["x", "yz"],
        "stop_token_ids": [3],
        "ignore_eos": True,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.25,
        "logit_bias": {"5": 1.5},
    }
    async with fake_server(fake) as (client, _):
        for route, body in (
            ("/v1/completions", {"prompt": "Hi", "max_tokens": 3}),
            ("/v1/chat/completions", {"messages": HI, "max_tokens": 3}),
        ):
            response = await client.post(route, json={**body, **fields})
            assert response.status_code == 200, response.text
        one_stop = await client.post("/v1/completions", json={"prompt": "Hi", "stop": "x"})
        assert one_stop.status_code == 200
    expected = SamplingParams(
        max_tokens=3,
        temperature=0.5,
        top_p=0.75,
        top_k=4,
        min_p=0.125,
        seed=-7,
        stop=("x", "yz"),
        stop_token_ids=(3,),
        ignore_eos=True,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.25,
        logit_bias={5: 1.5},
    )
    assert [s.params for s in fake.submitted[:2]] == [expected, expected]
    assert fake.submitted[2].params.stop == ("x",)


@pytest.mark.parametrize(("reply", "finish"), [("ab", "stop"), ("abcdef", "length")])
async def test_finish_reason_is_the_engines(reply: str, finish: str) -> None:
    fake = FakeEngine(replies=(reply,))
    async with fake_server(fake) as (client, _):
        plain = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
        chat = await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 4})
    assert plain.json()["choices"][0]["finish_reason"] == finish
    assert chat.json()["choices"][0]["finish_reason"] == finish


async def test_cached_tokens_are_reported() -> None:
    fake = FakeEngine(cached_tokens=16)
    async with fake_server(fake) as (client, _):
        plain = (await client.post("/v1/completions", json={"prompt": "Hi"})).json()
        chat = (await client.post("/v1/chat/completions", json={"messages": HI})).json()
    assert plain["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    assert chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}


# -- refusals ------------------------------------------------------------------------------------

# error raised by submit -> status, error type, Retry-After, param, message
REFUSALS = {
    "queue-full": (QueueFullError("3 waiting"), 429, "rate_limit_error", "1", None, "3 waiting"),
    "closed": (EngineClosedError("shutting down"), 503, "service_unavailable", "5", None, "shutting down"),
    "dead": (EngineDeadError("loop stopped"), 500, "internal_server_error", None, None, "loop stopped"),
    "request": (RequestError("max_tokens", "too long"), 400, "invalid_request_error", None, "max_tokens", "too long"),
    "params": (SamplingParamsError("stop_token_ids", "outside"), 400, "invalid_request_error", None, "stop_token_ids", "stop_token_ids: outside"),
    # ours, not the client's: the type and message are named, never a 4xx
    "geometry": (GeometryError("rows 3 > 2"), 500, "internal_server_error", None, None, "internal error: GeometryError: rows 3 > 2"),
}  # fmt: skip
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/v1/completions", {"prompt": "Hi"}),
    "chat": ("/v1/chat/completions", {"messages": HI}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("refusal", sorted(REFUSALS))
async def test_a_refused_submit_is_an_error_before_any_byte(
    refusal: str, route: str, stream: bool
) -> None:
    error, status, kind, retry_after, param, message = REFUSALS[refusal]
    fake = FakeEngine(refusals=[error])
    path, body = ROUTES[route]
    async with fake_server(fake) as (client, _):
        response = await client.post(path, json={**body, "stream": stream})
    found = openai_error(response, status, type=kind, param=param, message=message)
    if refusal == "queue-full":
        assert found["code"] == "queue_full"
    assert response.headers.get("retry-after") == retry_after
    assert fake.submitted == []


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_full_queue_is_429_before_the_body_is_read(path: str) -> None:
    """The body here is not even JSON: refused for the queue, it was never decoded."""
    fake = FakeEngine(room=0)
    async with fake_server(fake) as (client, _):
        response = await client.post(
            path, content=b"{not json", headers={"content-type": "application/json"}
        )
        models = await client.get("/v1/models")
    error = openai_error(response, 429, code="queue_full")
    assert error["message"] == "the fake's queue takes 0 more"
    assert response.headers["retry-after"] == "1"
    assert fake.submitted == []
    assert models.status_code == 200  # a GET asks for no room


async def test_a_refused_prompt_closes_the_prompts_submitted_before_it() -> None:
    fake = FakeEngine(refusals=[None, QueueFullError("full")])
    async with fake_server(fake) as (client, _):
        response = await client.post("/v1/completions", json={"prompt": ["a", "b", "c"]})
    openai_error(response, 429, code="queue_full")
    [first] = fake.submitted
    assert fake.closed == [first.request_id]  # not left running for nobody


async def test_an_engine_failure_mid_answer_is_a_500() -> None:
    def script(request_id: str, _: list[int], __: SamplingParams) -> list[Delta | BaseException]:
        first = Delta(request_id, 0, "a", (97,), None, None, None, 2, 1)
        return [first, EngineDeadError("engine step failed: boom")]

    fake = FakeEngine(script=script)
    async with fake_server(fake) as (client, _):
        response = await client.post("/v1/completions", json={"prompt": ["a", "b"]})
    openai_error(response, 500, message="engine step failed: boom", type="internal_server_error")
    assert sorted(fake.closed) == sorted(s.request_id for s in fake.submitted)

"""The official `openai` client against the live server: what a real client sees."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name three colors."}]


def _stream_text(chunks: list[Any], index: int = 0) -> str:
    return "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == index)


def test_models_list(client: Any, model_name: str) -> None:
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [model_name]
    card = models.data[0]
    assert card.object == "model"
    assert card.model_extra["max_model_len"] == 1024


def test_completion_non_stream(client: Any, model_name: str) -> None:
    out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=8, temperature=0)
    assert out.object == "text_completion"
    assert out.model == model_name
    assert out.id.startswith("cmpl-")
    assert len(out.choices) == 1
    choice = out.choices[0]
    assert choice.index == 0
    assert choice.text
    assert choice.finish_reason in ("length", "stop")
    assert out.usage.completion_tokens == 8 or choice.finish_reason == "stop"
    assert out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_completion_greedy_stream_equals_non_stream(client: Any, model_name: str) -> None:
    request = {"model": model_name, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    whole = client.completions.create(**request)
    chunks = list(client.completions.create(**request, stream=True))
    assert _stream_text(chunks) == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    assert {c.id for c in chunks} == {chunks[0].id}


def test_chat_greedy_stream_equals_non_stream(client: Any, model_name: str) -> None:
    request = {"model": model_name, "messages": MESSAGES, "max_tokens": 24, "temperature": 0}
    whole = client.chat.completions.create(**request)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content
    chunks = list(client.chat.completions.create(**request, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_completion_usage_in_stream(client: Any, model_name: str) -> None:
    request = {"model": model_name, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    whole = client.completions.create(**request)
    chunks = list(
        client.completions.create(**request, stream=True, stream_options={"include_usage": True})
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.total_tokens == whole.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # Without include_usage no chunk carries usage.
    plain = list(client.completions.create(**request, stream=True))
    assert all(c.usage is None for c in plain)


def test_chat_usage_in_stream(client: Any, model_name: str) -> None:
    request = {"model": model_name, "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    whole = client.chat.completions.create(**request)
    chunks = list(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
    )
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completion_n(client: Any, model_name: str) -> None:
    request = {
        "model": model_name,
        "prompt": PROMPT,
        "max_tokens": 5,
        "temperature": 1.0,
        "n": 3,
        "seed": 7,
        "extra_body": {"ignore_eos": True},
    }
    out = client.completions.create(**request)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.completion_tokens == 15
    assert len({c.text for c in out.choices}) > 1, "samples should differ (seed + index)"
    # Streams carry every index, and each index finishes exactly once.
    chunks = list(client.completions.create(**request, stream=True))
    finished = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finished) == [0, 1, 2]
    # Same seed: the stream's samples are the non-stream's samples.
    for index in range(3):
        assert _stream_text(chunks, index) == out.choices[index].text


def test_chat_n(client: Any, model_name: str) -> None:
    out = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=4, temperature=1.0, n=2, seed=3
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.message.content is not None for c in out.choices)


def test_completion_prompt_list(client: Any, model_name: str) -> None:
    out = client.completions.create(
        model=model_name, prompt=[PROMPT, "One, two,"], max_tokens=3, temperature=0, n=2
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    # Greedy: both samples of a prompt agree.
    assert out.choices[0].text == out.choices[1].text
    assert out.choices[2].text == out.choices[3].text
    single = client.completions.create(
        model=model_name, prompt="One, two,", max_tokens=3, temperature=0
    )
    assert out.choices[2].text == single.choices[0].text


def test_completion_token_id_prompt(client: Any, model_name: str) -> None:
    ids = [504, 3575, 282, 4649, 314]
    one = client.completions.create(model=model_name, prompt=ids, max_tokens=4, temperature=0)
    assert one.usage.prompt_tokens == 5
    assert one.choices[0].text
    two = client.completions.create(
        model=model_name, prompt=[ids, ids[:3]], max_tokens=4, temperature=0, echo=True
    )
    assert two.usage.prompt_tokens == 8
    assert [c.index for c in two.choices] == [0, 1]
    # echo decodes the ids; the greedy answer to the same ids is the same.
    assert two.choices[0].text.endswith(one.choices[0].text)
    assert len(two.choices[0].text) > len(one.choices[0].text)


def test_stop_string(client: Any, model_name: str) -> None:
    base = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0)
    text = base.choices[0].text
    assert len(text) > 4
    stop = text[2:4]  # a stop string inside the greedy answer
    cut = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    chunks = list(
        client.completions.create(
            model=model_name, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True
        )
    )
    assert _stream_text(chunks) == cut.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_stop_string(client: Any, model_name: str) -> None:
    request = {"model": model_name, "messages": MESSAGES, "max_tokens": 24, "temperature": 0}
    text = client.chat.completions.create(**request).choices[0].message.content
    assert len(text) > 4
    stop = text[3:5]
    cut = client.chat.completions.create(**request, stop=stop)
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completion_logprobs(client: Any, model_name: str) -> None:
    out = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3
    )
    choice = out.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset[0] == 0
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0.0 and math.isfinite(logprob)
        assert 1 <= len(top) <= 3
        # Greedy: the chosen token is the most likely one.
        assert max(top.values()) == pytest.approx(logprob, abs=1e-5)
        assert top.get(token, logprob) == pytest.approx(logprob, abs=1e-5)
    # Streamed logprobs arrive with their tokens.
    chunks = list(
        client.completions.create(
            model=model_name, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3, stream=True
        )
    )
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_completion_echo(client: Any, model_name: str) -> None:
    plain = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0)
    echoed = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=4, temperature=0, echo=True
    )
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    chunks = list(
        client.completions.create(
            model=model_name, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, stream=True
        )
    )
    assert _stream_text(chunks) == PROMPT + plain.choices[0].text
    both = list(
        client.completions.create(
            model=model_name,
            prompt=PROMPT,
            max_tokens=4,
            temperature=0,
            echo=True,
            n=2,
            stream=True,
        )
    )
    assert _stream_text(both, 0) == _stream_text(both, 1) == PROMPT + plain.choices[0].text
    with_lp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=1
    )
    assert with_lp.choices[0].logprobs.text_offset[0] == len(PROMPT)


def test_chat_logprobs(client: Any, model_name: str) -> None:
    out = client.chat.completions.create(
        model=model_name,
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    choice = out.choices[0]
    content = choice.logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert "".join(t.token for t in content) == choice.message.content
    for item in content:
        assert item.logprob <= 0.0
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob, abs=1e-5)
        assert bytes(item.bytes).decode() == item.token
    # logprobs without top_logprobs: the chosen token's only.
    bare = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True
    )
    assert all(item.top_logprobs == [] for item in bare.choices[0].logprobs.content)
    none = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=3, temperature=0
    )
    assert none.choices[0].logprobs is None
    chunks = list(
        client.chat.completions.create(
            model=model_name,
            messages=MESSAGES,
            max_tokens=5,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
    )
    streamed = [
        item.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for item in c.choices[0].logprobs.content
    ]
    assert streamed == pytest.approx([item.logprob for item in content], abs=1e-5)


def test_seed_reproducible(client: Any, model_name: str) -> None:
    request = {"model": model_name, "prompt": PROMPT, "max_tokens": 16, "temperature": 1.0}
    first = client.completions.create(**request, seed=1234).choices[0].text
    second = client.completions.create(**request, seed=1234).choices[0].text
    assert first == second
    others = {client.completions.create(**request, seed=s).choices[0].text for s in (1, 2, 3)}
    assert len(others | {first}) > 1, "different seeds should not all give the same text"
    chat = {"model": model_name, "messages": MESSAGES, "max_tokens": 12, "temperature": 1.0}
    a = client.chat.completions.create(**chat, seed=99).choices[0].message.content
    b = client.chat.completions.create(**chat, seed=99).choices[0].message.content
    assert a == b


def test_max_completion_tokens(client: Any, model_name: str) -> None:
    out = client.chat.completions.create(
        model=model_name,
        messages=MESSAGES,
        max_completion_tokens=3,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.usage.completion_tokens == 3
    assert out.choices[0].finish_reason == "length"


def test_openai_client_raises_on_bad_request(client: Any, model_name: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)
    assert raised.value.status_code == 400
    assert raised.value.code == "model_not_found"
    assert raised.value.param == "model"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_name, messages=MESSAGES, temperature=3.0)


def test_concurrent_requests_match_sequential(client: Any, model_name: str) -> None:
    """Requests batched together answer as they do alone (greedy; the engine is batch-invariant
    by default), and every concurrent caller gets its own answer."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"{i} plus {i} equals" for i in range(6)]

    def ask(prompt: str) -> str:
        out = client.completions.create(
            model=model_name,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        return out.choices[0].text

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone

"""The <think> splitter alone (exact splits, any chunking), and on the chat route over a
FakeEngine whose template thinks: message fields, streamed deltas, chat_template_kwargs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.api.chat.reasoning import OFF, ReasoningPlan, ReasoningSplitter
from nanoserve.runtime.text.chat_template import ChatTemplate
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, sse_chunks

HI = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("text", "inside", "expected"),
    [
        ("<think>hmm</think>\n\nHello", False, ("hmm", "Hello")),
        ("\n<think>a\nb</think>Hi", False, ("a\nb", "Hi")),
        ("Hello, no thinking", False, (None, "Hello, no thinking")),
        ("<think>cut off", False, ("cut off", "")),
        ("hmm</think>\n\nHello", True, ("hmm", "Hello")),  # the prompt opened it
        ("<think></think>Hi", False, ("", "Hi")),
        ("a <think> in the middle", False, (None, "a <think> in the middle")),
        ("<thi", False, (None, "<thi")),  # a tag never finished is text
    ],
)
def test_split(text: str, inside: bool, expected: tuple[str | None, str]) -> None:
    assert ReasoningPlan(True, inside).split(text) == expected


def test_off_is_a_no_op() -> None:
    assert OFF.split("<think>x</think>y") == (None, "<think>x</think>y")
    assert ReasoningPlan.of(False, "<think>") is OFF


def test_the_prompt_decides_where_it_starts() -> None:
    assert ReasoningPlan.of(True, "<|im_start|>assistant\n<think>\n").starts_inside
    assert not ReasoningPlan.of(True, "assistant\n<think>\n\n</think>\n\n").starts_inside
    assert not ReasoningPlan.of(True, "<|im_start|>assistant\n").starts_inside
    # a tag in the conversation is text: only the prompt's end opens the reasoning
    asked = "<|im_start|>user\nWhat does <think> do?<|im_end|>\n<|im_start|>assistant\n"
    assert ReasoningPlan.of(True, asked).split("It opens.") == (None, "It opens.")


def test_a_grammar_turns_it_off() -> None:
    """JSON or calls from the first token: nothing to split (the calls are in the content)."""
    assert ReasoningPlan.of(True, "assistant\n<think>\n", constrained=True) is OFF


TEXTS = st.sampled_from(
    [
        "<think>x y</think>\n\nanswer",
        "plain",
        "  <think>\n</think>ok",
        "<think>never ends",
        "</think>",
    ]
)


@given(TEXTS, st.lists(st.integers(1, 6), max_size=12), st.booleans())
def test_any_chunking_gives_the_whole_split(text: str, cuts: list[int], inside: bool) -> None:
    splitter = ReasoningSplitter(inside)
    reasoning, content, at = "", "", 0
    for size in cuts:
        r, c = splitter.push(text[at : at + size])
        reasoning, content, at = reasoning + r, content + c, at + size
    r, c = splitter.push(text[at:], final=True)
    whole = ReasoningPlan(True, inside).split(text)
    assert (reasoning + r, content + c) == (whole[0] or "", whole[1])


@pytest.mark.anyio
async def test_a_thinking_answer_is_split_in_the_message() -> None:
    fake = FakeEngine(replies=("<think>Let me see.</think>\n\nHello!",), template_thinks=True)
    async with fake_server(fake) as (client, _):
        body = (await client.post("/v1/chat/completions", json={"messages": HI})).json()
    message = body["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": "Hello!",
        "reasoning_content": "Let me see.",
        "reasoning": "Let me see.",
    }


@pytest.mark.anyio
async def test_a_template_without_tags_leaves_the_text_alone() -> None:
    fake = FakeEngine(replies=("<think>x</think>y",))
    async with fake_server(fake) as (client, _):
        body = (await client.post("/v1/chat/completions", json={"messages": HI})).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "<think>x</think>y"}


@pytest.mark.anyio
async def test_streamed_reasoning_comes_as_its_own_deltas() -> None:
    fake = FakeEngine(replies=("<think>ab</think>\n\ncd",), template_thinks=True)
    async with fake_server(fake) as (client, _):
        response = await client.post("/v1/chat/completions", json={"messages": HI, "stream": True})
    deltas = [c["choices"][0]["delta"] for c in sse_chunks(response)]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert reasoning == "ab" == "".join(d.get("reasoning", "") for d in deltas)
    assert "".join(d.get("content", "") for d in deltas) == "cd"
    # one character a token: nothing of a tag is ever sent
    assert not any("<" in d.get("content", "") + d.get("reasoning", "") for d in deltas)


@pytest.mark.anyio
async def test_chat_template_kwargs_reach_the_template() -> None:
    fake = FakeEngine(template_thinks=True)
    async with fake_server(fake) as (client, _):
        await client.post(
            "/v1/chat/completions",
            json={"messages": HI, "chat_template_kwargs": {"enable_thinking": False}},
        )
        refused = await client.post(
            "/v1/chat/completions",
            json={"messages": HI, "chat_template_kwargs": {"messages": []}},
        )
    assert fake.template_vars == [{"enable_thinking": False}]
    assert refused.status_code == 400 and "messages" in refused.json()["error"]["message"]


QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def test_enable_thinking_on_a_template_that_has_it() -> None:
    """On a Qwen3-style template: thinking off closes an empty <think> in the prompt, so the
    answer starts as content; thinking on (the default) leaves it to the model."""
    template = ChatTemplate(QWEN3_LIKE, source="qwen3-like")
    assert template.thinks
    off = template.render(HI, enable_thinking=False)
    on = template.render(HI)
    assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")
    assert not ReasoningPlan.of(True, off).starts_inside
    assert ReasoningPlan.of(True, off).split("Hello") == (None, "Hello")
    assert not ChatTemplate("{{ messages[0].content }}", source="plain").thinks

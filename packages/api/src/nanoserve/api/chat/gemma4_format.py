"""Gemma 4's answer format: its thinking channel and its tool calls, as its chat template asks
for them.

A Gemma 4 prompt ends inside an open model turn (`<|turn>model\n`). The answer may open with its
thoughts, `<|channel>thought\n…<channel|>` (the message's `reasoning_content`, split by
reasoning.py with these tags), and may call tools, each call
`<|tool_call>call:NAME{…}<tool_call|>` (split by tool_calls.py with this wire format). A call's
arguments are written in Gemma's own object syntax, not JSON: keys bare, strings between
`<|"|>` marks, numbers, booleans and null bare, objects in braces and lists in brackets;
`arguments` turns them into the JSON object OpenAI's `arguments` hold. These marks are special
tokens, so the answer is decoded with them kept (engine_inputs.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from nanoserve.api.chat.schemas import FunctionCall

TURN_OPEN, TURN_CLOSE = "<|turn>model", "<turn|>"
THOUGHT = ("<|channel>thought\n", "<channel|>")  # the reasoning's opening and closing marks
CALL = ("<|tool_call>", "<tool_call|>")
QUOTE = '<|"|>'  # a string's both ends
_HEAD = re.compile(r"\s*call:([A-Za-z0-9_.-]{1,64})\s*(\{.*\})\s*", re.DOTALL)
_BARE_END = ",}]"


def speaks_gemma4(prompt_text: str) -> bool:
    """Whether a rendered prompt asks for a Gemma 4 answer: it ends inside a model turn."""
    opened = prompt_text.rfind(TURN_OPEN)
    return opened >= 0 and prompt_text.rfind(TURN_CLOSE) < opened


def parse_gemma4_call(body: str, names: set[str]) -> FunctionCall | None:
    """One call's body (`call:NAME{…}`) as a call, or None when it is not one of ours."""
    match = _HEAD.fullmatch(body)
    if match is None or match[1] not in names:
        return None
    try:
        value = arguments(match[2])
    except (ValueError, RecursionError):  # the model's text: anything at all
        return None
    if not isinstance(value, dict):
        return None
    return FunctionCall(name=match[1], arguments=json.dumps(value, ensure_ascii=False))


def arguments(text: str) -> Any:
    """Gemma's object syntax as the value it writes (ValueError where it is not that)."""
    value, at = _value(text, 0)
    if text[at:].strip():
        raise ValueError(f"text after the value at {at}")
    return value


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _value(text: str, at: int) -> tuple[Any, int]:
    at = _skip(text, at)
    if text.startswith(QUOTE, at):
        end = text.find(QUOTE, at + len(QUOTE))
        if end < 0:
            raise ValueError(f"a string opened at {at} is never closed")
        return text[at + len(QUOTE) : end], end + len(QUOTE)
    if text.startswith("{", at):
        return _object(text, at + 1)
    if text.startswith("[", at):
        return _list(text, at + 1)
    end = at
    while end < len(text) and text[end] not in _BARE_END:
        end += 1
    word = text[at:end].strip()
    if not word:
        raise ValueError(f"no value at {at}")
    try:  # a number, true, false or null; any other bare word is text
        return json.loads(word), end
    except json.JSONDecodeError:
        return word, end


def _items(text: str, at: int, close: str, item: Callable[[int], int]) -> int:
    """The items of an object or list from `at` to its `close`, each read by `item` (which
    returns where it ended), comma-separated: where the close ends."""
    at = _skip(text, at)
    if text.startswith(close, at):
        return at + 1
    while True:
        at = _skip(text, item(at))
        if text.startswith(close, at):
            return at + 1
        if not text.startswith(",", at):
            raise ValueError(f"expected , or {close} at {at}")
        at += 1


def _object(text: str, at: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}

    def member(at: int) -> int:
        at = _skip(text, at)
        if text.startswith(QUOTE, at):  # a key may be written as a string too
            key, at = _value(text, at)
            at = _skip(text, at)
            colon = at if text.startswith(":", at) else -1
        else:
            colon = text.find(":", at)
            key = text[at:colon].strip().strip('"')
        if colon < 0 or not key:
            raise ValueError(f"no key at {at}")
        out[key], end = _value(text, colon + 1)
        return end

    return out, _items(text, at, "}", member)


def _list(text: str, at: int) -> tuple[list[Any], int]:
    out: list[Any] = []

    def element(at: int) -> int:
        value, end = _value(text, at)
        out.append(value)
        return end

    return out, _items(text, at, "]", element)

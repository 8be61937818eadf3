"""gpt-oss's answers in OpenAI's harmony format, split into reasoning, content and tool calls.

A harmony answer is a run of messages, each a header and a body:
`<|channel|>analysis<|message|>…<|end|>` (the reasoning),
`<|start|>assistant<|channel|>final<|message|>…<|return|>` (the answer), or a call:
`<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
{"city": "Paris"}<|call|>` (the recipient may also stand before the channel). The prompt ends
with `<|start|>assistant`, so the first header begins at once.

- The `analysis` channel is `reasoning_content`; `final`, and `commentary` addressed to no one
  (a preamble to the user), are `content`.
- A message addressed `to=functions.NAME` is a tool call when NAME is one of the request's
  tools (its body, the arguments, whole at its end); else its body is content.
- Streamed, the reasoning and content flow as they come; a marker cut between two deltas is
  held until it is known, and a call is sent once its message ends. Text outside any message
  (a model that does not speak harmony) is content, so nothing is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nanoserve.api.chat.schemas import FunctionCall, ToolCallDelta
from nanoserve.api.chat.tool_calls import ToolPlan, call_deltas

START, MESSAGE, CHANNEL = "<|start|>", "<|message|>", "<|channel|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")  # a message's end (the last two also the answer's)
MARKERS = (START, MESSAGE, CHANNEL, "<|constrain|>", *ENDS)
OPENS = (START, CHANNEL)  # a header's beginnings: a body that meets one has ended
PROMPT_END = "<|start|>assistant"  # how a harmony generation prompt ends
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")

REASONING, CONTENT, CALL = "reasoning", "content", "call"


def speaks_harmony(prompt_text: str) -> bool:
    """Whether a rendered prompt asks for a harmony answer (gpt-oss's template)."""
    return prompt_text.rstrip().endswith(PROMPT_END)


@dataclass(slots=True)
class HarmonySplit:
    """What one push gave: reasoning text, content text, and whole calls' deltas."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


class HarmonyStream:
    """One answer's text, pushed as it streams. `tools`: the function names a call may address
    (None: tools are not in play, and every message is text)."""

    __slots__ = (
        "_body",
        "_buffer",
        "_header",
        "_in_body",
        "_name",
        "_route",
        "_tools",
        "num_calls",
    )

    def __init__(self, tools: frozenset[str] | None) -> None:
        self._tools = tools
        self._buffer = ""  # text not yet routed (a marker may begin in it)
        self._header = ""  # the current message's header so far
        self._in_body = False
        self._route = CONTENT  # where the current body goes
        self._body = ""  # a call's arguments so far
        self._name = ""  # the function it calls
        self.num_calls = 0

    def push(self, text: str, *, final: bool = False) -> HarmonySplit:
        out = HarmonySplit()
        self._buffer += text
        while True:
            if self._in_body:  # a body ends at its end marker, or where a header starts
                at, marker = _first(self._buffer, (*ENDS, *OPENS))
                if marker is None:
                    keep = 0 if final else _partial_marker(self._buffer)
                    self._emit(out, self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    if final:
                        self._end_message(out)
                    return out
                self._emit(out, self._buffer[:at])
                self._buffer = self._buffer[at + (0 if marker in OPENS else len(marker)) :]
                self._end_message(out)
                continue
            at = self._buffer.find(MESSAGE)
            if at < 0:
                if final:  # a header never closed: not harmony after all, so content
                    out.content += _unmarked(self._header + self._buffer)
                    self._header = self._buffer = ""
                return out
            self._header += self._buffer[:at]
            self._buffer = self._buffer[at + len(MESSAGE) :]
            self._open_body()

    def _open_body(self) -> None:
        header, self._header = self._header, ""
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        self._in_body, self._body = True, ""
        if recipient is not None:
            name = recipient[1].removeprefix("functions.")
            self._route = CALL if self._tools is not None and name in self._tools else CONTENT
            self._name = name
        elif channel is not None and channel[1] == "analysis":
            self._route = REASONING
        else:
            self._route = CONTENT

    def _emit(self, out: HarmonySplit, text: str) -> None:
        if self._route == REASONING:
            out.reasoning += text
        elif self._route == CALL:
            self._body += text
        else:
            out.content += text

    def _end_message(self, out: HarmonySplit) -> None:
        if self._route == CALL:
            call = FunctionCall(name=self._name, arguments=self._body.strip())
            out.calls += call_deltas(self.num_calls, call)
            self.num_calls += 1
        self._body, self._name, self._in_body, self._route = "", "", False, CONTENT
        # what follows a message's end up to the next `<|start|>` is not text (a role)
        self._buffer = self._buffer.lstrip()
        if self._buffer.startswith(START):
            self._buffer = self._buffer[len(START) :]


def harmony_stream(plan: ToolPlan) -> HarmonyStream:
    """A stream for an answer whose calls may address the plan's tools (where it parses)."""
    return HarmonyStream(frozenset(t.function.name for t in plan.tools) if plan.parses else None)


def split_harmony(text: str, plan: ToolPlan) -> HarmonySplit:
    """A whole answer, split."""
    return harmony_stream(plan).push(text, final=True)


def _first(text: str, markers: tuple[str, ...]) -> tuple[int, str | None]:
    """The earliest of `markers` in text: (where, which), or (-1, None)."""
    found = [(at, m) for m in markers if (at := text.find(m)) >= 0]
    return min(found) if found else (-1, None)


def _partial_marker(text: str) -> int:
    """The length of the longest end of text that may begin a marker (held back)."""
    for size in range(min(max(len(m) for m in MARKERS) - 1, len(text)), 0, -1):
        tail = text[-size:]
        if any(m.startswith(tail) for m in MARKERS):
            return size
    return 0


def _unmarked(text: str) -> str:
    """Text with any harmony markers (and a leading role) removed."""
    for marker in MARKERS:
        text = text.replace(marker, "")
    return text

"""Reasoning output: a `<think>…</think>` answer split into its reasoning and its content.

For chat templates that write thinking in these tags (Qwen3, SmolLM3, DeepSeek-R1's
distillations), the text between them is the message's `reasoning_content` (also sent as
`reasoning`: vLLM and llama.cpp use the first name, OpenRouter and newer vLLM the second), the
rest its `content`. A model may open the tag itself, or the template may have opened it at the
end of the prompt (Qwen3's thinking-only variants): `ReasoningPlan.starts_inside` says which.
A template without the tags is left alone: the plan is off and the text is all content. A
prompt that asks for a harmony answer (gpt-oss) is split by harmony.py instead; one that asks for a
Gemma 4 answer is split here with its own marks, `<|channel>thought\n…<channel|>`
(gemma4_format.py), whatever its template says of <think>.

Streamed, a possible tag cut between two deltas (`</th` + `ink>`) is held back until it is known;
the whitespace between `</think>` and the answer is dropped, as the peers drop it.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve.api.chat.gemma4_format import THOUGHT, speaks_gemma4
from nanoserve.api.chat.harmony import speaks_harmony

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningPlan:
    parses: bool  # the template writes <think> tags: split the answer
    starts_inside: bool = False  # the prompt ends inside an open <think>
    # The prompt asks for a harmony answer (gpt-oss): its channels are split by harmony.py,
    # which finds its tool calls too.
    harmony: bool = False
    tags: tuple[str, str] = (OPEN, CLOSE)  # the reasoning's opening and closing marks

    @classmethod
    def of(
        cls, template_thinks: bool, prompt_text: str, *, constrained: bool = False
    ) -> ReasoningPlan:
        """Off where the template has no tags, and where a grammar constrains the answer (it
        is JSON or calls from the first token: there is no thinking to split). Inside when
        the prompt itself ends with an open <think> (a tag elsewhere in it, a user's
        question about tags, says nothing)."""
        if constrained:
            return OFF
        if speaks_harmony(prompt_text):
            return cls(True, harmony=True)
        if speaks_gemma4(prompt_text):
            return cls(True, prompt_text.endswith(THOUGHT[0]), tags=THOUGHT)
        if not template_thinks:
            return OFF
        return cls(True, prompt_text.rstrip().endswith(OPEN))

    @property
    def keeps_marks(self) -> bool:
        """Whether the answer must be decoded with its special tokens kept: harmony's and
        Gemma 4's marks are special tokens (<think> is plain text)."""
        return self.harmony or self.tags != (OPEN, CLOSE)

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.starts_inside, self.tags)

    def split(self, text: str) -> tuple[str | None, str]:
        """A whole answer: (reasoning or None if there was none, content)."""
        if not self.parses:
            return None, text
        splitter = self.splitter()
        reasoning, content = splitter.push(text, final=True)
        return (reasoning if splitter.reasoned else None), content


OFF = ReasoningPlan(False)

_START, _REASONING, _AFTER, _CONTENT = range(4)


class ReasoningSplitter:
    """One answer's text, pushed as it streams: each push returns its (reasoning, content)."""

    __slots__ = ("_close", "_open", "_pending", "_state", "reasoned")

    def __init__(self, starts_inside: bool = False, tags: tuple[str, str] = (OPEN, CLOSE)) -> None:
        self._state = _REASONING if starts_inside else _START
        self._pending = ""
        self._open, self._close = tags
        self.reasoned = starts_inside  # reasoning was opened, so there is some (maybe "")

    def push(self, text: str, *, final: bool = False) -> tuple[str, str]:
        self._pending += text
        reasoning, content = "", ""
        while True:
            pending = self._pending
            if self._state == _START:
                lead, opening = pending.lstrip(), self._open
                if lead.startswith(opening):
                    self._pending, self._state = lead[len(opening) :], _REASONING
                    self.reasoned = True
                elif opening.startswith(lead) and not final:
                    return reasoning, content  # may still become <think>
                else:
                    self._state = _CONTENT
            elif self._state == _REASONING:
                at = pending.find(self._close)
                if at >= 0:
                    reasoning += pending[:at]
                    self._pending, self._state = pending[at + len(self._close) :], _AFTER
                    continue
                keep = 0 if final else _partial_tail(pending, self._close)
                reasoning += pending[: len(pending) - keep]
                self._pending = pending[len(pending) - keep :]
                return reasoning, content
            elif self._state == _AFTER:
                lead = pending.lstrip()
                if not lead and not final:
                    self._pending = ""
                    return reasoning, content
                self._pending, self._state = lead, _CONTENT
            else:
                self._pending = ""
                return reasoning, content + pending


def _partial_tail(text: str, tag: str) -> int:
    """The length of the longest end of text that begins tag (held back: it may be the tag)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0

"""Building OpenAI response pieces from engine deltas: choices, usage and logprobs."""

from __future__ import annotations

from nanoserve.api.schemas import (
    ChoiceLogprobs,
    CompletionLogprobs,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from nanoserve.runtime.sequence import Delta
from nanoserve.runtime.tokenizer import Tokenizer


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def usage(prompt: int, completion: int, cached: int) -> Usage:
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


class Choice:
    """One (prompt, sample) as it accumulates."""

    __slots__ = ("finish_reason", "logprobs", "text", "token_ids", "top")

    def __init__(self) -> None:
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top: list[tuple[tuple[int, float], ...]] = []
        self.finish_reason: str | None = None

    def add(self, delta: Delta) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.logprobs.extend(delta.logprobs)
            self.top.extend(delta.top_logprobs or ())
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason


def completion_logprobs(
    tokenizer: Tokenizer, token_ids: list[int], logprobs: list[float], top: list, offset: int
) -> CompletionLogprobs:
    tokens = [token_text(tokenizer, t) for t in token_ids]
    offsets, at = [], offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=logprobs,
        top_logprobs=[{token_text(tokenizer, t): lp for t, lp in entry} for entry in top],
        text_offset=offsets,
    )


def chat_logprobs(
    tokenizer: Tokenizer, token_ids: list[int], logprobs: list[float], top: list
) -> ChoiceLogprobs:
    content = []
    for token_id, lp, entry in zip(token_ids, logprobs, top, strict=False):
        text = token_text(tokenizer, token_id)
        content.append(
            TokenLogprob(
                token=text,
                logprob=lp,
                bytes=list(text.encode()),
                top_logprobs=[
                    TopLogprob(
                        token=(t := token_text(tokenizer, i)), logprob=v, bytes=list(t.encode())
                    )
                    for i, v in entry
                ],
            )
        )
    return ChoiceLogprobs(content=content)

"""Building OpenAI responses from engine deltas: choices, usage, logprobs, and the whole
non-streamed answer of each route (the streamed one is sse.py's, from the same pieces)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from msgspec import UNSET, UnsetType

from nanoserve.api.chat.engine_inputs import ChatInputs, CompletionInputs
from nanoserve.api.chat.harmony import split_harmony
from nanoserve.api.chat.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from nanoserve.api.chat.tool_calls import parse_tool_calls, whole_calls
from nanoserve.api.server.engine_client import EngineClient, TokenCodec
from nanoserve.runtime import Delta

Tagged = tuple[int, Delta]  # (prompt index, delta), as MergedStream yields them


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer's identity, repeated by its every chunk, and where its token texts come from."""

    id: str
    created: int
    model: str
    tokenizer: TokenCodec

    @classmethod
    def new(cls, kind: str, engine: EngineClient) -> Answer:
        """kind: "cmpl" or "chatcmpl", OpenAI's id prefixes."""
        return cls(f"{kind}-{uuid.uuid4().hex}", int(time.time()), engine.name, engine.tokenizer)

    def completion(
        self, choices: list[CompletionChoice], usage: Usage | None = None
    ) -> CompletionResponse:
        """A whole completion, or one chunk of a streamed one (the same object on the wire)."""
        return CompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def chat_chunk(
        self, choices: list[ChatChunkChoice], usage: Usage | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


def token_text(tokenizer: TokenCodec, token_id: int) -> str:
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
    tokenizer: TokenCodec, token_ids: list[int], logprobs: list[float], top: list, offset: int
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
    tokenizer: TokenCodec, token_ids: list[int], logprobs: list[float], top: list
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


def echo_prefixes(inputs: CompletionInputs, tokenizer: TokenCodec) -> list[str]:
    """Per prompt, what `echo` puts before its answers: the prompt as sent (a prompt of token
    ids decoded), or "" without echo."""
    if not inputs.echo:
        return ["" for _ in inputs.prompts]
    return [p.text if p.text is not None else tokenizer.decode(p.token_ids) for p in inputs.prompts]


def collect(deltas: Sequence[Tagged], num_prompts: int, n: int) -> tuple[list[list[Choice]], int]:
    """Every delta added to its (prompt, sample) choice; and the most prompt tokens any sample
    found in the prefix cache."""
    choices = [[Choice() for _ in range(n)] for _ in range(num_prompts)]
    cached = 0
    for prompt_index, delta in deltas:
        choices[prompt_index][delta.index].add(delta)
        cached = max(cached, delta.cached_tokens)
    return choices, cached


def best(row: list[Choice], n: int) -> list[Choice]:
    """best_of's pick: the n samples of highest mean token logprob (OpenAI's "highest log
    probability per token"), ties to the earlier sample; a sample with no tokens ranks last."""
    if len(row) == n:
        return row

    def score(choice: Choice) -> float:
        lps = choice.logprobs
        return sum(lps) / len(lps) if lps else float("-inf")

    ranked = sorted(range(len(row)), key=lambda i: (-score(row[i]), i))
    return [row[i] for i in ranked[:n]]


def completion_response(
    answer: Answer, inputs: CompletionInputs, deltas: Sequence[Tagged]
) -> CompletionResponse:
    n = inputs.n
    echo = echo_prefixes(inputs, answer.tokenizer)
    grid, cached = collect(deltas, len(inputs.prompts), inputs.best_of)
    out = []
    for p, row in enumerate(grid):
        for i, choice in enumerate(best(row, n)):
            logprobs = None
            if inputs.show_logprobs:
                logprobs = completion_logprobs(
                    answer.tokenizer, choice.token_ids, choice.logprobs, choice.top, len(echo[p])
                )
            out.append(
                CompletionChoice(
                    index=p * n + i,
                    text=echo[p] + choice.text,
                    logprobs=logprobs,
                    finish_reason=choice.finish_reason,
                )
            )
    # Every sample run is counted, as OpenAI bills best_of: the tokens were generated.
    completion = sum(len(c.token_ids) for row in grid for c in row)
    return answer.completion(out, usage(inputs.prompt_tokens, completion, cached))


def assistant_message(choice: Choice, inputs: ChatInputs) -> tuple[AssistantMessage, str | None]:
    """The message of one choice and its finish reason: its reasoning split off where the
    template thinks, its calls parsed out of the rest where tools are in play ("tool_calls"
    when the model called and stopped, as OpenAI says it)."""
    if inputs.reasoning.harmony:  # gpt-oss: the channels say which is which
        return harmony_message(choice, inputs)
    reasoning, text = inputs.reasoning.split(choice.text)
    thought: str | UnsetType = UNSET if reasoning is None else reasoning
    if not inputs.tools.parses:
        message = AssistantMessage(content=text, reasoning_content=thought, reasoning=thought)
        return message, choice.finish_reason
    content, calls = parse_tool_calls(text, inputs.tools)
    if not calls:
        message = AssistantMessage(content=text, reasoning_content=thought, reasoning=thought)
        return message, choice.finish_reason
    finish = "tool_calls" if choice.finish_reason == "stop" else choice.finish_reason
    message = AssistantMessage(
        content=content, tool_calls=calls, reasoning_content=thought, reasoning=thought
    )
    return message, finish


def harmony_message(choice: Choice, inputs: ChatInputs) -> tuple[AssistantMessage, str | None]:
    """A harmony answer's message: `analysis` as reasoning, `final` as content, calls whole."""
    split = split_harmony(choice.text, inputs.tools)
    calls = whole_calls(split.calls)
    finish = choice.finish_reason
    if calls and finish == "stop":
        finish = "tool_calls"
    reasoning: str | UnsetType = split.reasoning if split.reasoning else UNSET
    message = AssistantMessage(
        content=split.content if split.content or not calls else None,
        tool_calls=calls if calls else UNSET,
        reasoning_content=reasoning,
        reasoning=reasoning,
    )
    return message, finish


def chat_response(
    answer: Answer, inputs: ChatInputs, deltas: Sequence[Tagged]
) -> ChatCompletionResponse:
    [choices], cached = collect(deltas, 1, inputs.params.n)
    with_logprobs = inputs.params.logprobs is not None
    return ChatCompletionResponse(
        id=answer.id,
        created=answer.created,
        model=answer.model,
        choices=[
            ChatChoice(
                index=i,
                message=message,
                logprobs=chat_logprobs(answer.tokenizer, c.token_ids, c.logprobs, c.top)
                if with_logprobs
                else None,
                finish_reason=finish,
            )
            for i, c in enumerate(choices)
            for message, finish in [assistant_message(c, inputs)]
        ],
        usage=usage(len(inputs.prompt_ids), sum(len(c.token_ids) for c in choices), cached),
    )

"""From OpenAI request fields to the engine's inputs: prompts as token ids, SamplingParams.

Every refusal a request's fields earn is raised here, worded for the client (a 400 naming the
field), in the order the fields are read; the engine's own checks come at `submit`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from nanoserve.api.chat.gemma4_format import speaks_gemma4
from nanoserve.api.chat.prompt import ChatPrompt, render_chat_prompt
from nanoserve.api.chat.reasoning import OFF, ReasoningPlan
from nanoserve.api.chat.schemas import ChatRequest, CompletionRequest, _SamplingFields
from nanoserve.api.chat.structured_outputs import requested_grammar
from nanoserve.api.chat.tool_calls import ToolPlan, plan_tools
from nanoserve.api.server.engine_client import EngineClient
from nanoserve.api.server.errors import APIError
from nanoserve.runtime import (
    MAX_N,
    MAX_TOP_LOGPROBS,
    SEED_END,
    SEED_MIN,
    GrammarSpec,
    SamplingParams,
)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default


@dataclass(frozen=True, slots=True)
class Prompt:
    """One completion prompt: its token ids, and its text when it was sent as text (echo
    repeats that text as sent, not a decoding of its ids)."""

    text: str | None
    token_ids: list[int]


@dataclass(frozen=True, slots=True)
class CompletionInputs:
    """Each prompt runs params.n samples (best_of); the `n` best of them are its choices:
    choice index = prompt * n + rank."""

    prompts: list[Prompt]
    params: SamplingParams
    echo: bool
    include_usage: bool  # streamed: a last chunk with usage and no choices
    n: int
    show_logprobs: bool  # asked for; best_of > n asks the engine for them regardless

    @property
    def best_of(self) -> int:
        return self.params.n

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)


@dataclass(frozen=True, slots=True)
class ChatInputs:
    prompt: ChatPrompt  # the rendered conversation, and its tokens
    params: SamplingParams
    include_usage: bool
    tools: ToolPlan  # what to look for in the answer's text
    reasoning: ReasoningPlan = OFF  # whether its <think> part is split out

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompt.token_ids


def translate_completion(request: CompletionRequest, engine: EngineClient) -> CompletionInputs:
    check_model(request, engine)
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="logprobs")
    best_of = check_best_of(request)
    params = sampling_params(
        request,
        max_tokens=request.max_tokens,
        # Ranking needs each sample's token logprobs; logprobs 0 is the chosen tokens' alone.
        logprobs=request.logprobs if request.logprobs is not None or best_of == request.n else 0,
        default_max=COMPLETION_DEFAULT_MAX_TOKENS,
        grammar=requested_grammar(request.response_format, request.structured_outputs),
    )
    return CompletionInputs(
        prompts=completion_prompts(request, engine),
        params=dataclasses.replace(params, n=best_of) if best_of != request.n else params,
        echo=request.echo,
        include_usage=_include_usage(request),
        n=request.n,
        show_logprobs=request.logprobs is not None,
    )


def check_best_of(request: CompletionRequest) -> int:
    """best_of (default n): samples run per prompt, of which the n best are returned. OpenAI's
    rules: at least n, and not streamed unless equal to n (the best are known only at the end)."""
    n, best_of = request.n, request.best_of
    if best_of is None or isinstance(n, bool) or not 1 <= n <= MAX_N:
        return n  # n's own check (SamplingParams) words a bad n
    if not n <= best_of <= MAX_N:
        raise APIError(
            400, f"best_of must be an integer in [n, {MAX_N}] (n is {n})", param="best_of"
        )
    if request.stream and best_of > n:
        raise APIError(400, "best_of > n cannot be streamed", param="best_of")
    return best_of


def translate_chat(request: ChatRequest, engine: EngineClient) -> ChatInputs:
    check_model(request, engine)
    top = request.top_logprobs
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise APIError(
            400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs"
        )
    if top and not request.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    # max_completion_tokens is the newer name of max_tokens; both are accepted, it wins.
    max_tokens = (
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens
    )
    tools = plan_tools(request.tools, request.tool_choice, request.parallel_tool_calls)
    grammar = requested_grammar(request.response_format, request.structured_outputs)
    tool_grammar = tools.grammar()
    if grammar is not None and tool_grammar is not None:
        raise APIError(
            400,
            f"tool_choice {tools.choice!r} constrains the answer to calls; it cannot also follow"
            " response_format or structured_outputs",
            param="tool_choice",
        )
    prompt = render_chat_prompt(request, engine, tools)
    prompt_ids = prompt.token_ids
    params = sampling_params(
        request,
        max_tokens=max_tokens,
        logprobs=(top or 0) if request.logprobs else None,
        # Unset: as long as the context and the pool allow, not a fixed 16 (a chat answer).
        default_max=engine.default_max_tokens(len(prompt_ids)),
        grammar=grammar or tool_grammar,
    )
    reasoning = ReasoningPlan.of(
        engine.template_thinks, prompt.text, constrained=params.grammar is not None
    )
    if tools.choice == "auto" and speaks_gemma4(prompt.text):  # its own call format
        tools = dataclasses.replace(tools, wire="gemma4")
    if reasoning.keeps_marks or tools.wire != "hermes":  # marks that are special tokens
        params = dataclasses.replace(params, skip_special_tokens=False)
    return ChatInputs(
        prompt=prompt,
        params=params,
        include_usage=_include_usage(request),
        tools=tools,
        reasoning=reasoning,
    )


def _include_usage(request: _SamplingFields) -> bool:
    return bool(request.stream_options and request.stream_options.include_usage)


class _NamesAModel(Protocol):
    model: str | None


def check_model(request: _NamesAModel, engine: EngineClient) -> None:
    if request.model is not None and request.model != engine.name:
        raise APIError(
            400,
            f"the model {request.model!r} is not served here; this server serves {engine.name!r}",
            param="model",
            code="model_not_found",
        )


def sampling_params(
    request: _SamplingFields,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    default_max: int,
    grammar: GrammarSpec | None = None,
) -> SamplingParams:
    if request.seed is not None and not SEED_MIN <= request.seed < SEED_END:
        # OpenAI's seed is an int64; torch's generators refuse more than 64 bits (a 500, late).
        raise APIError(400, "seed must be a 64-bit signed integer", param="seed")
    stop = request.stop
    bias = {}
    for token, value in (request.logit_bias or {}).items():
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise APIError(
                400, f"logit_bias key {token!r} is not a token id", param="logit_bias"
            ) from None
    fields: dict[str, Any] = {
        "max_tokens": default_max if max_tokens is None else max_tokens,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "top_k": request.top_k or 0,  # -1 and 0 both mean off
        "min_p": request.min_p or 0.0,
        "seed": request.seed,
        "stop": (stop,) if isinstance(stop, str) else tuple(stop or ()),
        "stop_token_ids": tuple(request.stop_token_ids or ()),
        "ignore_eos": request.ignore_eos,
        "presence_penalty": request.presence_penalty or 0.0,
        "frequency_penalty": request.frequency_penalty or 0.0,
        "repetition_penalty": 1.0
        if request.repetition_penalty is None
        else request.repetition_penalty,
        "logit_bias": bias,
        "logprobs": logprobs,
        "n": request.n,
        "grammar": grammar,
    }
    return SamplingParams(**fields)


def completion_prompts(request: CompletionRequest, engine: EngineClient) -> list[Prompt]:
    """The prompts of a str, [str], [int] or [[int]] `prompt`."""
    prompt = request.prompt
    tokenizer = engine.tokenizer
    if isinstance(prompt, str):
        return [Prompt(prompt, tokenizer.encode(prompt, add_special_tokens=True))]
    if not prompt:
        raise APIError(400, "prompt is empty", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return [Prompt(p, tokenizer.encode(p, add_special_tokens=True)) for p in prompt]
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [Prompt(None, list(prompt))]
    if all(
        isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
        for p in prompt
    ):
        return [Prompt(None, list(p)) for p in prompt]
    raise APIError(
        400,
        "prompt must be a string, a list of strings, token ids, or lists of token ids",
        param="prompt",
    )

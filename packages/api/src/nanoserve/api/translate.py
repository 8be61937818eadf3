"""From OpenAI request fields to the engine's inputs: prompts as token ids, SamplingParams."""

from __future__ import annotations

from typing import Any

from nanoserve.api.errors import APIError
from nanoserve.api.schemas import ChatRequest, CompletionRequest, _SamplingFields
from nanoserve.runtime.engine import Engine
from nanoserve.runtime.sampling_params import SEED_END, SEED_MIN, SamplingParams


def check_model(request: _SamplingFields, engine: Engine) -> None:
    if request.model is not None and request.model != engine.name:
        raise APIError(
            400,
            f"the model {request.model!r} is not served here; this server serves {engine.name!r}",
            param="model",
            code="model_not_found",
        )


def sampling_params(
    request: _SamplingFields, *, max_tokens: int | None, logprobs: int | None, default_max: int
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
        "top_k": request.top_k or 0,
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
    }
    return SamplingParams(**fields)


def completion_prompts(
    request: CompletionRequest, engine: Engine
) -> list[tuple[str | None, list[int]]]:
    """[(text or None, token ids)] for str, [str], [int] and [[int]] prompts."""
    prompt = request.prompt
    tokenizer = engine.tokenizer
    if isinstance(prompt, str):
        return [(prompt, tokenizer.encode(prompt, add_special_tokens=True))]
    if not prompt:
        raise APIError(400, "prompt is empty", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return [(p, tokenizer.encode(p, add_special_tokens=True)) for p in prompt]
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [(None, list(prompt))]
    if all(
        isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
        for p in prompt
    ):
        return [(None, list(p)) for p in prompt]
    raise APIError(
        400,
        "prompt must be a string, a list of strings, token ids, or lists of token ids",
        param="prompt",
    )


def chat_prompt(request: ChatRequest, engine: Engine) -> list[int]:
    if not request.messages:
        raise APIError(400, "messages is empty", param="messages")
    messages = []
    for i, message in enumerate(request.messages):
        if message.role not in ("system", "user", "assistant", "developer"):
            raise APIError(
                400, f"messages[{i}].role {message.role!r} is not supported", param="messages"
            )
        content = message.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise APIError(
                        400,
                        f"messages[{i}]: only text content parts are supported",
                        param="messages",
                    )
                texts.append(part.text)
            content = "".join(texts)
        role = "system" if message.role == "developer" else message.role
        messages.append({"role": role, "content": content or ""})
    text = engine.render_chat(messages)
    return engine.tokenizer.encode(text, add_special_tokens=False)

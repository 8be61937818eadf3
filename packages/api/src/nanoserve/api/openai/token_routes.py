"""/tokenize, /detokenize and the render routes, in vLLM's shapes: prompts in, token ids out,
no generation.

`/v1/completions/render` and `/v1/chat/completions/render` take the generating route's request
and answer what that route would submit (vLLM's `GenerateRequest`: `request_id`, `token_ids`,
`sampling_params`, ...; one per prompt for completions). They run the same translation
(chat/engine_inputs.py), so their ids are exactly the ids the generating route prefills: a router
(llm-d's `token-producer`) that hashes these ids hashes what the server caches. `prompt`, the
rendered text, is nanoserve's addition; vLLM sends none.
"""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from msgspec import Struct

from nanoserve.api.chat.engine_inputs import check_model, translate_chat, translate_completion
from nanoserve.api.chat.prompt import render_chat_prompt
from nanoserve.api.chat.schemas import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    StreamOptions,
    Tool,
)
from nanoserve.api.chat.tool_calls import plan_tools
from nanoserve.api.server.admission import admit
from nanoserve.api.server.engine_client import EngineClient
from nanoserve.api.server.errors import APIError
from nanoserve.api.server.state import ServerState
from nanoserve.runtime import SamplingParams


class TokenizeRequest(Struct, kw_only=True):
    """vLLM's TokenizeCompletionRequest (`prompt`) or TokenizeChatRequest (`messages`)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False


class TokenizeResponse(Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(Struct, kw_only=True):
    prompt: str


class GenerateRequest(Struct, kw_only=True):
    """What a render answers: the request the generating route would run, tokenized."""

    request_id: str
    token_ids: list[int]
    prompt: str | None  # the rendered text (not vLLM's); None for a prompt sent as ids
    sampling_params: dict[str, Any]
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    features: None = None  # multimodal features: nanoserve serves text only
    cache_salt: str | None = None
    priority: int = 0
    kv_transfer_params: None = None


class TokenController(Controller):
    before_request = staticmethod(admit)

    @post("/tokenize", status_code=200)
    async def tokenize(
        self, data: JSONBody[TokenizeRequest], server: NamedDependency[ServerState]
    ) -> TokenizeResponse:
        engine = server.require_engine()
        check_model(data, engine)
        ids = _tokenize(data, engine)
        strs = None
        if data.return_token_strs:
            strs = [engine.tokenizer.id_to_token(i) or "" for i in ids]
        return TokenizeResponse(
            count=len(ids), max_model_len=engine.max_model_len, tokens=ids, token_strs=strs
        )

    @post("/detokenize", status_code=200)
    async def detokenize(
        self, data: JSONBody[DetokenizeRequest], server: NamedDependency[ServerState]
    ) -> DetokenizeResponse:
        engine = server.require_engine()
        check_model(data, engine)
        vocab = engine.tokenizer.vocab_size
        bad = [t for t in data.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(
                400, f"token {bad[0]} is outside the vocabulary of {vocab}", param="tokens"
            )
        return DetokenizeResponse(prompt=engine.tokenizer.decode(data.tokens))

    @post("/v1/completions/render", status_code=200)
    async def render_completion(
        self, data: JSONBody[CompletionRequest], server: NamedDependency[ServerState]
    ) -> list[GenerateRequest]:
        engine = server.require_engine()
        inputs = translate_completion(data, engine)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        return [
            GenerateRequest(
                request_id=f"{request_id}-{i}",
                token_ids=p.token_ids,
                prompt=p.text,
                sampling_params=sampling_dict(inputs.params),
                model=engine.name,
                stream=data.stream,
                stream_options=data.stream_options,
            )
            for i, p in enumerate(inputs.prompts)
        ]

    @post("/v1/chat/completions/render", status_code=200)
    async def render_chat(
        self, data: JSONBody[ChatRequest], server: NamedDependency[ServerState]
    ) -> GenerateRequest:
        engine = server.require_engine()
        inputs = translate_chat(data, engine)
        return GenerateRequest(
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            token_ids=inputs.prompt_ids,
            prompt=inputs.prompt.text,
            sampling_params=sampling_dict(inputs.params),
            model=engine.name,
            stream=data.stream,
            stream_options=data.stream_options,
        )


def _tokenize(data: TokenizeRequest, engine: EngineClient) -> list[int]:
    if (data.prompt is None) == (data.messages is None):
        raise APIError(400, "send exactly one of prompt and messages", param="prompt")
    if data.prompt is not None:
        special = True if data.add_special_tokens is None else data.add_special_tokens
        return engine.tokenizer.encode(data.prompt, add_special_tokens=special)
    chat = ChatRequest(
        messages=data.messages or [],
        tools=data.tools,
        add_generation_prompt=data.add_generation_prompt,
        continue_final_message=data.continue_final_message,
        add_special_tokens=bool(data.add_special_tokens),
        chat_template_kwargs=data.chat_template_kwargs,
    )
    return render_chat_prompt(chat, engine, plan_tools(chat.tools, None, None)).token_ids


def sampling_dict(params: SamplingParams) -> dict[str, Any]:
    """SamplingParams under vLLM's names, as plain JSON (a grammar as its kind and text)."""
    grammar = params.grammar
    return {
        "n": params.n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "min_p": params.min_p,
        "seed": params.seed,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "logit_bias": {str(k): v for k, v in params.logit_bias.items()},
        "logprobs": params.logprobs,
        "structured_outputs": None if grammar is None else {grammar.kind: grammar.text},
    }

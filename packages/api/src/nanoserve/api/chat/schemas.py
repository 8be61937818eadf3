"""The OpenAI API's wire types as msgspec Structs: requests in, responses and chunks out."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

# -- requests -------------------------------------------------------------------------------


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class JsonSchemaFormat(Struct, kw_only=True):
    name: str | None = None
    schema: dict[str, Any] | bool | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(Struct, kw_only=True):
    """OpenAI's: {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}."""

    type: str
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(Struct, kw_only=True):
    """vLLM's extension: exactly one of these constrains the output."""

    json: dict[str, Any] | str | None = None  # a JSON schema, or its text
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # EBNF: GBNF (llama.cpp's) or Lark
    json_object: bool | None = None


class _SamplingFields(Struct, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # extensions, as vLLM accepts them
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    # str, [str], [int] or [[int]]; msgspec takes one array type in a union, so checked later
    prompt: str | list[Any]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None  # samples run per prompt; the n best are returned


class ContentPart(Struct, kw_only=True):
    type: str
    text: str | None = None


class FunctionCall(Struct, kw_only=True):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(Struct, kw_only=True):
    id: str
    type: str = "function"
    function: FunctionCall


class ChatMessage(Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers


class FunctionDefinition(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments
    strict: bool | None = None


class Tool(Struct, kw_only=True):
    type: str
    function: FunctionDefinition


class ChatRequest(_SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    # "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's extensions: how the conversation is rendered
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # the reply goes on from the last (assistant) message
    add_special_tokens: bool = False  # a BOS etc. on top of the template's own
    chat_template_kwargs: dict[str, Any] | None = None  # template variables: enable_thinking, ...


# -- responses ------------------------------------------------------------------------------


class PromptTokensDetails(Struct, kw_only=True):
    cached_tokens: int = 0


class Usage(Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(Struct, kw_only=True):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(Struct, kw_only=True):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct, kw_only=True):
    content: list[TokenLogprob]


class AssistantMessage(Struct, kw_only=True):
    role: str = "assistant"
    content: str | None = None
    # a thinking model's reasoning (reasoning.py), under both names the peers use
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET
    tool_calls: list[ToolCall] | UnsetType = UNSET  # present only when the model called


class FunctionCallDelta(Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, kw_only=True, omit_defaults=True):
    """A streamed call: its first chunk names it (id, type, name), later ones add arguments."""

    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionCallDelta | None = None


class ChatChoice(Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Struct, kw_only=True):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(Struct, kw_only=True):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "nanoserve"
    max_model_len: int
    task: str = "generate"  # what the model serves: generate, embed or rerank (--task)


class ModelList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def encode(value: object) -> bytes:
    return msgspec.json.encode(value)

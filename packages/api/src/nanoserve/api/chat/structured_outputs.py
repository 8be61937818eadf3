"""From `response_format` and vLLM's `structured_outputs` to the grammar a request decodes under.

OpenAI's `response_format` (chat, and completions as an extension): `text`, `json_object`, or
`json_schema` with `{"name", "schema", "strict"}`. vLLM's `structured_outputs` (both routes):
exactly one of `json`, `regex`, `choice`, `grammar` (GBNF or Lark), `json_object`. Each refusal
is a 400 naming the field: APIError here, GrammarError (a FieldError) from GrammarSpec for a
schema that is not JSON, and from the engine for one that does not compile.
"""

from __future__ import annotations

from nanoserve.api.chat.schemas import ResponseFormat, StructuredOutputs
from nanoserve.api.server.errors import APIError
from nanoserve.runtime import GrammarSpec

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


def requested_grammar(
    response_format: ResponseFormat | None, structured: StructuredOutputs | None
) -> GrammarSpec | None:
    """The grammar a request asks for, or None (free text)."""
    from_format = _from_response_format(response_format)
    from_structured = _from_structured_outputs(structured)
    if from_format is not None and from_structured is not None:
        raise APIError(
            400,
            "response_format and structured_outputs both constrain the output; send one",
            param="structured_outputs",
        )
    return from_format or from_structured


def _from_response_format(fmt: ResponseFormat | None) -> GrammarSpec | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return GrammarSpec.json_object()
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None or spec.schema is None:
            raise APIError(
                400,
                "response_format of type json_schema needs json_schema.schema",
                param="response_format",
            )
        return GrammarSpec.json_schema(spec.schema, source="response_format")
    raise APIError(
        400,
        f"response_format.type {fmt.type!r} is not one of {', '.join(RESPONSE_FORMAT_TYPES)}",
        param="response_format",
    )


def _from_structured_outputs(so: StructuredOutputs | None) -> GrammarSpec | None:
    if so is None:
        return None
    given = [
        name
        for name, value in (
            ("json", so.json),
            ("regex", so.regex),
            ("choice", so.choice),
            ("grammar", so.grammar),
            ("json_object", so.json_object or None),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise APIError(
            400,
            "structured_outputs takes exactly one of json, regex, choice, grammar, json_object"
            f" (got {', '.join(given) or 'none'})",
            param="structured_outputs",
        )
    source = "structured_outputs"
    if so.json is not None:
        return GrammarSpec.json_schema(so.json, source=source)
    if so.regex is not None:
        return GrammarSpec("regex", so.regex, source)
    if so.choice is not None:
        return GrammarSpec.choice(so.choice, source=source)
    if so.grammar is not None:
        if not so.grammar.strip():
            raise APIError(400, "structured_outputs.grammar is empty", param=source)
        return GrammarSpec("grammar", so.grammar, source)
    return GrammarSpec.json_object(source=source)

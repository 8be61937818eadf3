"""GrammarSpec: what a request constrains its output to, in one canonical text per grammar.

A spec is plain data (it rides in SamplingParams); compiling it is `GrammarCompiler`'s job. Its
`key` is the cache key: a JSON schema is canonicalised (compact, no spaces), so two requests
that send the same schema with different spacing share one compiled grammar. Key order is kept:
it is the order the properties are generated in (a Pydantic model's field order).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from nanoserve.core.errors import FieldError
from nanoserve.runtime.structured.number_bounds import bounded_schema

GrammarKind = Literal["json_schema", "json_object", "regex", "choice", "grammar", "lark"]
KINDS: tuple[GrammarKind, ...] = (
    "json_schema",
    "json_object",
    "regex",
    "choice",
    "grammar",
    "lark",
)

# JSON is emitted with one space after ':' and ',', no other whitespace: a small model that may
# put any whitespace anywhere can loop on newlines until max_tokens; fixed separators end that.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "key_separator": ": ",
    "item_separator": ", ",
}
ANY_JSON_OBJECT = '{"type":"object"}'


class GrammarError(FieldError):
    """A grammar that cannot be compiled; `field` names the request field it came from."""


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    kind: GrammarKind
    text: str  # canonical: compact JSON for schemas and choices, as sent otherwise
    source: str = field(default="response_format", compare=False)  # the request field

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(self.source, f"unknown grammar kind {self.kind!r}")

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.text)

    @classmethod
    def json_schema(cls, schema: Any, *, source: str = "response_format") -> GrammarSpec:
        """schema: a dict, or its JSON text; compiled with its open numbers bounded
        (number_bounds.py), so that no integer runs on until max_tokens."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise GrammarError(source, f"the schema is not valid JSON: {error}") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(source, "a JSON schema must be an object")
        return cls("json_schema", canonical_json(bounded_schema(schema)), source)

    @classmethod
    def json_object(cls, *, source: str = "response_format") -> GrammarSpec:
        return cls("json_object", ANY_JSON_OBJECT, source)

    @classmethod
    def choice(cls, options: Any, *, source: str) -> GrammarSpec:
        if (
            not isinstance(options, list)
            or not options
            or not all(isinstance(o, str) and o for o in options)
        ):
            raise GrammarError(source, "choice must be a non-empty list of non-empty strings")
        return cls("choice", json.dumps(options, ensure_ascii=False), source)


def canonical_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

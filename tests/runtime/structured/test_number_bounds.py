"""bounded_schema: open integers and numbers closed at ±(2⁵³−1), fractions at 10 digits; what
llguidance then accepts, on the tiny tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.runtime.structured.grammar_compiler import GrammarCompiler
from nanoserve.runtime.structured.grammar_spec import GrammarSpec
from nanoserve.runtime.structured.number_bounds import SAFE_INTEGER, bounded_schema

BOUNDS = {"minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}


def test_an_open_integer_and_number_are_bounded() -> None:
    assert bounded_schema({"type": "integer"}) == {"type": "integer", **BOUNDS}
    assert bounded_schema({"type": "number"}) == {
        "type": "number",
        **BOUNDS,
        "multipleOf": 1e-10,
    }
    assert bounded_schema({"type": ["integer", "null"]}) == {
        "type": ["integer", "null"],
        **BOUNDS,
    }


def test_stated_bounds_are_kept_and_only_the_open_side_closed() -> None:
    assert bounded_schema({"type": "integer", "minimum": 0}) == {
        "type": "integer",
        "minimum": 0,
        "maximum": SAFE_INTEGER,
    }
    assert bounded_schema({"type": "integer", "exclusiveMaximum": 10**18}) == {
        "type": "integer",
        "exclusiveMaximum": 10**18,
        "minimum": -SAFE_INTEGER,
    }
    assert bounded_schema({"type": "number", "multipleOf": 0.5, "maximum": 1})["multipleOf"] == 0.5


def test_named_values_negations_and_conditions_are_left_alone() -> None:
    """A bound added there would change what the schema means: an enum past 2**53 would be
    unsatisfiable, a bounded `not` would admit the integers past the bound."""
    for schema in (
        {"type": "integer", "enum": [10**17, 1]},
        {"type": "integer", "const": 10**17},
        {"not": {"type": "integer"}},
        {"if": {"type": "integer"}, "then": {"type": "integer"}},
    ):
        out = bounded_schema(schema)
        assert out.get("not", out.get("if")) == schema.get("not", schema.get("if"))
        if "enum" in schema or "const" in schema:
            assert out == schema
    assert (
        bounded_schema({"if": {}, "then": {"type": "integer"}})["then"]["maximum"] == SAFE_INTEGER
    )
    # draft 4: a boolean exclusiveMinimum qualifies `minimum`; it is not a bound of its own
    assert bounded_schema({"type": "integer", "exclusiveMinimum": True})["minimum"] == -SAFE_INTEGER


def test_nested_schemas_are_bounded_and_the_input_is_not_changed() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "xs": {"type": "array", "items": {"type": "number"}},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
            "either": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/D"}]},
        },
        "additionalProperties": {"type": "integer"},
        "$defs": {"D": {"type": "object", "properties": {"k": {"type": "integer"}}}},
    }
    original = repr(schema)
    out = bounded_schema(schema)
    assert repr(schema) == original
    props = out["properties"]
    assert props["n"]["maximum"] == SAFE_INTEGER
    assert props["xs"]["items"]["multipleOf"] == 1e-10
    assert props["pair"]["prefixItems"][0]["minimum"] == -SAFE_INTEGER
    assert props["pair"]["prefixItems"][1] == {"type": "string"}
    assert props["either"]["anyOf"][0]["maximum"] == SAFE_INTEGER
    assert out["additionalProperties"]["maximum"] == SAFE_INTEGER
    assert out["$defs"]["D"]["properties"]["k"]["minimum"] == -SAFE_INTEGER
    assert bounded_schema({}) == {} and bounded_schema(True) is True


SCHEMAS = st.recursive(
    st.sampled_from(
        [
            {"type": "integer"},
            {"type": "number"},
            {"type": "string"},
            {},
            {"type": "integer", "minimum": 3},
        ]
    ),
    lambda inner: st.one_of(
        st.builds(
            lambda p: {"type": "object", "properties": p},
            st.dictionaries(st.text(max_size=3), inner, max_size=3),
        ),
        st.builds(lambda i: {"type": "array", "items": i}, inner),
        st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=8,
)


@given(SCHEMAS)
def test_bounding_is_idempotent_and_keeps_every_stated_minimum(schema: Any) -> None:
    once = bounded_schema(schema)
    assert bounded_schema(once) == once
    if schema.get("minimum") is not None:
        assert once["minimum"] == schema["minimum"]


@pytest.fixture
def compiler(tiny_llama_checkpoint) -> GrammarCompiler:
    return GrammarCompiler(tiny_llama_checkpoint.tokenizer, vocab_size=320, eos_token_ids=[2])


def accepts(compiler: GrammarCompiler, schema: Any, text: str) -> bool:
    matcher = compiler.matcher(GrammarSpec.json_schema(schema))
    ids = compiler._tokenizer.encode(text, add_special_tokens=False)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


@pytest.mark.parametrize(
    ("schema", "text", "ok"),
    [
        ({"type": "integer"}, "9007199254740991", True),
        ({"type": "integer"}, "-9007199254740991", True),
        ({"type": "integer"}, "9007199254740992", False),
        ({"type": "integer"}, "1111111111111111111111", False),
        ({"type": "number"}, "3.25", True),
        ({"type": "number"}, "-0.0000000001", True),
        ({"type": "number"}, "1.12345678901", False),  # 11 fraction digits
        ({"type": "number"}, "1e5", False),
        ({"type": "number"}, "12345678901234567890", False),
        ({"type": "integer", "maximum": 10**18}, "999999999999999999", True),  # as stated
    ],
)
def test_what_a_bounded_schema_accepts(
    compiler: GrammarCompiler, schema: Any, text: str, ok: bool
) -> None:
    assert accepts(compiler, schema, text) is ok

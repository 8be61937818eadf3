"""Random JSON schemas on the embedded model: every output validates, greedy and at temperature 1.

Hypothesis draws 60 schemas (objects and arrays, enums, nesting, required and optional fields,
bounded integers and numbers, string patterns and lengths); all 120 requests run in one engine,
batched, so the test costs one model load and a few hundred batched steps.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.structured.grammar_spec import GrammarSpec

pytestmark = pytest.mark.slow

NUM_SCHEMAS = 60
NAMES = st.sampled_from(["id", "name", "city", "score", "tags", "ok", "kind", "size", "note"])

leaves = st.one_of(
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 1000),
    ),
    st.builds(
        lambda lo, span: {"type": "number", "minimum": lo, "maximum": lo + span},
        st.integers(-10, 10),
        st.integers(1, 100),
    ),
    st.just({"type": "boolean"}),
    st.builds(
        lambda words: {"enum": words},
        st.lists(st.sampled_from(["red", "green", "blue", "cat", "dog"]), min_size=1, unique=True),
    ),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(1, 12)),
    st.sampled_from(
        [
            {"type": "string", "pattern": "^[a-z]{1,8}$"},
            {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"},
            {"type": "string", "pattern": "^(yes|no)$"},
        ]
    ),
)


def objects(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def build(fields: dict[str, dict[str, Any]], data: Any) -> dict[str, Any]:
        required = data.draw(st.lists(st.sampled_from(sorted(fields)), unique=True))
        return {
            "type": "object",
            "properties": fields,
            "required": required,
            "additionalProperties": False,
        }

    return st.builds(build, st.dictionaries(NAMES, children, min_size=1, max_size=4), st.data())


def arrays(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda items, lo, extra: {
            "type": "array",
            "items": items,
            "minItems": lo,
            "maxItems": lo + extra,
        },
        children,
        st.integers(0, 2),
        st.integers(0, 2),
    )


nested = st.recursive(leaves, lambda inner: st.one_of(objects(inner), arrays(inner)), max_leaves=6)
schemas = st.one_of(objects(nested), arrays(objects(leaves)))


@pytest.fixture(scope="module")
def llm():
    from nanoserve.runtime.engine.serving.llm import LLM

    return LLM(decode_mode="eager", max_batch=32, max_model_len=512)


@settings(
    max_examples=1,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(schemas, min_size=NUM_SCHEMAS, max_size=NUM_SCHEMAS))
def test_every_output_validates(llm, drawn: list[dict[str, Any]]) -> None:
    engine = llm.engine
    tokenizer = engine.tokenizer
    modes: dict[str, dict[str, Any]] = {
        "greedy": {"temperature": 0.0},
        "t1": {"temperature": 1.0, "seed": 0},
    }
    for i, schema in enumerate(drawn):
        prompt = tokenizer.encode(
            f"Write a JSON value for this schema: {json.dumps(schema)}\n", add_special_tokens=False
        )
        for mode, knobs in modes.items():
            params = SamplingParams(
                max_tokens=300, grammar=GrammarSpec.json_schema(schema), **knobs
            )
            engine.add_request(f"{mode}-{i}", prompt, params)
    texts: dict[str, str] = {}
    finish: dict[str, str | None] = {}
    for delta in engine.run_until_done():
        texts[delta.request_id] = texts.get(delta.request_id, "") + delta.text
        finish[delta.request_id] = delta.finish_reason
    assert engine.blocks.num_in_use == 0
    assert len(texts) == 2 * NUM_SCHEMAS
    for request_id, text in texts.items():
        schema = drawn[int(request_id.split("-")[1])]
        assert finish[request_id] == "stop", (request_id, schema, text)
        jsonschema.validate(json.loads(text), schema)

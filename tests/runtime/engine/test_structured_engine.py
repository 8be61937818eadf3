"""Constrained decoding through the engine, on the tiny Llama (random weights, batch-invariant).

A random model writes whatever its grammar lets it, so every output here is checked against its
grammar (jsonschema for schemas), and unconstrained neighbours against a run without the
constrained rows, bit for bit.
"""

from __future__ import annotations

import json
import math

import jsonschema  # type: ignore[import-untyped, unused-ignore]
import pytest
import torch

from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.structured.grammar_spec import GrammarError, GrammarSpec

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"enum": ["red", "green"]},
        "word": {"type": "string", "maxLength": 4},
    },
    "required": ["ok", "n", "tag", "word"],
    "additionalProperties": False,
}
PROMPTS = [(5, 6, 7, 8), (9, 10, 11), (12, 13, 14, 15, 16), (17, 18)]


def run(engine: Engine, requests: dict[str, tuple[tuple[int, ...], SamplingParams]]):
    """Every request at once; per id (and sample index), its text, tokens, logprobs, finish."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    out: dict[tuple[str, int], dict] = {}
    for delta in engine.run_until_done():
        entry = out.setdefault(
            (delta.request_id, delta.index), {"text": "", "ids": [], "lp": [], "finish": None}
        )
        entry["text"] += delta.text
        entry["ids"] += delta.token_ids
        entry["lp"] += delta.logprobs or ()
        entry["finish"] = delta.finish_reason or entry["finish"]
    assert engine.blocks.num_in_use == 0
    return out


def schema_params(**kw: object) -> SamplingParams:
    fields = {"max_tokens": 80, "temperature": 0.0, "grammar": GrammarSpec.json_schema(SCHEMA)}
    return SamplingParams(**{**fields, **kw})  # type: ignore[arg-type]


def test_greedy_and_sampled_outputs_follow_the_schema(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    requests = {f"g{i}": (p, schema_params()) for i, p in enumerate(PROMPTS)}
    requests |= {
        f"s{i}": (p, schema_params(temperature=1.0, seed=i)) for i, p in enumerate(PROMPTS)
    }
    for entry in run(engine, requests).values():
        assert entry["finish"] == "stop"
        jsonschema.validate(json.loads(entry["text"]), SCHEMA)


@pytest.mark.parametrize(
    "form", [{}, {"dtype": torch.bfloat16, "quantize": "q4"}], ids=["fp32-torch", "q4-kernels"]
)
def test_unconstrained_rows_are_bit_identical_beside_constrained_ones(
    make_tiny_engine, form: dict
) -> None:
    free = {
        f"f{i}": (p, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=3))
        for i, p in enumerate(PROMPTS)
    }
    free["seeded"] = (
        PROMPTS[0],
        SamplingParams(max_tokens=20, temperature=1.0, seed=7, logprobs=0),
    )
    alone = run(make_tiny_engine(**form), free)
    constrained = {
        f"c{i}": (p, schema_params(temperature=1.0, seed=i)) for i, p in enumerate(PROMPTS)
    }
    mixed = run(make_tiny_engine(**form), free | constrained)
    for key, entry in alone.items():
        assert mixed[key]["ids"] == entry["ids"]
        assert mixed[key]["lp"] == entry["lp"]  # bit for bit


def test_preempted_constrained_rows_resume_their_grammar(make_tiny_engine) -> None:
    requests = {f"r{i}": (p * 3, schema_params(max_tokens=64)) for i, p in enumerate(PROMPTS * 2)}
    roomy = run(make_tiny_engine(), requests)
    tight = make_tiny_engine(num_blocks=24)  # 96 slots for 8 requests of up to 79 tokens
    preempted = []
    schedule = tight.scheduler.schedule

    def counting_schedule():
        out = schedule()
        preempted.extend(out.preempted)
        return out

    tight.scheduler.schedule = counting_schedule
    squeezed = run(tight, requests)
    assert preempted
    assert squeezed == roomy
    for entry in squeezed.values():
        jsonschema.validate(json.loads(entry["text"]), SCHEMA)


def test_n_seeded_samples_each_follow_and_reproduce(make_tiny_engine) -> None:
    params = schema_params(temperature=1.0, seed=11, n=4)
    first = run(make_tiny_engine(), {"r": (PROMPTS[0], params)})
    again = run(make_tiny_engine(), {"r": (PROMPTS[0], params)})
    assert first == again and len(first) == 4
    for entry in first.values():
        jsonschema.validate(json.loads(entry["text"]), SCHEMA)
    assert len({e["text"] for e in first.values()}) > 1


def test_max_tokens_before_the_grammar_accepts_is_length(make_tiny_engine) -> None:
    out = run(make_tiny_engine(), {"r": (PROMPTS[0], schema_params(max_tokens=3))})
    entry = out[("r", 0)]
    assert entry["finish"] == "length" and len(entry["ids"]) == 3
    assert '{"ok": '.startswith(entry["text"])


def test_a_stop_string_cuts_a_constrained_output(make_tiny_engine) -> None:
    out = run(make_tiny_engine(), {"r": (PROMPTS[0], schema_params(stop=('"n"',)))})
    entry = out[("r", 0)]
    assert entry["finish"] == "stop"
    assert entry["text"].startswith('{"ok": ') and entry["text"].endswith(", ")


def test_choice_logprobs_are_of_the_constrained_distribution(make_tiny_engine) -> None:
    """Every reported alternative is one the grammar allows, and the allowed mass sums to 1."""
    engine = make_tiny_engine()
    options = ["hello", "world"]
    params = SamplingParams(
        max_tokens=10,
        temperature=0.0,
        logprobs=20,
        grammar=GrammarSpec.choice(options, source="structured_outputs"),
    )
    engine.add_request("r", PROMPTS[1], params)
    deltas = engine.run_until_done()
    text = "".join(d.text for d in deltas)
    assert text in options
    first = next(d for d in deltas if d.top_logprobs)
    top = first.top_logprobs[0]
    allowed_first = {t for t, _ in top}
    decode = engine.tokenizer.decode
    assert all(any(o.startswith(decode([t])) for o in options) for t in allowed_first)
    assert math.isclose(sum(math.exp(v) for _, v in top), 1.0, rel_tol=1e-4)


def test_a_grammar_that_does_not_compile_is_refused_at_the_door(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    bad = SamplingParams(grammar=GrammarSpec.json_schema({"type": "bogus"}))
    with pytest.raises(GrammarError) as caught:
        engine.add_request("r", PROMPTS[0], bad)
    assert caught.value.field == "response_format"
    assert not engine.has_unfinished and engine.blocks.num_in_use == 0

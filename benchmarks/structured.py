"""Constrained decoding's cost: a 10-field JSON schema vs free text, and grammar compile time.

    python -m benchmarks.structured [--repeats 5] [--streams 1 8]

On the embedded model as `nanoserve serve` builds it by default (dtype and quantize "auto": q4
on nanoserve's kernels where the CPU has them), in one process:

- decode: S chat requests at once (S = 1 and 8), greedy, constrained by SCHEMA; then the same
  prompts unconstrained, each asked for exactly the tokens its constrained run produced
  (ignore_eos), so both runs step the same batch shapes for the same number of steps. tok/s is
  generated tokens / wall seconds. Each round runs both, back to back; the ratio is the median
  of the rounds' constrained / unconstrained (a shared machine's noise moves both of a round
  together), tok/s the medians over --repeats rounds.
- compile: the schema compiled cold (a fresh compiler; llguidance's tokenizer side built
  beforehand and timed on its own), and cached (a cache hit handing out a fresh matcher, as
  admitting a request does), median of 1,000.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import cpu_line, pin_threads, table, write_csv
from nanoserve.runtime.engine.boot.build import build_engine
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.structured.grammar_compiler import GrammarCompiler
from nanoserve.runtime.structured.grammar_spec import GrammarSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
        "member": {"type": "boolean"},
        "plan": {"enum": ["free", "pro", "team"]},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        "visits": {"type": "integer", "minimum": 0, "maximum": 9999},
        "note": {"type": "string", "maxLength": 40},
    },
    "required": [
        "name",
        "age",
        "city",
        "email",
        "member",
        "plan",
        "score",
        "tags",
        "visits",
        "note",
    ],
    "additionalProperties": False,
}
TOPICS = ["a librarian", "a pilot", "a baker", "a chess player", "a nurse", "a farmer",
          "a student", "a painter"]  # fmt: skip
MAX_TOKENS = 160


def prompts(engine: Engine, streams: int) -> list[list[int]]:
    out = []
    for topic in (TOPICS * 4)[:streams]:
        messages = [{"role": "user", "content": f"Describe {topic} as a customer record."}]
        text = engine.render_chat(messages)
        out.append(engine.tokenizer.encode(text, add_special_tokens=False))
    return out


def run(engine: Engine, work: list[tuple[list[int], SamplingParams]]) -> tuple[float, list[int]]:
    for i, (ids, params) in enumerate(work):
        engine.add_request(str(i), ids, params)
    lengths = [0] * len(work)
    started = time.perf_counter()
    for delta in engine.run_until_done():
        lengths[int(delta.request_id)] += len(delta.token_ids)
    return time.perf_counter() - started, lengths


def decode_rows(engine: Engine, streams: int, repeats: int) -> dict[str, object]:
    spec = GrammarSpec.json_schema(SCHEMA)
    ids = prompts(engine, streams)
    constrained = [
        (p, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, grammar=spec)) for p in ids
    ]
    run(engine, constrained)  # warm: the grammar compiled, every shape seen
    c_rates, u_rates, ratios, lengths = [], [], [], []
    for _ in range(repeats):
        seconds, lengths = run(engine, constrained)
        c_rates.append(sum(lengths) / seconds)
        free = [
            (p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
            for p, n in zip(ids, lengths, strict=True)
        ]
        seconds, free_lengths = run(engine, free)
        assert free_lengths == lengths
        u_rates.append(sum(free_lengths) / seconds)
        ratios.append(c_rates[-1] / u_rates[-1])  # within a round: the machine's noise cancels
    c, u, ratio = statistics.median(c_rates), statistics.median(u_rates), statistics.median(ratios)
    return {
        "streams": streams,
        "tokens": sum(lengths),
        "constrained tok/s": c,
        "unconstrained tok/s": u,
        "ratio": ratio,
        "cost %": 100 * (1 - ratio),
        "ratio range": f"{min(ratios):.3f}-{max(ratios):.3f}",
    }


def compile_rows(engine: Engine) -> list[dict[str, object]]:
    spec = GrammarSpec.json_schema(SCHEMA)
    fresh = GrammarCompiler(
        engine.tokenizer,
        vocab_size=engine.model.config.vocab_size,
        eos_token_ids=sorted(engine.eos_token_ids),
    )
    started = time.perf_counter()
    fresh.ll_tokenizer  # noqa: B018 - built once per model
    tokenizer_ms = 1e3 * (time.perf_counter() - started)
    started = time.perf_counter()
    fresh.compile(spec)
    cold_ms = 1e3 * (time.perf_counter() - started)
    times = []
    for _ in range(1000):
        started = time.perf_counter()
        fresh.matcher(GrammarSpec.json_schema(SCHEMA))  # canonicalise, hit, copy
        times.append(time.perf_counter() - started)
    return [
        {"what": "tokenizer side (once per model)", "ms": tokenizer_ms},
        {"what": "10-field schema, cold", "ms": cold_ms},
        {"what": "10-field schema, cached (median of 1000)", "ms": 1e3 * statistics.median(times)},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    pin_threads()
    print(cpu_line())
    # What `nanoserve serve` builds by default: the weight form and dtype chosen by the CPU.
    config = EngineConfig(
        max_batch=8, max_model_len=1024, kv_budget_bytes=1 << 28, dtype="auto", quantize="auto"
    )
    engine = build_engine(config)
    print(
        f"engine: {engine.config.dtype}+{engine.config.quantize}, kernels={engine.runner.model.kernels}"
    )
    decode = [decode_rows(engine, s, args.repeats) for s in args.streams]
    print(table(decode, f"constrained vs unconstrained decode (median of {args.repeats})"))
    compiled = compile_rows(engine)
    print(table(compiled, "grammar compile"))
    print(
        "csv:", write_csv("structured.csv", decode), write_csv("structured_compile.csv", compiled)
    )


if __name__ == "__main__":
    main()

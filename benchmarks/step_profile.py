"""Where a decode step's time goes: operators against the host (Python, scheduling, planning).

    python -m benchmarks.step_profile [--rows 1,8,32] [--quantize gguf] [--steps 40]
                                      [--model qwen2.5-coder-0.5b]

For each batch size, a steady decode of that many 64-token-prompt requests on a model of the
set (benchmarks/models.py; default the embedded one), then:

- step_ms: the median wall time of `Engine.step()` (no profiler);
- ops_ms: per step, the summed self time of every operator torch.profiler saw (nanoserve's
  kernels, aten ops), i.e. the time spent computing or in a kernel's own dispatch;
- host_ms: step_ms - ops_ms, the time no operator runs: the scheduler, the plan, the
  sampler's Python, the forward's Python between ops (a lower bound: the profiler's own cost
  lands partly inside the operators' times);
- the top operators by time per step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import cpu_line, pin_threads, table, write_csv
from benchmarks.models import model_set
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel


def steady_engine(model: LlamaModel, checkpoint, rows: int) -> Engine:
    engine = Engine.from_config(
        model,
        checkpoint.tokenizer,
        EngineConfig(
            max_model_len=1024,
            kv_budget_bytes=1 << 28,
            max_batch=max(rows, 1),
            quantize=model.quantize,
        ),
    )
    vocab = model.config.vocab_size
    for i in range(rows):
        prompt = [(i * 131 + j * 7) % (vocab - 1200) + 17 for j in range(64)]
        engine.add_request(
            str(i), prompt, SamplingParams(max_tokens=900, temperature=0, ignore_eos=True)
        )
    while not engine.scheduler.running or any(
        s.num_computed < len(s.prompt_ids) for s in engine.scheduler.running
    ):
        engine.step()
    for _ in range(5):
        engine.step()  # decode only from here
    return engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--quantize", default="gguf")
    parser.add_argument("--model", default="smollm2-135m", help="a name of the model set")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    threads = pin_threads()
    print(cpu_line())
    (bench,) = model_set(only=args.model)
    checkpoint = load_checkpoint(bench.path)
    quantize = None if args.quantize == "none" else args.quantize
    model = LlamaModel.from_checkpoint(
        checkpoint, dtype=getattr(torch, args.dtype), quantize=quantize, max_positions=1024
    )
    rows_out, top_out = [], []
    for rows in (int(r) for r in args.rows.split(",")):
        engine = steady_engine(model, checkpoint, rows)
        times = []
        for _ in range(args.steps):
            started = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - started)
        step_ms = statistics.median(times) * 1e3
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                engine.step()
        by_op: Counter[str] = Counter()
        calls: Counter[str] = Counter()
        for event in prof.key_averages():
            by_op[event.key] += event.self_cpu_time_total / 1e3 / args.steps
            calls[event.key] += event.count // args.steps
        ops_ms = sum(by_op.values())
        rows_out.append(
            {
                "rows": rows,
                "kernels": model.kernels,
                "step_ms": step_ms,
                "tok_s": rows / step_ms * 1e3,
                "ops_ms": ops_ms,
                "host_ms": step_ms - ops_ms,
                "ops_per_step": sum(calls.values()),
            }
        )
        for name, ms in by_op.most_common(6):
            top_out.append({"rows": rows, "op": name, "ms_per_step": ms, "calls": calls[name]})
    title = (
        f"decode step, {bench.name}, {args.dtype}+{args.quantize}, {threads} threads,"
        f" median of {args.steps}"
    )
    print(table(rows_out, title))
    print()
    print(table(top_out, "top operators per step"))
    print("wrote", write_csv("step_profile.csv", rows_out))


if __name__ == "__main__":
    main()

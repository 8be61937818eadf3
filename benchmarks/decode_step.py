"""Per-step decode time of each mode (eager, bucketed, persistent, recorded) by batch shape.

    python -m benchmarks.decode_step [--dtype float32] [--steps 12]

On a CPU the recorded mode is a frozen call (no speed of its own); on a GPU it is a CUDA
graph. Each row: `rows` sequences whose contexts are near `context` tokens, median ms of
--steps decode steps, and the ratio to eager measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import pin_threads, table, write_csv
from nanoserve.runtime.checkpoint import load_checkpoint
from nanoserve.runtime.embedded import embedded_model_path
from nanoserve.runtime.engine import Engine
from nanoserve.runtime.engine_config import EngineConfig
from nanoserve.runtime.model import LlamaModel
from nanoserve.runtime.sampling_params import SamplingParams

MODES = {
    "eager": {},
    "bucketed": {"bucket_decode": True},
    "persistent": {"bucket_decode": True, "persist_inputs": True},
    "recorded": {"bucket_decode": True, "persist_inputs": True, "capture_decode": True},
}


def step_ms(model: LlamaModel, tokenizer, mode: dict, rows: int, context: int, steps: int) -> float:
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(
            max_batch=32,
            max_model_len=1024,
            max_num_batched_tokens=8192,
            kv_budget_bytes=1 << 29,
            width_multiple=64,
            **mode,
        ),
    )
    for i in range(rows):
        prompt = [(i * 131 + j * 7) % 40000 + 17 for j in range(context - 3 * (i % 3))]
        engine.add_request(
            f"s{i}", prompt, SamplingParams(max_tokens=steps + 4, temperature=0, ignore_eos=True)
        )
    engine.step()  # prefill
    engine.step()  # first decode step (records, in the recorded mode)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    threads = pin_threads()
    checkpoint = load_checkpoint(embedded_model_path())
    model = LlamaModel.from_tensors(
        checkpoint.config,
        checkpoint.tensors(),
        dtype=getattr(torch, args.dtype),
        device=args.device,
        max_positions=1024,
    )
    rows = []
    for batch in (1, 3, 8, 24):
        for context in (60, 250):
            eager = None
            for name, mode in MODES.items():
                ms = step_ms(
                    model,
                    checkpoint.tokenizer,
                    {**mode, "device": args.device},
                    batch,
                    context,
                    args.steps,
                )
                eager = eager or ms
                rows.append(
                    {
                        "rows": batch,
                        "context": context,
                        "mode": name,
                        "ms_per_step": ms,
                        "vs_eager": ms / eager,
                    }
                )
    print(
        table(
            rows,
            f"decode step, {args.dtype} on {args.device}, {threads} threads, median of {args.steps} steps",
        )
    )
    print("wrote", write_csv(f"decode_step_{args.device}.csv", rows))


if __name__ == "__main__":
    main()

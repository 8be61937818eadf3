"""Per-step decode time of each mode (eager, bucketed, persistent, recorded) by batch shape, and
the forward alone, eager against replay of its recording, at 1, 8 and 32 rows.

    python -m benchmarks.decode_step [--dtype float32] [--steps 12] [--skip-modes]

On a CPU the recorded mode is a frozen call (no speed of its own, so replay is ~1.0x eager); on
a GPU it is a CUDA graph. Mode table: `rows` sequences whose contexts are near `context` tokens,
median ms of --steps decode steps, and the ratio to eager measured in the same run. Forward
table: one warm batch (all rows padding, the real buffers and slot table) of (rows, width),
`model.forward` against `recordings.replay` of that shape's recording; CUDA events on a GPU, the
median of wall times on a CPU. scripts/gpu_check.py reuses `forward_ms` for its own table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import torch

from benchmarks.common import median_seconds, pin_threads, table, write_csv
from nanoserve.core import Shape
from nanoserve.runtime.decode.warmup import WarmupReport, warm_batch
from nanoserve.runtime.engine.config.engine_config import DecodeMode, EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.loading.embedded import embedded_model_path
from nanoserve.runtime.model.llama import LlamaModel

MODES = tuple(mode.value for mode in DecodeMode)  # eager, bucketed, persistent, recorded
# The time budget of an explicit warm list: ample, so that the list is recorded untrimmed.
EXPLICIT_WARM_SECONDS = 3600.0
FORWARD_ROWS = (1, 8, 32)
FORWARD_WIDTH = 256  # a bucket width of the engines below (a multiple of width_multiple 64)


def timed_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """ms per call. On CUDA: CUDA events around `repeats` back-to-back calls, so host launch
    gaps count (they are what a graph removes); elsewhere the median of wall times."""
    if device.type != "cuda":
        return median_seconds(fn, repeats, warmup=2) * 1000
    for _ in range(3):
        fn()
    torch.cuda.synchronize(device)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def warm_exactly(engine: Engine, shapes: Sequence[Shape]) -> WarmupReport:
    """Record exactly `shapes` (biggest first), untrimmed by the memory budget; the engine's
    warm_seconds must cover them (EXPLICIT_WARM_SECONDS does), else this raises."""
    plan = replace(engine.plan_warm(), shapes=tuple(shapes), skipped=())
    report = engine.warm(plan)
    if report.skipped:
        trimmed = ", ".join(f"{s.rows}x{s.width}: {why}" for s, why in report.skipped)
        raise RuntimeError(f"the warm-up trimmed an explicit warm list: {trimmed}")
    return report


def forward_ms(
    engine: Engine, rows: Sequence[int], width: int, repeats: int
) -> list[dict[str, object]]:
    """Eager forward against replay at each row count, over warm batches of (rows, width).

    The engine must capture and be idle (a warm batch writes the real buffers). Shapes it has
    not recorded are warmed first, biggest first, as the warm-up would."""
    recordings = engine.runner.recordings
    if recordings is None:
        raise ValueError("forward_ms needs an engine with decode_mode='recorded'")
    device = engine.model.device
    shapes = tuple(Shape(r, width) for r in sorted(set(rows), reverse=True))
    unrecorded = tuple(s for s in shapes if s not in recordings.by_shape)
    if unrecorded:
        warm_exactly(engine, unrecorded)
    out: list[dict[str, object]] = []
    with torch.inference_mode():
        for num_rows in rows:
            batch = warm_batch(recordings, engine.pool, Shape(num_rows, width))
            eager = timed_ms(
                partial(engine.model.forward, batch.plan, batch.cache), repeats, device
            )
            replay = timed_ms(partial(recordings.replay, batch.plan), repeats, device)
            out.append(
                {
                    "rows": num_rows,
                    "width": width,
                    "eager_ms": eager,
                    "replay_ms": replay,
                    "speedup": eager / replay,
                }
            )
    return out


def step_ms(
    model: LlamaModel, tokenizer, mode: str, device: str, rows: int, context: int, steps: int
) -> float:
    engine = Engine.from_config(model, tokenizer, engine_config(decode_mode=mode, device=device))
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


def engine_config(**mode: object) -> EngineConfig:
    return EngineConfig(
        max_batch=32,
        max_model_len=1024,
        max_num_batched_tokens=8192,
        kv_budget_bytes=1 << 29,
        width_multiple=64,
        warm_seconds=EXPLICIT_WARM_SECONDS,  # forward_ms warms an explicit list
        **mode,  # type: ignore[arg-type]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=10, help="forward calls timed per cell")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip-modes", action="store_true", help="only the forward table")
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
    where = f"{args.dtype} on {args.device}"
    if args.device == "cpu":
        where += f", {threads} threads"
    if not args.skip_modes:
        rows = []
        for batch in (1, 3, 8, 24):
            for context in (60, 250):
                eager = None
                for name in MODES:
                    ms = step_ms(
                        model,
                        checkpoint.tokenizer,
                        name,
                        args.device,
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
        print(table(rows, f"decode step, {where}, median of {args.steps} steps"))
        print("wrote", write_csv(f"decode_step_{args.device}.csv", rows))

    engine = Engine.from_config(
        model, checkpoint.tokenizer, engine_config(decode_mode="recorded", device=args.device)
    )
    forward = forward_ms(engine, FORWARD_ROWS, FORWARD_WIDTH, args.repeats)
    timer = "CUDA events" if args.device.startswith("cuda") else f"median of {args.repeats}"
    print()
    print(
        table(
            forward,
            f"decode forward, eager vs replay ({engine.runner.recordings.backend.name}),"
            f" {where}, {timer}",
        )
    )
    print("wrote", write_csv(f"decode_forward_{args.device}.csv", forward))


if __name__ == "__main__":
    main()

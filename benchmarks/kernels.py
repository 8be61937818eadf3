"""The linear kernels by weight type: GMAC/s per row count on every ISA this CPU runs, and what
they make of a model's decode step.

    python -m benchmarks.kernels [--models qwen2.5-coder-0.5b] [--rows 1,8,32,128]
                                 [--repeats 5] [--isas avx2,avx512-vnni]

For each model of the set (benchmarks/models.py), loaded as the server loads it (`--quantize
auto`: every tensor in its file's blocks), the forward's `nanoserve::linear` calls — q, k and v
one call, gate and up one, o, down, the output projection — are grouped by role, types and
shape, and one call of each group is timed on `rows` random rows (the kernels' speed does not
depend on the values). Each ISA path (pinned as NANOSERVE_KERNEL_ISA pins it) runs every group
in turn, round after round, so the machine's drift falls on all of them; a figure is the best
of --repeats rounds.

Two tables:

- per isa and call: GMAC/s (multiply-adds a second, all threads) at each row count;
- per isa and row count: one decode step's linear calls priced at those rates, and the share
  each role takes. A decode step's measured time (benchmarks.step_profile) less this is what
  the linears do not explain.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import torch

from benchmarks.common import cpu_line, pin_threads, table, write_csv
from benchmarks.models import served_models
from nanoserve.runtime.kernels.cpu_kernels import ISAS, CpuKernels, load_cpu_kernels
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.quant_weight import QuantLinear

MIN_SECONDS = 0.05  # a timing's calls, together, take at least this long


@dataclass(frozen=True, slots=True)
class LinearCall:
    """One kind of `nanoserve::linear` call of a forward: its role, its parts' types and its
    shape, how many a forward makes, and one of them (as the server packed it)."""

    role: str
    kinds: str
    out: int
    width: int
    count: int
    linear: QuantLinear

    @property
    def macs_per_row(self) -> int:
        return self.out * self.width


def linear_calls(model: LlamaModel) -> list[LinearCall]:
    """The forward's linear calls, grouped by role, types and shape (q, k and v are one call,
    as gate and up are, each part in its own type)."""
    found: dict[tuple[str, str, int, int], list[QuantLinear]] = defaultdict(list)
    roles: list[tuple[str, object]] = []
    for layer in model.layers:
        for role in ("qkv", "o", "gate_up", "down"):
            roles.append((role, getattr(layer, role)))
    roles.append(("lm_head", model.lm_head))
    for role, linear in roles:
        if not isinstance(linear, QuantLinear):
            continue
        out, width = linear.shape
        kinds = "+".join(kind.lower() for kind in linear.kinds)
        found[(role, kinds, out, width)].append(linear)
    return [
        LinearCall(role, kinds, out, width, len(linears), linears[0])
        for (role, kinds, out, width), linears in found.items()
    ]


def seconds_per_call(group: LinearCall, x: torch.Tensor) -> float:
    """One timing: enough calls to fill MIN_SECONDS, their mean."""

    def call() -> None:
        group.linear.matmul(x)

    call()
    started = time.perf_counter()
    call()
    once = time.perf_counter() - started
    calls = max(1, int(MIN_SECONDS / max(once, 1e-6)))
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls


def runnable_isas(asked: str | None) -> list[str]:
    best = CpuKernels.best_isa()
    paths = [isa for isa in ISAS[1 : ISAS.index(best) + 1]] or [best]
    if asked:
        wanted = asked.split(",")
        unknown = [isa for isa in wanted if isa not in paths]
        if unknown:
            raise SystemExit(f"this CPU runs {', '.join(paths)}; cannot time {', '.join(unknown)}")
        paths = wanted
    return paths


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="qwen2.5-coder-0.5b")
    parser.add_argument("--rows", default="1,8,32,128")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--isas", default=None, help="default: every path this CPU runs but portable"
    )
    args = parser.parse_args()
    threads = pin_threads()
    load_cpu_kernels()
    print(cpu_line())
    row_counts = [int(r) for r in args.rows.split(",")]
    isas = runnable_isas(args.isas)
    generator = torch.Generator().manual_seed(0)
    rate_rows: list[dict[str, object]] = []
    step_rows: list[dict[str, object]] = []
    for bench in served_models(args.models):
        checkpoint = load_checkpoint(bench.path)
        model = LlamaModel.from_checkpoint(checkpoint, dtype=torch.bfloat16, quantize="gguf")
        if model.weight_fallbacks:
            print(f"{bench.name}: served in another form (not timed): {model.weight_fallbacks}")
        calls = linear_calls(model)
        inputs = {
            (rows, width): torch.randn(rows, width, generator=generator)
            for rows in row_counts
            for width in {call.width for call in calls}
        }
        best: dict[tuple[str, int, int], float] = {}
        try:
            for _ in range(args.repeats):
                for isa in isas:
                    CpuKernels.force_isa(isa)
                    for index, call in enumerate(calls):
                        for rows in row_counts:
                            took = seconds_per_call(call, inputs[(rows, call.width)])
                            slot = (isa, index, rows)
                            best[slot] = min(best.get(slot, float("inf")), took)
        finally:
            CpuKernels.force_isa("auto")
        for isa in isas:
            for index, call in enumerate(calls):
                row: dict[str, object] = {
                    "model": bench.name,
                    "isa": isa,
                    "call": call.role,
                    "types": call.kinds,
                    "out x in": f"{call.out}x{call.width}",
                    "per_step": call.count,
                }
                for rows in row_counts:
                    rate = rows * call.macs_per_row / best[(isa, index, rows)] / 1e9
                    row[f"gmac_s@{rows}"] = rate
                rate_rows.append(row)
            for rows in row_counts:
                by_call: Counter[str] = Counter()
                for index, call in enumerate(calls):
                    by_call[call.role] += call.count * best[(isa, index, rows)]
                total = sum(by_call.values())
                macs = sum(call.count * call.macs_per_row for call in calls) * rows
                step_rows.append(
                    {
                        "model": bench.name,
                        "isa": isa,
                        "rows": rows,
                        "linears_ms": total * 1e3,
                        "per_row_ms": total * 1e3 / rows,
                        "gmac_s": macs / total / 1e9,
                        "shares": " ".join(
                            f"{role} {share / total:.0%}" for role, share in by_call.most_common()
                        ),
                    }
                )
    title = f"linear calls, GMAC/s at each row count, {threads} threads, best of {args.repeats}"
    print(table(rate_rows, title))
    print()
    print(table(step_rows, "one decode step's linear calls at those rates"))
    print("wrote", write_csv("kernels.csv", rate_rows), write_csv("kernels_step.csv", step_rows))


if __name__ == "__main__":
    main()

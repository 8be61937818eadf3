"""The memory roofline: the decode speed a step's bytes allow at the read speed measured here.

    python -m benchmarks.roofline [--models qwen2.5-coder-1.5b,...] [--context 80]

A decode step at a few rows reads every weight once, so no engine decodes faster than the
memory delivers a step's bytes. The roofline states that limit for each file, and the
benchmarks (`forward`, `serve --peer`) print each engine's tok/s as a share of it, nanoserve and
llama.cpp in the same run:

- **bandwidth**: the best of five passes of `kernel_ops.read_bytes` over a 1 GiB buffer, on the
  kernels' own threads (torch's, pinned as the benchmark pins them), split evenly as a linear
  splits a weight;
- **bytes a step reads** (`StepBytes`, from the GGUF's tensor table, weights as stored):
  every tensor once; the token embedding one row per row (the whole table where it is also the
  output projection: tied); a mixture's experts in expectation, `E (1 - (1 - k/E)^rows)` distinct
  of `E` for `rows` rows picking `k` each (uniform routing); K and V at `context` positions per
  row, 2 bytes a value (f16 in llama.cpp, bf16 in nanoserve's default pool), for each layer that
  stores them (its `attn_k` rows, or phi3's fused `attn_qkv` less q), every attending layer at
  the whole context (exact below a sliding window);
- **limit** = rows × bandwidth ÷ step bytes (tok/s); **share** = measured tok/s ÷ limit.

The limit ignores compute: on two cores a K-quant step is bound partly by unpacking and dots,
so a share well under 1 says which part of the step is not the memory, not that it is wasted.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import pin_threads, table, write_csv

KV_VALUE_BYTES = 2  # f16 / bf16 K and V
READ_BYTES = 1 << 30


def read_bandwidth(size: int = READ_BYTES, passes: int = 5) -> float:
    """GB/s: the best of `passes` reads of a `size`-byte buffer on the kernels' threads."""
    import torch

    from nanoserve.runtime.kernels import kernel_ops
    from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels

    load_cpu_kernels()
    buffer = torch.ones(size, dtype=torch.uint8)  # written: every page is resident
    kernel_ops.read_bytes(buffer)  # the threads up, the pages mapped
    best = float("inf")
    for _ in range(passes):
        started = time.perf_counter()
        kernel_ops.read_bytes(buffer)
        best = min(best, time.perf_counter() - started)
    return size / best / 1e9


@dataclass(frozen=True, slots=True)
class StepBytes:
    """What one decode step reads from a GGUF's weights and its K/V, in bytes."""

    shared: int  # read once a step, whatever the rows: dense weights, a tied output
    per_row: int  # read for each row: its embedding rows
    experts: int  # every expert of every layer, as stored
    expert_count: int  # E (0: no mixture)
    experts_used: int  # k, per token
    kv_per_position: int  # K and V of one position over the layers that store them

    def at(self, rows: int, context: int) -> float:
        """The bytes of a step over `rows` rows, each at `context` positions."""
        experts = 0.0
        if self.expert_count:
            picked = 1 - (1 - self.experts_used / self.expert_count) ** rows
            experts = self.experts * picked
        return self.shared + rows * (self.per_row + context * self.kv_per_position) + experts

    def limit(self, bandwidth_gbs: float, rows: int, context: int) -> float:
        """tok/s: rows tokens a step, each step at the memory's speed."""
        return rows * bandwidth_gbs * 1e9 / self.at(rows, context)


def step_bytes(path: Path) -> StepBytes:
    """StepBytes of a GGUF file, from its tensor table and its attention metadata."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    arch = str(fields["general.architecture"])
    tensors = {t.name: t for t in reader.tensors}
    tied = "output.weight" not in tensors
    shared = per_row = experts = kv = 0
    for name, tensor in tensors.items():
        size = int(tensor.n_bytes)
        rows = int(tensor.n_elements) // max(1, int(tensor.shape[0]))
        if name.endswith("token_embd.weight") and not (tied and name == "token_embd.weight"):
            per_row += size // rows  # a lookup reads its rows; a tied output reads it whole
        elif "_exps." in name:
            experts += size
        else:
            shared += size
        if name.endswith("attn_k.weight"):
            v_rows = tensors.get(name.replace("attn_k", "attn_v"), tensor)  # K as V without one
            kv += KV_VALUE_BYTES * (rows + int(v_rows.n_elements) // int(v_rows.shape[0]))
        elif name.endswith("attn_qkv.weight") and arch == "phi3":
            heads = int(fields[f"{arch}.attention.head_count"])
            head_dim = int(fields[f"{arch}.embedding_length"]) // heads
            kv += KV_VALUE_BYTES * (rows - heads * head_dim)
    return StepBytes(
        shared=shared,
        per_row=per_row,
        experts=experts,
        expert_count=int(fields.get(f"{arch}.expert_count", 0)),
        experts_used=int(fields.get(f"{arch}.expert_used_count", 0)),
        kv_per_position=kv,
    )


@dataclass(frozen=True, slots=True)
class Roofline:
    """One file's limit at the bandwidth measured in this run."""

    bandwidth_gbs: float
    step: StepBytes

    def limit(self, rows: int, context: int) -> float:
        return self.step.limit(self.bandwidth_gbs, rows, context)

    def share(self, tok_s: float, rows: int, context: int) -> float:
        return tok_s / self.limit(rows, context)


def bandwidth_line(bandwidth_gbs: float, threads: int) -> str:
    return (
        f"roofline: reads at {bandwidth_gbs:.1f} GB/s (the kernels' read pass on {threads}"
        f" threads, best of 5 over {READ_BYTES >> 30} GiB)"
    )


def main() -> None:
    from benchmarks.common import cpu_line
    from benchmarks.models import model_set

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", help="comma-separated names of the set (default: all)")
    parser.add_argument("--context", type=int, default=80, help="positions per row")
    parser.add_argument("--levels", default="1,8,32", help="rows per step")
    args = parser.parse_args()
    threads = pin_threads()
    print(cpu_line())
    bandwidth = read_bandwidth()
    print(bandwidth_line(bandwidth, threads))
    levels = [int(n) for n in args.levels.split(",")]
    rows = []
    for model in model_set(only=args.models):
        step = step_bytes(model.path)
        rows.append(
            {
                "model": model.name,
                "weights_mb": (step.shared + step.experts) / 1e6,
                "kv_kb_per_position": step.kv_per_position / 1e3,
                **{f"step_mb_{n}": step.at(n, args.context) / 1e6 for n in levels},
                **{f"limit_tok_s_{n}": step.limit(bandwidth, n, args.context) for n in levels},
            }
        )
    print(table(rows, f"the decode roofline at {args.context} positions a row"))
    print("wrote", write_csv("roofline.csv", rows))


if __name__ == "__main__":
    main()

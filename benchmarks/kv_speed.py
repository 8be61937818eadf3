"""Decode speed at long context by K/V cache form, beside llama.cpp with the same cache types.

    python -m benchmarks.kv_speed [--models smollm2-135m] [--contexts 4096,16384] [--streams 1,8]
                                  [--forms q8_0] [--rounds 3] [--steps 8]
                                  [--peer-modes split unified] [--no-peer]

Per model of the set, context length (within the model's trained context: SmolLM2's is 8,192)
and stream count, decode tokens a second (streams / step
time) with each stream `context` tokens deep:

- nanoserve: the model as `nanoserve serve` runs the GGUF (its own blocks under the kernels),
  its decode forward and greedy pick over a pool of the form, each stream's context in blocks of
  its own, filled with random values (finite scales for blocks: speed does not depend on the
  values), so no prefill is paid; the median of `--steps` steps, float16 and each `--forms`
  alternating over `--rounds` rounds, each form's median over the rounds;
- llama.cpp: `llama-batched-bench` with `-ctk/-ctv` of the form and `-fa on` (its quantized V
  needs flash attention; the float16 run has it too), one `context`-token prompt shared by the
  streams (`-pps`: prefilled once, then copied to each stream), `--steps` generated tokens a
  stream (its `speed_tg`); at several streams both cache modes (split per stream, and unified
  `-kvu`, where the shared prompt's cells are read by every stream: the peer's best case).

The ratio that the issue's goal reads is each form's rate over float16's in the same engine and
run; nanoserve against llama.cpp is beside it, at the same form.
Prints a table; writes CSV.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import time

import torch

from benchmarks.common import cpu_line, pin_threads, table, write_csv
from benchmarks.kv_accuracy import REFERENCE, llama_cache_types, served_model
from benchmarks.models import BenchModel, served_models
from benchmarks.peer import Peer, find_peer
from nanoserve.core import BlockTable, plan_kv_pool
from nanoserve.core.decode_plan import DecodeSeq, plan_decode
from nanoserve.core.kv_cache_dtype import (
    BLOCK_BYTES,
    form_bytes,
    parse_kv_cache_dtype,
)
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel

BLOCK = 16
SCALE = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)  # a block's finite scale


def fill(pool: KVPool) -> None:
    """Every layer's K/V random: float values in [-1, 1]; blocks of random quants, each block's
    scale 0.01 (random bytes there could be NaN or infinity)."""
    forms = pool.plan.kv_cache_dtype
    head_dim = pool.plan.head_dim
    with torch.inference_mode():
        for layer in range(pool.plan.num_layers):
            storage = pool.storage(layer)
            if not pool.blocks:
                storage.uniform_(-1.0, 1.0)
                continue
            storage.random_(0, 256)
            start = 0
            for form in (forms.k, forms.v):
                end = start + form_bytes(form, head_dim)
                storage[..., start:end].unflatten(-1, (-1, BLOCK_BYTES[form]))[..., :2] = SCALE
                start = end


class Deep:
    """`streams` sequences `context` tokens deep in a pool of one form, and their decode step."""

    def __init__(self, model: LlamaModel, streams: int, context: int) -> None:
        cfg = model.config
        per_stream = -(-(context + 1) // BLOCK)
        plan = plan_kv_pool(
            num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            dtype=model.kv_dtype, block_size=BLOCK, budget_bytes=1 << 40,
            max_blocks=streams * per_stream, forms=model.kv_cache_dtype,
        )  # fmt: skip
        self.model = model
        self.pool = KVPool(plan)
        fill(self.pool)
        seqs = [
            DecodeSeq(
                seq_id=s,
                token_id=(s * 7919) % 30000 + 17,
                position=context,
                block_table=BlockTable(BLOCK, range(s * per_stream, (s + 1) * per_stream)),
            )
            for s in range(streams)
        ]
        self.plan = plan_decode(seqs, sink_slot=plan.sink_slot)
        self.cache = self.pool.view(tuple(range(streams)))

    def step(self) -> None:
        with torch.inference_mode():
            self.model.forward(self.plan, self.cache).argmax(-1)

    def seconds(self, steps: int) -> float:
        """The median of `steps` decode steps (after one not timed)."""
        self.step()
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - started)
        return statistics.median(times)


def ours(
    checkpoint: Checkpoint, forms: list[str], context: int, streams: int, args: argparse.Namespace
) -> dict[str, float]:
    """tok/s by form, float16 and `forms` alternating over the rounds."""
    names = [REFERENCE, *forms]
    deep = {
        name: Deep(
            served_model(checkpoint, parse_kv_cache_dtype(name, torch.float16), context),
            streams,
            context,
        )
        for name in names
    }
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            seconds[name].append(deep[name].seconds(args.steps))
    del deep
    gc.collect()
    return {name: streams / statistics.median(times) for name, times in seconds.items()}


def peer_rate(
    peer: Peer, bench: BenchModel, form: str, context: int, streams: int, mode: str,
    args: argparse.Namespace, threads: int,
) -> float:  # fmt: skip
    """llama.cpp's decode tok/s over `streams` streams `context` tokens deep (batched-bench)."""
    k, v = llama_cache_types(form)
    command = [
        peer.binary("llama-batched-bench"), "-m", str(bench.path), "-t", str(threads),
        "-tb", str(threads), "-c", str(streams * (context + args.steps + 16)), "-b", "2048",
        "-ub", "512", "-npp", str(context), "-ntg", str(args.steps), "-npl", str(streams),
        "-pps", "-ctk", k, "-ctv", v, "-fa", "on", "--output-format", "jsonl",
        "-kvu" if mode == "unified" else "-no-kvu",
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            return float(json.loads(line)["speed_tg"])
    raise SystemExit(f"llama-batched-bench gave no figure: {out.stderr[-400:]}")


def bench_model(
    bench: BenchModel, args: argparse.Namespace, threads: int
) -> list[dict[str, object]]:
    checkpoint = load_checkpoint(bench.path)
    peer = None if args.no_peer else find_peer(bench.path)
    nan = float("nan")
    rows = []
    for context in (int(c) for c in args.contexts.split(",")):
        for streams in (int(s) for s in args.streams.split(",")):
            rates = ours(checkpoint, args.forms, context, streams, args)
            modes = tuple(args.peer_modes) if streams > 1 else ("split",)
            peer_rates: dict[str, dict[str, float]] = {}
            for name in [REFERENCE, *args.forms]:
                peer_rates[name] = {
                    mode: peer_rate(peer, bench, name, context, streams, mode, args, threads)
                    for mode in modes
                } if peer else {}  # fmt: skip
            for name in [REFERENCE, *args.forms]:
                best = max(peer_rates[name].values(), default=nan)
                peer_base = max(peer_rates[REFERENCE].values(), default=nan)
                row = {
                    "model": bench.name, "context": context, "streams": streams, "form": name,
                    "tok_s": rates[name], "vs_float16": rates[name] / rates[REFERENCE],
                    "llama_split": peer_rates[name].get("split", nan),
                    "llama_kvu": peer_rates[name].get("unified", nan),
                    "llama_vs_f16": best / peer_base, "vs_llama": rates[name] / best,
                }  # fmt: skip
                rows.append(row)
                print(table([row], ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2-135m", help="comma-separated names")
    parser.add_argument("--contexts", default="4096,16384")
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--forms", nargs="+", default=["q8_0"], help="cache forms beside float16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed decode steps a measurement")
    parser.add_argument(
        "--peer-modes",
        nargs="+",
        default=["split", "unified"],
        choices=("split", "unified"),
        help="llama.cpp's cache modes at streams > 1",
    )
    parser.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    args = parser.parse_args()
    threads = pin_threads()
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    print(cpu_line())
    rows = []
    for bench in served_models(args.models):
        rows += bench_model(bench, args, threads)
    print(table(rows, "decode tok/s at long context by K/V form (streams each context deep)"))
    print(f"wrote {write_csv('kv_speed.csv', rows)}")


if __name__ == "__main__":
    main()

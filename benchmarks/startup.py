"""Time to ready: process start to the first 200 of /health, nanoserve beside llama-server.

    python -m benchmarks.startup [--models qwen2.5-coder-1.5b] [--runs 5] [-- serve flags]

Per model of the set (benchmarks/models.py; default the 1.5B, the issue's startup target), --runs
rounds, each of four boots in turn: nanoserve "cold" (an empty timing cache, a fresh folder in
$NANOSERVE_TIMING_CACHE), nanoserve "warm" (a cache that two earlier boots filled, as a second
start of the same server finds it), and `llama-server -np 32 -c 16384` in both of its cache
modes (split per slot, its default with `-np`, and `-kvu`); every server gets the same threads.
nanoserve serves with the pool of the same 16,384 tokens, as `serve --peer` does.
The file is read once first, so every boot finds it in the page cache; the kernels are built
before the first run (their one-time build is not a boot's). Each process is stopped before the
next starts. Prints the runs, their medians, the ratios to llama-server's median of the same
runs, and each server's RSS once ready.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import cpu_line, pin_threads, table, write_csv
from benchmarks.models import served_models
from benchmarks.peer import CACHE_MODES, find_peer, start_llama_server
from benchmarks.serve import PEER_CONTEXT, kv_budget_for
from benchmarks.servers import bench_threads, start_nanoserve

PEER_KINDS = tuple(f"llama-server {mode}" for mode in CACHE_MODES)
KINDS = ("nanoserve cold", "nanoserve warm", *PEER_KINDS)


def read_through(path: Path) -> None:
    """The file into the page cache, so that no boot pays for the disk."""
    with path.open("rb") as f:
        while f.read(1 << 24):
            pass


def boot(kind: str, flags: list[str], gguf: Path, threads: int, cache: str) -> tuple[float, float]:
    """One boot of `kind`: seconds to ready and RSS (MiB) once ready; the process is stopped."""
    if kind in PEER_KINDS:
        peer = find_peer(gguf)
        if peer is None:
            raise SystemExit("llama-server not found")
        mode = kind.removeprefix("llama-server ")
        server = start_llama_server(peer, gguf, threads, cache_mode=mode, context=PEER_CONTEXT)
    else:
        os.environ["NANOSERVE_TIMING_CACHE"] = (
            tempfile.mkdtemp(prefix="timings-") if kind == "nanoserve cold" else cache
        )
        server = start_nanoserve(flags, threads)
    try:
        return server.ready_s, server.rss_mib()
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="qwen2.5-coder-1.5b")
    parser.add_argument("--runs", type=int, default=5)
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    threads = pin_threads(bench_threads())
    print(cpu_line())
    from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels

    print(f"kernels: {load_cpu_kernels().isa} (built before the runs)")
    summary = []
    for model in served_models(args.models):
        read_through(model.path)
        flags = [str(model.path), "--max-batch", "32", "--max-model-len", "1024"]
        flags += ["--kv-budget", str(kv_budget_for(model.path, PEER_CONTEXT)), *extra]
        warm_cache = tempfile.mkdtemp(prefix="timings-")
        os.environ["NANOSERVE_TIMING_CACHE"] = warm_cache
        for _ in range(2):  # the cache keeps the faster of two boots' timings (timing_cache.py)
            boot("nanoserve warm", flags, model.path, threads, warm_cache)
        runs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
        for _ in range(args.runs):
            for kind in KINDS:
                runs[kind].append(boot(kind, flags, model.path, threads, warm_cache))
        peer_median = min(statistics.median(r for r, _ in runs[kind]) for kind in PEER_KINDS)
        for kind in KINDS:
            ready = statistics.median(r for r, _ in runs[kind])
            summary.append(
                {
                    "model": model.name,
                    "server": kind,
                    "runs_s": " ".join(f"{r:.2f}" for r, _ in runs[kind]),
                    "ready_median_s": round(ready, 3),
                    "ratio_to_faster_llama": round(ready / peer_median, 3),
                    "rss_mib": round(statistics.median(m for _, m in runs[kind]), 1),
                }
            )
    print(table(summary, f"ready after (s), {args.runs} alternating runs, {threads} threads"))
    print("wrote", write_csv("startup.csv", summary))


if __name__ == "__main__":
    main()

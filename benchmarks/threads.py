"""Does `--threads N` hold? The server's CPU time over wall time under a burst of streams.

    python -m benchmarks.threads [--models smollm2-135m] [--threads 1,2] [--streams 16]

Per model of the set and thread count, `nanoserve serve --threads N` is started and sent one
burst: `--streams` streaming completions at once (distinct 64-token prompts, `--max-tokens`
tokens each, ignore_eos, counted from usage). The server process's CPU time (user + system, all
of its threads: the step thread, the HTTP loop, torch's and the kernels' workers) is read from
/proc before and after the burst; CPU time over wall time is how many cores it kept busy. With
`--threads 1` that must stay near one core (at most 1.25: the HTTP loop and the tokenizer run
beside the one compute thread).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from benchmarks.common import cpu_line, table, write_csv
from benchmarks.models import served_models
from benchmarks.serve import level, short_note
from benchmarks.servers import cpu_seconds, start_nanoserve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2-135m")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    print(cpu_line())
    rows = []
    for bench in served_models(args.models):
        for threads in (int(t) for t in args.threads.split(",")):
            server = start_nanoserve([str(bench.path)], threads)
            try:
                before, started = cpu_seconds(server.process), time.perf_counter()
                row = asyncio.run(
                    level(server.url, args.streams, args.streams, 64, args.max_tokens, seed=7)
                )
                cpu, wall = cpu_seconds(server.process) - before, time.perf_counter() - started
            finally:
                server.stop()
            rows.append(
                {
                    "model": bench.name,
                    "threads": threads,
                    "streams": args.streams,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "cores_busy": cpu / wall,
                    "output_tok_s": row["output_tok_s"],
                    "valid": short_note(row, args.max_tokens) or "yes",
                }
            )
            print(table(rows[-1:], f"{bench.name}, --threads {threads}"), flush=True)
    print(table(rows, f"server CPU time / wall time under a {args.streams}-stream burst"))
    print("wrote", write_csv("threads.csv", rows))


if __name__ == "__main__":
    main()

"""A long prompt's first token, and a second prompt's that shares its prefix, beside llama.cpp.

    python -m benchmarks.long_prompt [--models lfm2-1.2b-shape] [--rounds 3] [-- nanoserve flags]

Per model of the set (benchmarks/models.py), nanoserve (8 state checkpoints for a hybrid's
prefix cache) and llama-server (`-np 1`, its whole cache for one sequence: a long prompt fits,
and its prompt cache is the slot's, with its context checkpoints) are up at once with the same
thread count. Each round, alternating which server goes first, sends to each:

- a `--long`-token prompt (distinct random token ids per round and server), one output token:
  prefill throughput = prompt tokens / TTFT;
- then two prompts that share a `--prefix`-token prefix and differ in their last 64 tokens:
  the second's TTFT over the first's (a prefix cache that serves the shared part brings it
  toward the 64 tokens' cost; a server that must recompute it stays near 1).

Prints medians over the rounds, and nanoserve's ratio to llama.cpp; writes CSV.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile

import httpx

from benchmarks.common import cpu_line, pin_threads, table, write_csv
from benchmarks.peer import find_peer, start_llama_server
from benchmarks.serve import kv_budget_for, one_request
from benchmarks.servers import Server, bench_threads, start_nanoserve

SUFFIX = 64  # the tokens after the shared prefix


async def ttft(url: str, prompt: list[int]) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        seconds, _, tokens = await one_request(client, prompt, 1)
    if tokens != 1:
        raise SystemExit(f"{url}: {tokens} tokens (usage) for max_tokens=1")
    return seconds


def prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(17, 48000) for _ in range(length)]


def measure(url: str, rng: random.Random, long: int, prefix: int) -> dict[str, float]:
    first_long = asyncio.run(ttft(url, prompt(rng, long)))
    shared = prompt(rng, prefix)
    first = asyncio.run(ttft(url, shared + prompt(rng, SUFFIX)))
    second = asyncio.run(ttft(url, shared + prompt(rng, SUFFIX)))
    return {"long_ttft_s": first_long, "prefix_first_s": first, "prefix_second_s": second}


def main() -> None:
    from benchmarks.models import served_models

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="lfm2-1.2b-shape,qwen3.5-0.8b-shape")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--long", type=int, default=2048)
    parser.add_argument("--prefix", type=int, default=1024)
    parser.add_argument("--tag", default="")
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    threads = pin_threads(bench_threads())
    print(cpu_line())
    print(f"threads: {threads} for every server")
    context = args.long + args.prefix + 2 * SUFFIX
    for bench in served_models(args.models):
        peer = find_peer(bench.path)
        if peer is None:
            return
        os.environ["NANOSERVE_TIMING_CACHE"] = tempfile.mkdtemp(prefix="timings-")
        flags = [str(bench.path), "--max-batch", "8", "--max-model-len", str(context)]
        # A hybrid's prefix cache: 8 state checkpoints (llama.cpp keeps up to 32 a slot, apart)
        flags += ["--state-checkpoints", "8"]
        budget = kv_budget_for(bench.path, 2 * context, rows=8, checkpoints=8)
        flags += ["--kv-budget", str(budget), *extra]
        servers: dict[str, Server] = {"nanoserve": start_nanoserve(flags, threads)}
        servers["llama.cpp"] = start_llama_server(
            peer, bench.path, threads, cache_mode="split", context=context, parallel=1
        )
        samples: dict[str, list[dict[str, float]]] = {who: [] for who in servers}
        try:
            for round_ in range(args.rounds):
                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                for who in order:
                    rng = random.Random(f"{bench.name}/{who}/{round_}")
                    got = measure(servers[who].url, rng, args.long, args.prefix)
                    samples[who].append(got)
                    print(f"round {round_ + 1} {who:>9}: " + ", ".join(
                        f"{k} {v:.3f}" for k, v in got.items()
                    ), flush=True)  # fmt: skip
        finally:
            for server in servers.values():
                server.stop()
        rows = []
        for who, runs in samples.items():
            median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rows.append(
                {
                    "server": who,
                    "long_ttft_s": round(median["long_ttft_s"], 3),
                    "prefill_tok_s": round(args.long / median["long_ttft_s"], 1),
                    "prefix_first_s": round(median["prefix_first_s"], 3),
                    "prefix_second_s": round(median["prefix_second_s"], 3),
                    "second_over_first": round(
                        median["prefix_second_s"] / median["prefix_first_s"], 2
                    ),
                }
            )
        ours, theirs = rows[0], rows[1]
        ours["prefill_vs_llama"] = round(
            float(ours["prefill_tok_s"]) / float(theirs["prefill_tok_s"]),
            2,  # type: ignore[arg-type]
        )
        theirs["prefill_vs_llama"] = 1.0
        title = (
            f"long prompt, {bench.name}: a {args.long}-token prompt's TTFT (one output token),"
            f" and two prompts sharing a {args.prefix}-token prefix (+{SUFFIX} tokens each);"
            f" median of {args.rounds} alternating rounds; llama.cpp backend {peer.backend}"
        )
        print(table(rows, title))
        print("wrote", write_csv(f"long_prompt_{bench.name}{args.tag}.csv", rows))


if __name__ == "__main__":
    main()

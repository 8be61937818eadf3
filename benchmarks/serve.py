"""Load on a running server: TTFT, inter-token latency and aggregate output tok/s.

    python -m benchmarks.serve --url http://127.0.0.1:8000        # a server you started
    python -m benchmarks.serve --start -- --dtype bfloat16        # start one here (loopback)
    python -m benchmarks.serve --peer [--models qwen2.5-coder-0.5b] [--rounds 3] [-- flags]

A bounded async load generator on loopback: for each concurrency (1, 8, 32), 2x that many
streaming completions of 64-token prompts (distinct random token ids, drawn per level and
round) and 64 output tokens (ignore_eos, fixed seed), at most `concurrency` in flight. Tokens
are counted from each answer's usage (`stream_options.include_usage`), never from stream
chunks: a request that produced fewer than `max_tokens` invalidates its round, which is said and
left out of the medians. Reports p50/p99 TTFT and ITL and output tok/s over the level.

--peer runs the model set (benchmarks/models.py), one model at a time, beside llama.cpp's
server in both of its cache modes (benchmarks/serve_peer.py: the servers, the two schedules and
the tables).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import time
from pathlib import Path

import httpx

from benchmarks.common import table, write_csv
from benchmarks.servers import (
    bench_threads,
    start_nanoserve,
)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one_request(
    client: httpx.AsyncClient, prompt: list[int], max_tokens: int
) -> tuple[float, list[float], int]:
    """(TTFT, gaps between content chunks, completion tokens from usage; 0 if none came)."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    started = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                stamps.append(time.perf_counter())
    ttft = stamps[0] - started if stamps else float("nan")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return ttft, gaps, tokens


async def level(
    url: str, concurrency: int, requests: int, prompt_len: int, max_tokens: int, seed: int
) -> dict[str, object]:
    # Seeded per level too: with one seed, a level's first prompts were the previous levels'
    # (the 32-stream level re-sent the 8-stream level's 16), and either server's prefix cache
    # served them, not the workload's distinct prompts.
    rng = random.Random(f"{seed}/{concurrency}")
    prompts = [[rng.randrange(17, 48000) for _ in range(prompt_len)] for _ in range(requests)]
    gate = asyncio.Semaphore(concurrency)
    # No keep-alive: llama-server (cpp-httplib) closes a connection after a few requests, and a
    # request sent on one it is closing fails. A loopback connect per request costs ~0.1 ms.
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def bounded(prompt: list[int]) -> tuple[float, list[float], int]:
            async with gate:
                return await one_request(client, prompt, max_tokens)

        started = time.perf_counter()
        results = await asyncio.gather(*(bounded(p) for p in prompts))
        seconds = time.perf_counter() - started
    ttfts = [r[0] for r in results]
    gaps = [g for r in results for g in r[1]]
    tokens = sum(r[2] for r in results)
    return {
        # requests whose usage counted fewer than max_tokens: the level's round is invalid
        "short": sum(r[2] < max_tokens for r in results),
        "concurrency": concurrency,
        "requests": requests,
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "itl_p50_ms": percentile(gaps, 0.5) * 1000,
        "itl_p99_ms": percentile(gaps, 0.99) * 1000,
        "output_tok_s": tokens / seconds,
        "seconds": seconds,
        "mean_tokens": statistics.mean(r[2] for r in results),
    }


def short_note(row: dict[str, object], max_tokens: int) -> str:
    """'' for a valid level; else why its round does not count."""
    if not row["short"]:
        return ""
    return (
        f"INVALID: {row['short']} of {row['requests']} requests produced fewer than"
        f" {max_tokens} tokens (usage), mean {float(row['mean_tokens']):.1f}"  # type: ignore[arg-type]
    )


def kv_budget_for(gguf: Path, tokens: int, rows: int = 32, checkpoints: int = 0) -> int:
    """Bytes of a 16-bit K/V pool of `tokens` slots for this model's attention layers, and the
    sink slot; for a hybrid, plus its recurrent state for `rows` sequences, `checkpoints` saved
    states (pass `--state-checkpoints` the same) and the sink (which nanoserve takes from the
    budget first, as llama.cpp sizes its recurrent state and its context checkpoints apart)."""
    from nanoserve.core.state_pool_plan import StatePoolPlan
    from nanoserve.runtime.loading.checkpoint import load_checkpoint

    cfg = load_checkpoint(gguf).config
    per_token = 2 * len(cfg.attention_layers) * cfg.num_kv_heads * cfg.head_dim * 2
    state = StatePoolPlan(rows + checkpoints, cfg.state_shapes, checkpoints)
    return per_token * (tokens + 1) + state.total_bytes


PEER_CONTEXT = 16384  # llama-server's K/V cache, and nanoserve's pool, in tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url")
    parser.add_argument(
        "--start", action="store_true", help="start a server here; args after -- go to it"
    )
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="")
    parser.add_argument("--peer", action="store_true", help="side by side with llama-server")
    parser.add_argument("--models", help="with --peer: comma-separated names of the set")
    parser.add_argument("--rounds", type=int, default=3, help="with --peer: rounds per level")
    parser.add_argument(
        "--in-turn",
        action="store_true",
        help="with --peer: one server up at a time (automatic where three would not fit)",
    )
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.peer:
        from benchmarks.serve_peer import side_by_side

        side_by_side(args, extra)
        return
    server = start_nanoserve(extra, bench_threads()) if args.start else None
    url = server.url if server is not None else args.url
    if not url:
        raise SystemExit("give --url of a running server, or --start")
    try:
        rows = []
        for concurrency in (int(c) for c in args.levels.split(",")):
            row = asyncio.run(
                level(
                    url, concurrency, 2 * concurrency, args.prompt_len, args.max_tokens, args.seed
                )
            )
            if note := short_note(row, args.max_tokens):
                print(f"concurrency {concurrency}: {note}")
            rows.append(row)
            print(table(rows[-1:], f"concurrency {concurrency}"), flush=True)
        title = f"serve: {args.prompt_len}-token prompts, {args.max_tokens} output tokens {' '.join(extra)}"
        print(table(rows, title))
        print("wrote", write_csv(f"serve{args.tag}.csv", rows))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()

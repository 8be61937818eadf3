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

--peer runs the model set (benchmarks/models.py), one model at a time, with the same thread
count on every server (benchmarks/servers.py): `nanoserve serve` with a K/V pool of 16,384
tokens, and llama.cpp's `llama-server -np 32 -c 16384` in both of its cache modes, the split
per-slot default and `-kvu` (benchmarks/peer.py), all up at once on free loopback ports; every
level on each, alternating the order per round, for --rounds rounds. It prints per model the
medians, each level's ratio against the better llama.cpp mode (both printed), each server's
time to a 200 from /health after its process started (nanoserve's boot is cold: an empty timing
cache, as a file's first boot finds it), and, after the load, each one's RSS beside what it
holds reserved (llama-server's K/V and compute buffers, zero-filled at start; nanoserve's pool,
paged in as it is used).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import nan_last, table, write_csv
from benchmarks.peer import CACHE_MODES, Peer, reserved_mib, start_llama_server
from benchmarks.servers import (
    Server,
    bench_threads,
    nanoserve_reserved_mib,
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
METRICS = ("output_tok_s", "ttft_p50_s", "itl_p50_ms", "itl_p99_ms")
PEERS = tuple(f"llama.cpp {mode}" for mode in CACHE_MODES)


def side_by_side(args: argparse.Namespace, extra: list[str]) -> None:
    from benchmarks.common import cpu_line, pin_threads
    from benchmarks.models import served_models
    from benchmarks.peer import find_peer

    threads = pin_threads(bench_threads())
    print(cpu_line())
    print(f"threads: {threads} for every server (nanoserve --threads, llama-server -t/-tb)")
    for bench in served_models(args.models):
        peer = find_peer(bench.path)
        if peer is None:
            return
        print(f"{bench.name}: llama.cpp backend {peer.backend} {peer.note}".rstrip())
        rows, memory = model_side_by_side(bench.name, bench.path, peer, threads, args, extra)
        title = (
            f"serve, side by side, {bench.name}: {args.prompt_len}-token prompts,"
            f" {args.max_tokens} output tokens, median of the valid rounds of {args.rounds};"
            f" ratio against the better llama.cpp cache mode; nanoserve"
            f" {' '.join(extra) or '(defaults)'}"
        )
        print(table(rows, title))
        print(
            table(
                memory,
                f"{bench.name}: ready after start (s; nanoserve cold: an empty timing cache),"
                " and after the load: RSS and what each holds reserved (MiB)",
            )
        )
        print("wrote", write_csv(f"serve_peer_{bench.name}{args.tag}.csv", rows))
        print("wrote", write_csv(f"serve_peer_memory_{bench.name}{args.tag}.csv", memory))


def start_all(gguf: Path, peer: Peer, threads: int, extra: list[str]) -> dict[str, Server]:
    """nanoserve (cold: a fresh timing cache) and llama-server in both cache modes."""
    budget = kv_budget_for(gguf, PEER_CONTEXT)
    flags = [str(gguf), "--max-batch", "32", "--max-model-len", "1024"]
    flags += ["--kv-budget", str(budget), *extra]
    os.environ["NANOSERVE_TIMING_CACHE"] = tempfile.mkdtemp(prefix="timings-")
    servers = {"nanoserve": start_nanoserve(flags, threads)}
    for mode, who in zip(CACHE_MODES, PEERS, strict=True):
        servers[who] = start_llama_server(
            peer, gguf, threads, cache_mode=mode, context=PEER_CONTEXT, parallel=32
        )
    return servers


def memory_rows(
    name: str, gguf: Path, peer: Peer, threads: int, servers: dict[str, Server]
) -> list[dict[str, object]]:
    # Every RSS first, then every server stopped before the peer's extra boots read its buffers:
    # a second copy of a multi-GB model beside three running servers would not fit.
    rss = {who: server.rss_mib() for who, server in servers.items()}
    for server in servers.values():
        if server.who != "nanoserve":
            server.stop()
    rows = []
    for who, server in servers.items():
        if who == "nanoserve":
            label = "K/V pool and a hybrid's state with its checkpoints (paged in as used)"
            reserved = {label: nanoserve_reserved_mib(server.url)}
        else:
            buffers = reserved_mib(
                peer, gguf, threads, cache_mode=who.removeprefix("llama.cpp "),
                context=PEER_CONTEXT, parallel=32,
            )  # fmt: skip
            reserved = {f"{kind} buffer (allocated at start)": mib for kind, mib in buffers.items()}
        rows.append(
            {
                "model": name,
                "server": who,
                "ready_s": server.ready_s,
                "rss_mib": rss[who],
                "reserved_mib": sum(reserved.values()),
                "reserved": "; ".join(f"{k} {v:,.0f}" for k, v in reserved.items()),
            }
        )
    return rows


def model_side_by_side(
    name: str,
    gguf: Path,
    peer: Peer,
    threads: int,
    args: argparse.Namespace,
    extra: list[str],
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    servers = start_all(gguf, peer, threads, extra)
    levels = [int(c) for c in args.levels.split(",")]
    results: dict[tuple[str, int], list[dict[str, object]]] = {}
    try:
        for round_ in range(args.rounds):
            for concurrency in levels:
                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                for who in order:
                    time.sleep(1.0)  # llama.cpp's threads poll a while after their work
                    row = asyncio.run(
                        level(
                            servers[who].url,
                            concurrency,
                            2 * concurrency,
                            args.prompt_len,
                            args.max_tokens,
                            args.seed + round_,
                        )
                    )
                    note = short_note(row, args.max_tokens)
                    if not note:
                        results.setdefault((who, concurrency), []).append(row)
                    print(f"round {round_ + 1} {who:>17} c={concurrency}: "
                          f"{row['output_tok_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_s']:.3f} s, "
                          f"ITL p99 {row['itl_p99_ms']:.0f} ms {note}".rstrip(), flush=True)  # fmt: skip
        memory = memory_rows(name, gguf, peer, threads, servers)
    finally:
        for server in servers.values():
            server.stop()
    rows = []
    nan = float("nan")
    for concurrency in levels:
        median = {
            who: {
                key: statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]
                for key in METRICS
            }
            if (runs := results.get((who, concurrency)))
            else dict.fromkeys(METRICS, nan)
            for who in servers
        }
        ours = median["nanoserve"]
        best = max(PEERS, key=lambda who: nan_last(median[who]["output_tok_s"]))
        theirs = median[best]
        rows.append(
            {
                "concurrency": concurrency,
                "valid_rounds": "/".join(
                    str(len(results.get((who, concurrency), []))) for who in servers
                ),
                "nanoserve_tok_s": ours["output_tok_s"],
                **{
                    f"{who.replace('llama.cpp ', 'llamacpp_')}_tok_s": median[who]["output_tok_s"]
                    for who in PEERS
                },
                "best_peer": best.removeprefix("llama.cpp "),
                "ratio": ours["output_tok_s"] / theirs["output_tok_s"],
                "nanoserve_ttft_p50_s": ours["ttft_p50_s"],
                "llamacpp_ttft_p50_s": theirs["ttft_p50_s"],
                "nanoserve_itl_p50_ms": ours["itl_p50_ms"],
                "llamacpp_itl_p50_ms": theirs["itl_p50_ms"],
                "nanoserve_itl_p99_ms": ours["itl_p99_ms"],
                "llamacpp_itl_p99_ms": theirs["itl_p99_ms"],
            }
        )
    return rows, memory


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
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.peer:
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

"""Load on a running server: TTFT, inter-token latency and aggregate output tok/s.

    python -m benchmarks.serve --url http://127.0.0.1:8000        # a server you started
    python -m benchmarks.serve --start -- --dtype bfloat16        # start one here (loopback)

A bounded async load generator on loopback: for each concurrency (1, 8, 32), 2x that many
streaming completions of 64-token prompts and 128 output tokens (ignore_eos, fixed seed),
at most `concurrency` in flight. Reports p50/p99 TTFT and ITL and output tok/s over the level.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx

from benchmarks.common import table, write_csv


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one_request(
    client: httpx.AsyncClient, prompt: list[int], max_tokens: int
) -> tuple[float, list[float], int]:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
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
            if chunk["choices"] and chunk["choices"][0]["text"]:
                stamps.append(time.perf_counter())
                tokens += 1
    ttft = stamps[0] - started if stamps else float("nan")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return ttft, gaps, tokens


async def level(
    url: str, concurrency: int, requests: int, prompt_len: int, max_tokens: int, seed: int
) -> dict[str, object]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(17, 48000) for _ in range(prompt_len)] for _ in range(requests)]
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "nanoserve.api.cli", "serve", "--port", str(port), *extra]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"server exited: {process.stdout.read() if process.stdout else ''}")
        time.sleep(0.5)
    process.kill()
    raise SystemExit("server did not become ready in 300 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url")
    parser.add_argument(
        "--start", action="store_true", help="start a server here; args after -- go to it"
    )
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    process = None
    url = args.url
    if args.start:
        process, url = start_server(extra)
    if not url:
        raise SystemExit("give --url of a running server, or --start")
    try:
        rows = []
        for concurrency in (int(c) for c in args.levels.split(",")):
            rows.append(
                asyncio.run(
                    level(
                        url,
                        concurrency,
                        2 * concurrency,
                        args.prompt_len,
                        args.max_tokens,
                        args.seed,
                    )
                )
            )
            print(table(rows[-1:], f"concurrency {concurrency}"), flush=True)
        title = f"serve: {args.prompt_len}-token prompts, {args.max_tokens} output tokens {' '.join(extra)}"
        print(table(rows, title))
        print("wrote", write_csv(f"serve{args.tag}.csv", rows))
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


if __name__ == "__main__":
    main()

"""Load on a running server: TTFT, inter-token latency and aggregate output tok/s.

    python -m benchmarks.serve --url http://127.0.0.1:8000        # a server you started
    python -m benchmarks.serve --start -- --dtype bfloat16        # start one here (loopback)
    python -m benchmarks.serve --peer [--rounds 3] [-- nanoserve flags]

A bounded async load generator on loopback: for each concurrency (1, 8, 32), 2x that many
streaming completions of 64-token prompts (distinct random token ids) and 128 output tokens
(ignore_eos, fixed seed), at most `concurrency` in flight. Reports p50/p99 TTFT and ITL and
output tok/s over the level.

--peer starts llama.cpp's `llama-server -np 32` (benchmarks/peer.py finds it) and `nanoserve
serve` on free loopback ports, runs every level on both, alternating which goes first, for
--rounds rounds, and prints the medians and the ratios nanoserve / llama.cpp.
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
import tempfile
import time

import httpx

from benchmarks.common import table, write_csv
from benchmarks.peer import Peer


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


def wait_ready(process: subprocess.Popen, url: str, what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}; see its log")
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"{what} did not become ready in {timeout_s:.0f} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "nanoserve.api.cli", "serve", "--port", str(port), *extra]
    # A log file, not a pipe: nobody reads a pipe while the load runs, and a full one blocks.
    log = tempfile.NamedTemporaryFile("w+", prefix="nanoserve-", suffix=".log", delete=False)  # noqa: SIM115 (the server holds it)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(process, url, "nanoserve")
    return process, url


def start_peer(peer: Peer, gguf: str, threads: int) -> tuple[subprocess.Popen, str]:
    """llama-server with 32 slots sharing one 16k-token K/V cache (FACTS' configuration)."""
    port = free_port()
    command = [
        peer.binary("llama-server"), "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
        "-t", str(threads), "-tb", str(threads), "-c", "16384", "-np", "32", "-kvu",
        "--no-webui",
    ]  # fmt: skip
    log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)  # noqa: SIM115 (the server holds it)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    print(f"llama-server log: {log.name}")
    wait_ready(process, url, "llama-server")
    return process, url


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def side_by_side(args: argparse.Namespace, extra: list[str]) -> None:
    from benchmarks.common import cpu_line, pin_threads
    from benchmarks.peer import find_peer
    from nanoserve.runtime.loading.embedded import embedded_model_path

    threads = pin_threads()
    print(cpu_line())
    gguf = embedded_model_path()
    peer = find_peer(gguf)
    if peer is None:
        return
    print(f"llama.cpp backend: {peer.backend} {peer.note}".rstrip())
    ours_process, ours_url = start_server(["--max-batch", "32", "--max-model-len", "1024", *extra])
    peer_process, peer_url = start_peer(peer, str(gguf), threads)
    servers = {"nanoserve": ours_url, "llama.cpp": peer_url}
    results: dict[tuple[str, int], list[dict[str, object]]] = {}
    try:
        for round_ in range(args.rounds):
            for concurrency in (int(c) for c in args.levels.split(",")):
                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                for name in order:
                    row = asyncio.run(
                        level(
                            servers[name],
                            concurrency,
                            2 * concurrency,
                            args.prompt_len,
                            args.max_tokens,
                            args.seed + round_,
                        )
                    )
                    results.setdefault((name, concurrency), []).append(row)
                    print(f"round {round_ + 1} {name:>9} c={concurrency}: "
                          f"{row['output_tok_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_s']:.3f} s",
                          flush=True)  # fmt: skip
    finally:
        stop(ours_process)
        stop(peer_process)
    rows = []
    for concurrency in (int(c) for c in args.levels.split(",")):
        median = {
            name: {
                key: statistics.median(float(r[key]) for r in results[(name, concurrency)])  # type: ignore[arg-type]
                for key in ("output_tok_s", "ttft_p50_s", "itl_p50_ms")
            }
            for name in servers
        }
        ours, theirs = median["nanoserve"], median["llama.cpp"]
        rows.append(
            {
                "concurrency": concurrency,
                "nanoserve_tok_s": ours["output_tok_s"],
                "llamacpp_tok_s": theirs["output_tok_s"],
                "ratio": ours["output_tok_s"] / theirs["output_tok_s"],
                "nanoserve_ttft_p50_s": ours["ttft_p50_s"],
                "llamacpp_ttft_p50_s": theirs["ttft_p50_s"],
                "nanoserve_itl_p50_ms": ours["itl_p50_ms"],
                "llamacpp_itl_p50_ms": theirs["itl_p50_ms"],
            }
        )
    title = (
        f"serve, side by side: {args.prompt_len}-token prompts, {args.max_tokens} output tokens,"
        f" median of {args.rounds} rounds; nanoserve {' '.join(extra) or '(defaults)'}"
    )
    print(table(rows, title))
    print("wrote", write_csv(f"serve_peer{args.tag}.csv", rows))


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
    parser.add_argument("--peer", action="store_true", help="side by side with llama-server")
    parser.add_argument("--rounds", type=int, default=3, help="with --peer: rounds per level")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.peer:
        side_by_side(args, extra)
        return
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

"""Load on a running server: TTFT, inter-token latency and aggregate output tok/s.

    python -m benchmarks.serve --url http://127.0.0.1:8000        # a server you started
    python -m benchmarks.serve --start -- --dtype bfloat16        # start one here (loopback)
    python -m benchmarks.serve --peer [--models qwen2.5-coder-0.5b] [--rounds 3] [-- flags]

A bounded async load generator on loopback: for each concurrency (1, 8, 32), 2x that many
streaming completions of 64-token prompts (distinct random token ids) and 64 output tokens
(ignore_eos, fixed seed), at most `concurrency` in flight. Reports p50/p99 TTFT and ITL and
output tok/s over the level.

--peer runs the model set (benchmarks/models.py), one model at a time: llama.cpp's
`llama-server -np 32 -kvu -c 16384` (benchmarks/peer.py finds it) and `nanoserve serve` with a
K/V pool of the same 16,384 tokens, on free loopback ports; every level on both, alternating
which goes first, for --rounds rounds. It prints per model the medians and the ratios
nanoserve / llama.cpp, each server's time to a 200 from /health after its process started,
and its RSS once the load has run.
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
from pathlib import Path

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


def wait_ready(process: subprocess.Popen, url: str, what: str, timeout_s: float = 300) -> float:
    """Seconds from now until /health answers 200 (the caller started the process just before)."""
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    # One client for every poll: httpx.get builds a client (and its TLS context) per call, ~37 ms
    # of CPU each here, so polling every 50 ms took ~40% of a core from the booting server, whose
    # boot times its steps (its prefill budget then priced them 2x too slow).
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(url + "/health").status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                raise SystemExit(f"{what} exited with {process.returncode}; see its log")
            time.sleep(0.05)
    process.kill()
    raise SystemExit(f"{what} did not become ready in {timeout_s:.0f} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(process: subprocess.Popen) -> float:
    """The process's resident set now (file pages it maps included, as for llama.cpp's mmap)."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_server(extra: list[str]) -> tuple[subprocess.Popen, str, float]:
    port = free_port()
    command = [sys.executable, "-m", "nanoserve.api.cli", "serve", "--port", str(port), *extra]
    # A log file, not a pipe: nobody reads a pipe while the load runs, and a full one blocks.
    log = tempfile.NamedTemporaryFile("w+", prefix="nanoserve-", suffix=".log", delete=False)  # noqa: SIM115 (the server holds it)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    print(f"nanoserve log: {log.name}")
    return process, url, wait_ready(process, url, "nanoserve")


def start_peer(peer: Peer, gguf: str, threads: int) -> tuple[subprocess.Popen, str, float]:
    """llama-server with 32 slots sharing one 16k-token K/V cache (FACTS' configuration)."""
    port = free_port()
    command = [
        peer.binary("llama-server"), "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
        "-t", str(threads), "-tb", str(threads), "-c", str(PEER_CONTEXT), "-np", "32", "-kvu",
        "--no-webui",
    ]  # fmt: skip
    log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)  # noqa: SIM115 (the server holds it)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    print(f"llama-server log: {log.name}")
    return process, url, wait_ready(process, url, "llama-server")


def kv_budget_for(gguf: Path, tokens: int) -> int:
    """Bytes of a bf16 K/V pool of `tokens` slots for this model, and the sink slot."""
    from nanoserve.runtime.loading.checkpoint import load_checkpoint

    cfg = load_checkpoint(gguf).config
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    return per_token * (tokens + 1)


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


PEER_CONTEXT = 16384  # llama-server's unified K/V cache, and nanoserve's pool, in tokens
METRICS = ("output_tok_s", "ttft_p50_s", "itl_p50_ms", "itl_p99_ms")


def side_by_side(args: argparse.Namespace, extra: list[str]) -> None:
    from benchmarks.common import cpu_line, pin_threads
    from benchmarks.models import served_models
    from benchmarks.peer import find_peer

    threads = pin_threads()
    print(cpu_line())
    for bench in served_models(args.models):
        peer = find_peer(bench.path)
        if peer is None:
            return
        print(f"{bench.name}: llama.cpp backend {peer.backend} {peer.note}".rstrip())
        rows, boot = model_side_by_side(bench.name, bench.path, peer, threads, args, extra)
        title = (
            f"serve, side by side, {bench.name}: {args.prompt_len}-token prompts,"
            f" {args.max_tokens} output tokens, median of {args.rounds} rounds;"
            f" nanoserve {' '.join(extra) or '(defaults)'}"
        )
        print(table(rows, title))
        print(table([boot], f"{bench.name}: ready after (s) and RSS once loaded (MiB)"))
        print("wrote", write_csv(f"serve_peer_{bench.name}{args.tag}.csv", rows))


def model_side_by_side(
    name: str,
    gguf: Path,
    peer: Peer,
    threads: int,
    args: argparse.Namespace,
    extra: list[str],
) -> tuple[list[dict[str, object]], dict[str, object]]:
    budget = kv_budget_for(gguf, PEER_CONTEXT)
    flags = [str(gguf), "--max-batch", "32", "--max-model-len", "1024"]
    flags += ["--kv-budget", str(budget), *extra]
    ours_process, ours_url, ours_ready = start_server(flags)
    peer_process, peer_url, peer_ready = start_peer(peer, str(gguf), threads)
    servers = {"nanoserve": ours_url, "llama.cpp": peer_url}
    levels = [int(c) for c in args.levels.split(",")]
    results: dict[tuple[str, int], list[dict[str, object]]] = {}
    try:
        for round_ in range(args.rounds):
            for concurrency in levels:
                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                for who in order:
                    row = asyncio.run(
                        level(
                            servers[who],
                            concurrency,
                            2 * concurrency,
                            args.prompt_len,
                            args.max_tokens,
                            args.seed + round_,
                        )
                    )
                    results.setdefault((who, concurrency), []).append(row)
                    print(f"round {round_ + 1} {who:>9} c={concurrency}: "
                          f"{row['output_tok_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_s']:.3f} s, "
                          f"ITL p99 {row['itl_p99_ms']:.0f} ms", flush=True)  # fmt: skip
        boot = {
            "model": name,
            "nanoserve_ready_s": ours_ready,
            "llamacpp_ready_s": peer_ready,
            "ready_ratio": ours_ready / peer_ready,
            "nanoserve_rss_mib": rss_mib(ours_process),
            "llamacpp_rss_mib": rss_mib(peer_process),
            "rss_ratio": rss_mib(ours_process) / rss_mib(peer_process),
        }
    finally:
        stop(ours_process)
        stop(peer_process)
    rows = []
    for concurrency in levels:
        median = {
            who: {
                key: statistics.median(float(r[key]) for r in results[(who, concurrency)])  # type: ignore[arg-type]
                for key in METRICS
            }
            for who in servers
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
                "nanoserve_itl_p99_ms": ours["itl_p99_ms"],
                "llamacpp_itl_p99_ms": theirs["itl_p99_ms"],
            }
        )
    return rows, boot


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
    process = None
    url = args.url
    if args.start:
        process, url, _ = start_server(extra)
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

"""nanoserve beside llama.cpp's server on one model: `python -m benchmarks.serve --peer`.

Three servers, with the same thread count: `nanoserve serve` with a K/V pool of 16,384 tokens,
and llama.cpp's `llama-server -np 32 -c 16384` in both of its cache modes, the split per-slot
default and `-kvu` (benchmarks/peer.py). Every level (benchmarks/serve.py) runs on each, for
--rounds rounds, in one of two schedules:

- together (the default): all three up at once on free loopback ports, each level on each
  server in turn, the order reversed every round, so the machine's drift falls on all of them;
- in turn (`--in-turn`, and automatic for a file larger than a sixth of the machine's memory,
  where three servers' copies would not fit): one server up at a time runs every level, then
  stops, and the next starts; the order of the servers is reversed every round.

Per model it prints the medians, each level's ratio against the better llama.cpp mode (both
printed), each one's tok/s as a share of the memory roofline (benchmarks/roofline.py), each server's time to a 200 from /health after its process started (nanoserve's boot
is cold: an empty timing cache, as a file's first boot finds it), and, after its first load,
each one's RSS beside what it holds reserved (llama-server's K/V and compute buffers,
zero-filled at start; nanoserve's pool, paged in as it is used).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import nan_last, table, write_csv
from benchmarks.peer import CACHE_MODES, Peer, reserved_mib, start_llama_server
from benchmarks.roofline import Roofline, bandwidth_line, read_bandwidth, step_bytes
from benchmarks.serve import PEER_CONTEXT, kv_budget_for, level, short_note
from benchmarks.servers import Server, bench_threads, nanoserve_reserved_mib, start_nanoserve

METRICS = ("output_tok_s", "ttft_p50_s", "itl_p50_ms", "itl_p99_ms")
PEERS = tuple(f"llama.cpp {mode}" for mode in CACHE_MODES)
SERVERS = ("nanoserve", *PEERS)
IN_TURN_SHARE = 6  # a file past 1/6 of memory: three servers' copies would not fit together

Results = dict[tuple[str, int], list[dict[str, object]]]
Memory = dict[str, tuple[float, float, dict[str, float]]]  # who -> ready_s, RSS, reserved


def side_by_side(args: argparse.Namespace, extra: list[str]) -> None:
    from benchmarks.common import cpu_line, pin_threads
    from benchmarks.models import served_models
    from benchmarks.peer import find_peer

    threads = pin_threads(bench_threads())
    print(cpu_line())
    print(f"threads: {threads} for every server (nanoserve --threads, llama-server -t/-tb)")
    bandwidth = read_bandwidth()
    print(bandwidth_line(bandwidth, threads))
    for bench in served_models(args.models):
        peer = find_peer(bench.path)
        if peer is None:
            return
        print(f"{bench.name}: llama.cpp backend {peer.backend} {peer.note}".rstrip())
        in_turn = args.in_turn or bench.path.stat().st_size * IN_TURN_SHARE > memory_bytes()
        schedule = "in turn (one server up at a time)" if in_turn else "together, alternating"
        print(f"{bench.name}: served {schedule}")
        os.environ["NANOSERVE_TIMING_CACHE"] = tempfile.mkdtemp(prefix="timings-")
        run = serve_in_turn if in_turn else serve_together
        results, memory = run(bench.path, peer, threads, args, extra)
        levels = [int(c) for c in args.levels.split(",")]
        roofline = Roofline(bandwidth, step_bytes(bench.path))
        rows = ratio_rows(results, levels, roofline, args.prompt_len + args.max_tokens // 2)
        title = (
            f"serve, side by side ({schedule}), {bench.name}: {args.prompt_len}-token prompts,"
            f" {args.max_tokens} output tokens, median of the valid rounds of {args.rounds};"
            f" ratio against the better llama.cpp cache mode; nanoserve"
            f" {' '.join(extra) or '(defaults)'}"
        )
        print(table(rows, title))
        memory_table = memory_rows(bench.name, bench.path, peer, threads, memory)
        print(
            table(
                memory_table,
                f"{bench.name}: ready after start (s; nanoserve cold: an empty timing cache),"
                " and after the load: RSS and what each holds reserved (MiB)",
            )
        )
        print("wrote", write_csv(f"serve_peer_{bench.name}{args.tag}.csv", rows))
        print("wrote", write_csv(f"serve_peer_memory_{bench.name}{args.tag}.csv", memory_table))


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def start(who: str, gguf: Path, peer: Peer, threads: int, extra: list[str]) -> Server:
    """nanoserve, or llama-server in one cache mode."""
    if who == "nanoserve":
        budget = kv_budget_for(gguf, PEER_CONTEXT)
        flags = [str(gguf), "--max-batch", "32", "--max-model-len", "1024"]
        return start_nanoserve([*flags, "--kv-budget", str(budget), *extra], threads)
    mode = who.removeprefix("llama.cpp ")
    return start_llama_server(
        peer, gguf, threads, cache_mode=mode, context=PEER_CONTEXT, parallel=32
    )


def run_level(
    who: str, url: str, concurrency: int, round_: int, args: argparse.Namespace, results: Results
) -> None:
    time.sleep(1.0)  # llama.cpp's threads poll a while after their work
    row = asyncio.run(
        level(
            url, concurrency, 2 * concurrency, args.prompt_len, args.max_tokens, args.seed + round_
        )
    )
    note = short_note(row, args.max_tokens)
    if not note:
        results.setdefault((who, concurrency), []).append(row)
    print(f"round {round_ + 1} {who:>17} c={concurrency}: "
          f"{row['output_tok_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_s']:.3f} s, "
          f"ITL p99 {row['itl_p99_ms']:.0f} ms {note}".rstrip(), flush=True)  # fmt: skip


def serve_together(
    gguf: Path, peer: Peer, threads: int, args: argparse.Namespace, extra: list[str]
) -> tuple[Results, Memory]:
    servers: dict[str, Server] = {}
    results: Results = {}
    try:
        for who in SERVERS:
            servers[who] = start(who, gguf, peer, threads, extra)
        for round_ in range(args.rounds):
            for concurrency in (int(c) for c in args.levels.split(",")):
                order = SERVERS if round_ % 2 == 0 else tuple(reversed(SERVERS))
                for who in order:
                    run_level(who, servers[who].url, concurrency, round_, args, results)
        memory = {who: after_load(server) for who, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    return results, memory


def serve_in_turn(
    gguf: Path, peer: Peer, threads: int, args: argparse.Namespace, extra: list[str]
) -> tuple[Results, Memory]:
    results: Results = {}
    memory: Memory = {}
    for round_ in range(args.rounds):
        for who in SERVERS if round_ % 2 == 0 else tuple(reversed(SERVERS)):
            server = start(who, gguf, peer, threads, extra)
            try:
                for concurrency in (int(c) for c in args.levels.split(",")):
                    run_level(who, server.url, concurrency, round_, args, results)
                if who not in memory:  # its first (cold) start's, said now: a cut run keeps it
                    memory[who] = after_load(server)
                    ready_s, rss, _ = memory[who]
                    print(f"{who}: ready {ready_s:.1f} s, RSS {rss:,.0f} MiB", flush=True)
            finally:
                server.stop()
    return results, memory


def after_load(server: Server) -> tuple[float, float, dict[str, float]]:
    """Ready time, RSS after the load, and nanoserve's reserved memory (the peer's is read by a
    boot of its own, once every server is down)."""
    reserved: dict[str, float] = {}
    if server.who == "nanoserve":
        label = "K/V pool and a hybrid's state with its checkpoints (paged in as used)"
        reserved[label] = nanoserve_reserved_mib(server.url)
    return server.ready_s, server.rss_mib(), reserved


def memory_rows(
    name: str, gguf: Path, peer: Peer, threads: int, memory: Memory
) -> list[dict[str, object]]:
    rows = []
    for who, (ready_s, rss, reserved) in memory.items():
        if who != "nanoserve":
            buffers = reserved_mib(
                peer, gguf, threads, cache_mode=who.removeprefix("llama.cpp "),
                context=PEER_CONTEXT, parallel=32,
            )  # fmt: skip
            reserved = {f"{kind} buffer (allocated at start)": mib for kind, mib in buffers.items()}
        rows.append(
            {
                "model": name,
                "server": who,
                "ready_s": ready_s,
                "rss_mib": rss,
                "reserved_mib": sum(reserved.values()),
                "reserved": "; ".join(f"{k} {v:,.0f}" for k, v in reserved.items()),
            }
        )
    return rows


def median_of(runs: list[dict[str, object]]) -> dict[str, float]:
    return {key: statistics.median(float(r[key]) for r in runs) for key in METRICS}  # type: ignore[arg-type]


def ratio_rows(
    results: Results, levels: list[int], roofline: Roofline, context: int
) -> list[dict[str, object]]:
    """Per level: each server's medians, nanoserve's ratio to the better llama.cpp mode, and
    both as a share of the decode limit at `concurrency` rows of `context` positions (a
    level's tok/s includes its prompts' time: the share is a floor)."""
    nan = float("nan")
    rows: list[dict[str, object]] = []
    for concurrency in levels:
        median = {
            who: median_of(runs)
            if (runs := results.get((who, concurrency)))
            else dict.fromkeys(METRICS, nan)
            for who in SERVERS
        }
        ours = median["nanoserve"]
        best = max(PEERS, key=lambda who: nan_last(median[who]["output_tok_s"]))
        theirs = median[best]
        rows.append(
            {
                "concurrency": concurrency,
                "valid_rounds": "/".join(
                    str(len(results.get((who, concurrency), []))) for who in SERVERS
                ),
                "nanoserve_tok_s": ours["output_tok_s"],
                **{
                    f"{who.replace('llama.cpp ', 'llamacpp_')}_tok_s": median[who]["output_tok_s"]
                    for who in PEERS
                },
                "best_peer": best.removeprefix("llama.cpp "),
                "ratio": ours["output_tok_s"] / theirs["output_tok_s"],
                "limit_tok_s": (limit := roofline.limit(concurrency, context)),
                "nanoserve_share": ours["output_tok_s"] / limit,
                "llamacpp_share": theirs["output_tok_s"] / limit,
                "nanoserve_ttft_p50_s": ours["ttft_p50_s"],
                "llamacpp_ttft_p50_s": theirs["ttft_p50_s"],
                "nanoserve_itl_p50_ms": ours["itl_p50_ms"],
                "llamacpp_itl_p50_ms": theirs["itl_p50_ms"],
                "nanoserve_itl_p99_ms": ours["itl_p99_ms"],
                "llamacpp_itl_p99_ms": theirs["itl_p99_ms"],
            }
        )
    return rows

"""Embeddings per second against llama.cpp's `llama-server --embeddings`, same file, same run.

    python -m benchmarks.embed [--models bge-base-shape,qwen3-embedding-0.6b-shape]
        [--batches 1,32] [--tokens 128] [--inputs 32] [--rounds 3]

Each model is a shape-true GGUF with random Q8_0 weights (embed_shapes.py): a bge-base-sized
BERT (CLS pooling) and a Qwen3-Embedding-0.6B-sized decoder (last-token pooling). Both servers
get the same threads; llama-server runs 32 slots in both cache modes (`-np 32`, split, and
`-kvu`), its physical batch raised to hold a batch of inputs whole (`-ub`/`-b`, as its
`--embeddings` needs for a non-causal model), each level's ratio taken against its faster mode.

A level sends `--inputs` inputs as POST /v1/embeddings one after another, each with `batch`
inputs of `tokens` token ids (distinct per request, level and round; a BERT input framed by [CLS] and
[SEP]). Embeddings/s counts the vectors returned, tokens/s the `usage.prompt_tokens` each
server reports; every answer is checked to hold `batch` vectors of the model's width. The rounds
alternate the servers' order; the medians are reported, with each server's RSS after the load
and what it holds reserved (nanoserve's K/V pool, none for an encoder; llama-server's buffers),
and the two servers' answers to the same first request of each level held against each other
(`min_cosine`: they read the same file, so a low one would mean one of them computes another
model).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import httpx

from benchmarks.common import cpu_line, nan_last, table, write_csv
from benchmarks.embed_shapes import WRITERS, embedder_gguf
from benchmarks.peer import CACHE_MODES, Peer, find_peer, reserved_mib, start_llama_server
from benchmarks.servers import Server, bench_threads, nanoserve_reserved_mib, start_nanoserve

WIDTH = {"bge-base-shape": 768, "qwen3-embedding-0.6b-shape": 1024}
POOLING = {"bge-base-shape": "cls", "qwen3-embedding-0.6b-shape": "last"}
CLS, SEP = 2, 3  # the BERT shape's specials


def inputs(model: str, batch: int, tokens: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    if model == "bge-base-shape":
        return [
            [CLS, *(rng.randrange(5, 30522) for _ in range(tokens - 2)), SEP] for _ in range(batch)
        ]
    return [[rng.randrange(300, 151000) for _ in range(tokens)] for _ in range(batch)]


def run_level(
    server: Server, model: str, batch: int, args: argparse.Namespace, seed: int
) -> tuple[dict[str, float], list[list[float]]]:
    """One level on one server: embeddings/s and prompt tokens/s over its requests, and the
    first request's vectors (to hold against the other server's)."""
    vectors = prompt_tokens = 0
    first: list[list[float]] = []
    with httpx.Client(timeout=600) as client:
        name = client.get(f"{server.url}/v1/models").json()["data"][0]["id"]
        started = time.perf_counter()
        for r in range(max(1, args.inputs // batch)):
            body = {"model": name, "input": inputs(model, batch, args.tokens, seed * 1000 + r)}
            answer = client.post(f"{server.url}/v1/embeddings", json=body)
            answer.raise_for_status()
            data = answer.json()
            widths = {len(d["embedding"]) for d in data["data"]}
            if len(data["data"]) != batch or widths != {WIDTH[model]}:
                raise SystemExit(f"{server.who}: {len(data['data'])} vectors of {widths}")
            vectors += batch
            first = first or [d["embedding"] for d in data["data"]]
            prompt_tokens += int(data["usage"]["prompt_tokens"])
        seconds = time.perf_counter() - started
    level = {"emb_s": vectors / seconds, "tok_s": prompt_tokens / seconds,
             "tokens": prompt_tokens / vectors}  # fmt: skip
    return level, first


def bench_model(
    model: str, peer: Peer | None, args: argparse.Namespace, threads: int
) -> list[dict]:
    gguf = embedder_gguf(model, args.dir)
    batches = [int(b) for b in args.batches.split(",")]
    slots = max(batches)
    who = ["ours"]
    servers = {"ours": lambda: start_nanoserve([str(gguf), "--max-batch", str(slots)], threads)}
    extra = ("--embeddings", "--pooling", POOLING[model], "-ub", str(slots * args.tokens),
             "-b", str(slots * args.tokens))  # fmt: skip
    if peer is not None:
        for mode in CACHE_MODES:
            who.append(f"llama {mode}")
            servers[f"llama {mode}"] = lambda mode=mode: start_llama_server(
                peer, gguf, threads, cache_mode=mode, context=slots * 512, parallel=slots,
                extra=extra,
            )  # fmt: skip
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    memory: dict[str, tuple[float, float]] = {}
    answers: dict[tuple[str, int], list[list[float]]] = {}  # round 0's first vectors
    for round_ in range(args.rounds):
        for name in who if round_ % 2 == 0 else list(reversed(who)):
            server = servers[name]()
            try:
                for batch in batches:
                    level, first = run_level(server, model, batch, args, round_ * 100 + batch)
                    results.setdefault((name, batch), []).append(level)
                    if round_ == 0:
                        answers[(name, batch)] = first
                    print(f"{model} {name:>13} batch {batch:>2}: {level['emb_s']:7.1f} emb/s"
                          f" {level['tok_s']:8.0f} tok/s", flush=True)  # fmt: skip
                reserved = nanoserve_reserved_mib(server.url) if name == "ours" else float("nan")
                memory[name] = (server.rss_mib(), reserved)
            finally:
                server.stop()
    if peer is not None:
        for mode in CACHE_MODES:
            buffers = reserved_mib(peer, gguf, threads, cache_mode=mode, context=slots * 512,
                                   parallel=slots, extra=extra)  # fmt: skip
            rss, _ = memory[f"llama {mode}"]
            memory[f"llama {mode}"] = (rss, sum(buffers.values()))
    rows = []
    for batch in batches:

        def med(name: str, key: str, batch: int = batch) -> float:
            runs = results.get((name, batch), [])
            return statistics.median(r[key] for r in runs) if runs else float("nan")

        row: dict[str, object] = {"model": model, "batch": batch, "tokens": args.tokens,
                                  "ours_emb_s": med("ours", "emb_s"),
                                  "ours_tok_s": med("ours", "tok_s")}  # fmt: skip
        peers = [name for name in who if name != "ours"]
        for name in peers:
            row[f"{name}_emb_s"] = med(name, "emb_s")
        if peers:
            best = max(peers, key=lambda n: nan_last(med(n, "emb_s")))
            row.update(llama_best=best, ratio=med("ours", "emb_s") / med(best, "emb_s"))
            row["min_cosine"] = min(
                _cosine(a, b)
                for name in peers
                for a, b in zip(answers[("ours", batch)], answers[(name, batch)], strict=True)
            )
        for name in who:
            rss, reserved = memory[name]
            row[f"{name}_rss_mib"] = rss
            row[f"{name}_reserved_mib"] = reserved
        rows.append(row)
    return rows


def _cosine(a: list[float], b: list[float]) -> float:
    """Both servers normalize, so a dot product (each re-normalized, to be sure)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(WRITERS))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--inputs", type=int, default=32, help="per level")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--tag", default="", help="appended to the CSV's name (e.g. _avx2)")
    args = parser.parse_args()
    if args.dir is None:
        from benchmarks.models import default_dir

        args.dir = default_dir()
    threads = bench_threads()
    print(cpu_line(), flush=True)
    rows = []
    for model in args.models.split(","):
        peer = None if args.no_peer else find_peer(embedder_gguf(model, args.dir))
        rows += bench_model(model, peer, args, threads)
    print(table(rows, f"embeddings, {args.tokens}-token inputs, median of {args.rounds} rounds"))
    print(write_csv(f"embed{args.tag}", rows))


if __name__ == "__main__":
    main()

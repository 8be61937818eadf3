"""Speculative decoding, side by side: nanoserve and llama.cpp, each at its best, with and without.

    python -m benchmarks.spec [--models smollm2-135m,qwen2.5-coder-0.5b] [--levels 1,4,32]
                              [--rounds 3] [--max-tokens 128] [--spec-types ...]
                              [--peer-cache split,unified] [--tag _avx2]
    python -m benchmarks.spec --models qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b

Per model, nanoserve without speculation and with `--speculative-config ngram` (or, with
`--draft`, `--draft-model`), and llama-server in every configuration asked for: without
speculation, and with each of its speculation types (`ngram-simple`, `ngram-map-k`,
`ngram-map-k4v`, `ngram-mod`, `ngram-cache`, each at its own defaults, drafts up to 8 as ours;
with `--draft`, `-md` drafting up to 5, as ours), each in both of its cache modes (the split
per-slot default of `-np 32`, and `-kvu`; a 32,768-token cache, so a split slot holds 1,024).
Every server gets the same threads. Servers are run one configuration at a time (all of them up
at once would not fit beside each other on small machines): each runs every round of every
level; the order of configurations alternates per round only within nanoserve's pair.

Two workloads of chat requests, greedy, `ignore_eos`, exactly `--max-tokens` each:

- repeat-heavy: a Python function from the standard library (a distinct one per request) and
  the instruction to write it out again with a new name and a docstring: most of the answer
  quotes the prompt;
- chat: a distinct short writing prompt per request: free text, little to look up.

Each level sends `concurrency` requests (at least 2) at once and reports output tok/s (the
usage's completion tokens over the level's wall time); a request whose usage counts fewer than
`--max-tokens` invalidates its round (said, and left out). Whether a server speculated is read
from its own counters (nanoserve's /metrics; llama-server's `llamacpp:spec_decode_*` on
`--metrics`, cross-checked against the answers' `timings.draft_n`): a configuration that drafted
nothing is reported as "did not speculate" and never enters a ratio. The ratios: ours with /
ours without; our best (with or without) / llama.cpp's best (any configuration that ran,
speculating or plain); our best / llama.cpp without speculation at its better cache mode.
Greedy outputs of nanoserve with and without speculation are compared request by request: they
must be equal.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import inspect
import re
import statistics
import sys
import time
from pathlib import Path

import httpx

from benchmarks.common import cpu_line, nan_last, pin_threads, table, write_csv
from benchmarks.peer import CACHE_MODES, Peer, start_llama_server
from benchmarks.peer import spec_counters as peer_counters
from benchmarks.serve import kv_budget_for
from benchmarks.servers import Server, bench_threads, start_nanoserve

# Standard-library modules whose functions the repeat-heavy prompts quote: enough of them that
# every request of a run quotes its own (3 rounds of levels 1, 4 and 32 take 114).
MODULES = (
    "textwrap", "json.encoder", "shlex", "fractions", "difflib", "statistics", "heapq",
    "posixpath", "ntpath", "genericpath", "inspect", "calendar", "base64", "csv", "string",
    "tokenize", "ast", "dis", "pprint", "random", "bisect", "functools", "copy", "glob",
)  # fmt: skip
TOPICS = ("a lighthouse", "the first snow", "a city market", "an old violin", "a desert road",
          "a summer storm", "a chess game", "a mountain lake")  # fmt: skip
FORMS = ("a short poem", "a paragraph of advice", "a short story opening", "a product review")
CONTEXT = 16384  # nanoserve's pool, in tokens
PEER_CONTEXT = 32768  # llama-server's cache: 1,024 tokens a slot when split 32 ways
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def functions(count: int) -> list[tuple[str, str]]:
    """(name, source) of `count` standard-library functions of 8..30 lines, fixed order (past
    the modules' supply, they come round again)."""
    found = []
    for module_name in MODULES:
        module = __import__(module_name, fromlist=["_"])
        tree = ast.parse(inspect.getsource(module))
        source = inspect.getsource(module).splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and 8 <= node.end_lineno - node.lineno <= 30:  # type: ignore[operator]
                text = "\n".join(source[node.lineno - 1 : node.end_lineno])
                found.append((node.name, text))
    if len(found) < count:
        found = (found * (count // len(found) + 1))[:count]
    return found[:count]


def prompts(workload: str, count: int, start: int = 0) -> list[str]:
    """The workload's prompts start..start+count: each server is sent the same ones, and no
    prompt twice in a run (a repeated one would be a prefix-cache hit)."""
    if workload == "repeat":
        return [
            f"Here is a Python function:\n\n```python\n{code}\n```\n\nWrite the same function"
            f" again, unchanged except that it is renamed to `{name}_v2`. Output only the code."
            for name, code in functions(start + count)[start:]
        ]
    return [
        f"Write {FORMS[i % len(FORMS)]} about {TOPICS[(i // len(FORMS)) % len(TOPICS)]}"
        f" (variation {i // (len(FORMS) * len(TOPICS)) + 1})."
        for i in range(start, start + count)
    ]


def level_sizes(levels: list[int]) -> list[int]:
    """Requests per level: its concurrency, at least 2."""
    return [max(2, c) for c in levels]


async def one(client: httpx.AsyncClient, prompt: str, max_tokens: int, model: str) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    response = await client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise SystemExit(f"{response.status_code} from {client.base_url}: {response.text[:300]}")
    return response.json()


async def level(url: str, texts: list[str], concurrency: int, max_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=0)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def bounded(prompt: str) -> dict:
            async with gate:
                return await one(client, prompt, max_tokens, model)

        started = time.perf_counter()
        answers = await asyncio.gather(*(bounded(p) for p in texts))
        seconds = time.perf_counter() - started
    counts = [int(a.get("usage", {}).get("completion_tokens", 0)) for a in answers]
    drafted = sum(a.get("timings", {}).get("draft_n", 0) for a in answers)
    accepted = sum(a.get("timings", {}).get("draft_n_accepted", 0) for a in answers)
    return {
        "tok_s": sum(counts) / seconds,
        "short": sum(c < max_tokens for c in counts),  # > 0: the round is invalid
        "texts": [a["choices"][0]["message"]["content"] for a in answers],
        "drafted": drafted,
        "accepted": accepted,
    }


def spec_counters(url: str) -> tuple[float, float]:
    """nanoserve's draft tokens and accepted tokens so far."""
    text = httpx.get(url + "/metrics", timeout=10).text
    values = {}
    for name in ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens"):
        match = re.search(rf"^nanoserve:{name}_total (\S+)$", text, re.MULTILINE)
        values[name] = float(match.group(1)) if match else 0.0
    return values["spec_decode_num_draft_tokens"], values["spec_decode_num_accepted_tokens"]


def peer_configs(types: list[str], cache_modes: list[str], draft: Path | None) -> list[str]:
    """llama-server configurations: "plain <mode>" and "<type> <mode>" for every type asked."""
    kinds = ["plain", *(["draft-simple"] if draft is not None else types)]
    return [f"{kind} {mode}" for kind in kinds for mode in cache_modes]


def peer_flags(kind: str, draft: Path | None, threads: int) -> tuple[str, ...]:
    if kind == "plain":
        return ()
    if kind == "draft-simple":
        assert draft is not None
        # `-md` alone loads the draft but speculates with nothing: this build's --spec-type
        # defaults to none (its counters stayed at 0 in every answer without the type).
        return ("--spec-type", "draft-simple", "-md", str(draft), "--spec-draft-n-max", "5",
                "-td", str(threads), "-tbd", str(threads))  # fmt: skip
    flags = ("--spec-type", kind)
    if kind == "ngram-simple":  # its defaults look up 12-grams; ours 4..2: also our draft size
        flags += ("--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8")
    return (*flags, "--spec-draft-n-max", "8")


def run_levels(
    server: Server,
    who: str,
    args: argparse.Namespace,
    levels: list[int],
    results: dict[tuple[str, str, int], list[dict]],
    counters: object,
    round_: int,
) -> None:
    """Every workload and level on one server for one round, drafts counted by `counters`.
    Round r's prompts follow round r-1's: no server is sent a prompt twice."""
    sizes = level_sizes(levels)
    for workload in ("repeat", "chat"):
        start = round_ * sum(sizes)
        for concurrency, size in zip(levels, sizes, strict=True):
            texts = prompts(workload, size, start)
            start += size
            time.sleep(1.0)  # llama.cpp's threads poll a while after their work
            before = counters(server.url) if counters else (0.0, 0.0)  # type: ignore[operator]
            row = asyncio.run(level(server.url, texts, concurrency, args.max_tokens))
            timings = f" (timings: {row['drafted']:.0f} drafted, {row['accepted']:.0f} accepted)"
            if counters:
                after = counters(server.url)  # type: ignore[operator]
                row["drafted"], row["accepted"] = (
                    a - b for a, b in zip(after, before, strict=True)
                )
            note = ""
            if row["short"]:
                note = f" INVALID: {row['short']} answers short of {args.max_tokens} tokens"
            else:
                results.setdefault((workload, who, concurrency), []).append(row)
            print(f"{workload:>6} c={concurrency:<2} {who:>24}: {row['tok_s']:.1f} tok/s,"
                  f" drafted {row['drafted']:.0f}, accepted {row['accepted']:.0f}"
                  f"{'' if who.startswith('ours') else timings}{note}",
                  flush=True)  # fmt: skip


def run_model(
    name: str, gguf: Path, peer: Peer | None, threads: int, args, draft: Path | None = None
) -> list[dict]:
    budget = kv_budget_for(gguf, CONTEXT)
    flags = [str(gguf), "--max-batch", "32", "--max-model-len", "2048", "--kv-budget", str(budget)]
    spec = ["--draft-model", str(draft)] if draft else ["--speculative-config", "ngram"]
    levels = [int(c) for c in args.levels.split(",")]
    results: dict[tuple[str, str, int], list[dict]] = {}
    ours = {
        "ours": start_nanoserve(flags, threads),
        "ours+spec": start_nanoserve(flags + spec, threads),
    }
    try:
        for round_ in range(args.rounds):
            order = list(ours) if round_ % 2 == 0 else list(reversed(ours))
            for who in order:
                counters = spec_counters if who == "ours+spec" else None
                run_levels(ours[who], who, args, levels, results, counters, round_)
    finally:
        for server in ours.values():
            server.stop()
    configs = []
    if peer is not None:
        types = args.spec_types.split(",") if args.spec_types else list(NGRAM_TYPES)
        configs = peer_configs(types, args.peer_cache.split(","), draft)
        for config in configs:
            kind, mode = config.split()
            server = start_llama_server(
                peer, gguf, threads, cache_mode=mode, context=PEER_CONTEXT, parallel=32,
                extra=("--jinja", *peer_flags(kind, draft, threads)),
            )  # fmt: skip
            try:
                for round_ in range(args.rounds):
                    run_levels(server, config, args, levels, results, peer_counters, round_)
            finally:
                server.stop()
    return summarize(name, draft, levels, results, configs)


def summarize(
    name: str,
    draft: Path | None,
    levels: list[int],
    results: dict[tuple[str, str, int], list[dict]],
    configs: list[str],
) -> list[dict]:
    rows = []
    nan = float("nan")
    for workload in ("repeat", "chat"):
        for concurrency in levels:

            def med(who: str, workload: str = workload, concurrency: int = concurrency) -> float:
                runs = results.get((workload, who, concurrency), [])
                return statistics.median(r["tok_s"] for r in runs) if runs else nan

            runs = results.get((workload, "ours+spec", concurrency), [])
            plain = results.get((workload, "ours", concurrency), [])
            same = sum(
                a == b
                for r, p in zip(runs, plain, strict=False)
                for a, b in zip(r["texts"], p["texts"], strict=True)
            )
            ours_best = max(nan_last(med("ours")), nan_last(med("ours+spec")))
            row = {
                "model": name,
                "speculation": f"draft {draft.name}" if draft else "ngram",
                "workload": workload,
                "streams": concurrency,
                "ours_tok_s": med("ours"),
                "ours_spec_tok_s": med("ours+spec"),
                "spec_gain": med("ours+spec") / med("ours"),
                "ours_acceptance": _rate(runs),
                "identical": f"{same}/{sum(len(r['texts']) for r in runs)}",
            }
            if configs:
                speculated = {}
                for config in configs:
                    peer_runs = results.get((workload, config, concurrency), [])
                    drafted = sum(r["drafted"] for r in peer_runs)
                    if config.startswith("plain") or drafted > 0:
                        speculated[config] = med(config)
                    row[f"llama {config}"] = (
                        f"{med(config):.1f} ({_rate(peer_runs):.0%} of {drafted:.0f})"
                        if drafted
                        else f"{med(config):.1f}"
                        + ("" if config.startswith("plain") else " did not speculate")
                    )
                plain_best = max(
                    (c for c in speculated if c.startswith("plain")),
                    key=lambda c: nan_last(speculated[c]),
                )
                peer_best = max(speculated, key=lambda c: nan_last(speculated[c]))
                row.update(
                    llama_best=peer_best,
                    vs_llama_best=ours_best / speculated[peer_best],
                    vs_llama_plain=ours_best / speculated[plain_best],
                )
            rows.append(row)
    return rows


def _rate(runs: list[dict]) -> float:
    drafted = sum(r["drafted"] for r in runs)
    return sum(r["accepted"] for r in runs) / drafted if drafted else 0.0


def main() -> None:
    from benchmarks.models import served_models
    from benchmarks.peer import find_peer

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--levels", default="1,4,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--draft", help="a model of the set to draft with (default: ngram)")
    parser.add_argument("--spec-types", help=f"llama.cpp's types to run (default: {NGRAM_TYPES})")
    parser.add_argument("--peer-cache", default=",".join(CACHE_MODES), help="split,unified")
    parser.add_argument("--tag", default="", help="appended to the CSV's name (e.g. _avx2)")
    args = parser.parse_args()
    threads = pin_threads(bench_threads())
    print(cpu_line())
    draft = served_models(args.draft)[0].path if args.draft else None
    all_rows = []
    for bench in served_models(args.models):
        peer = None if args.no_peer else find_peer(bench.path)
        rows = run_model(bench.name, bench.path, peer, threads, args, draft)
        print(table(rows, f"speculation, {bench.name}: median of {args.rounds} rounds"))
        all_rows += rows
    name = "spec-draft" if draft else "spec"
    print("wrote", write_csv(f"{name}{args.tag}.csv", all_rows))


if __name__ == "__main__":
    sys.exit(main())

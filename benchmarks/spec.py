"""Speculative decoding, side by side: nanoserve and llama.cpp, each with and without it.

    python -m benchmarks.spec [--models smollm2-135m,qwen2.5-coder-0.5b] [--levels 1,4,32]
                              [--rounds 3] [--max-tokens 128]
    python -m benchmarks.spec --models qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b

Four servers per model, all up at once and run one at a time, alternating the order per round:
nanoserve without speculation, nanoserve `--speculative-config ngram`, llama-server without
and llama-server with its prompt lookup (`--spec-type ngram-simple`, lookup n-gram 3, drafts
up to 8, as ours). With `--draft`, the two that speculate do so with that model of the set as
the draft instead: nanoserve `--draft-model`, llama-server `-md` (both drafting up to 5
tokens, greedy). Two workloads of chat requests, greedy:

- repeat-heavy: a Python function from the standard library (a distinct one per request) and
  the instruction to write it out again with a new name and a docstring: most of the answer
  quotes the prompt;
- chat: a distinct short writing prompt per request: free text, little to look up.

Each level sends `concurrency` requests (at least 2) at once and reports output tok/s (the
usage's completion tokens over the level's wall time), medians over rounds, and the ratios
that issue 25 names: ours with / ours without, and ours with / llama.cpp with. The acceptance
rate is read from each server (nanoserve's /metrics; llama.cpp's `timings`). Greedy outputs of
nanoserve with and without speculation are compared request by request: they must be equal.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import inspect
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import cpu_line, pin_threads, table, write_csv
from benchmarks.peer import Peer
from benchmarks.serve import free_port, kv_budget_for, start_server, stop, wait_ready

MODULES = ("textwrap", "json.encoder", "shlex", "fractions", "difflib", "statistics", "heapq")
TOPICS = ("a lighthouse", "the first snow", "a city market", "an old violin", "a desert road",
          "a summer storm", "a chess game", "a mountain lake")  # fmt: skip
FORMS = ("a short poem", "a paragraph of advice", "a short story opening", "a product review")
CONTEXT = 16384


def functions(count: int) -> list[tuple[str, str]]:
    """(name, source) of `count` standard-library functions of 8..30 lines, fixed order."""
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


def prompts(workload: str, count: int) -> list[str]:
    if workload == "repeat":
        return [
            f"Here is a Python function:\n\n```python\n{code}\n```\n\nWrite the same function"
            f" again, unchanged except that it is renamed to `{name}_v2`. Output only the code."
            for name, code in functions(count)
        ]
    return [
        f"Write {FORMS[i % len(FORMS)]} about {TOPICS[(i // len(FORMS)) % len(TOPICS)]}"
        f" (variation {i // (len(FORMS) * len(TOPICS)) + 1})."
        for i in range(count)
    ]


async def one(client: httpx.AsyncClient, prompt: str, max_tokens: int, model: str) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
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
    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    drafted = sum(a.get("timings", {}).get("draft_n", 0) for a in answers)
    accepted = sum(a.get("timings", {}).get("draft_n_accepted", 0) for a in answers)
    return {
        "tok_s": tokens / seconds,
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


def start_llama(
    peer: Peer, gguf: Path, threads: int, spec: bool, draft: Path | None = None
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        peer.binary("llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-t", str(threads), "-tb", str(threads), "-c", str(CONTEXT), "-np", "32", "-kvu",
        "--no-webui", "--jinja",
    ]  # fmt: skip
    if spec and draft is not None:
        command += ["-md", str(draft), "--spec-draft-n-max", "5", "-td", str(threads)]
    elif spec:
        command += [
            "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
            "--spec-ngram-simple-size-m", "8", "--spec-draft-n-max", "8",
        ]  # fmt: skip
    log = tempfile.NamedTemporaryFile("w+", prefix="llama-spec-", suffix=".log", delete=False)  # noqa: SIM115 (the server holds it)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(process, url, "llama-server")
    return process, url


def run_model(
    name: str, gguf: Path, peer: Peer | None, threads: int, args, draft: Path | None = None
) -> list[dict]:
    budget = kv_budget_for(gguf, CONTEXT)
    flags = [str(gguf), "--max-batch", "32", "--max-model-len", "2048", "--kv-budget", str(budget)]
    spec = ["--draft-model", str(draft)] if draft else ["--speculative-config", "ngram"]
    processes, servers = [], {}
    try:
        for who, extra in (("ours", []), ("ours+spec", spec)):
            process, url, _ = start_server(flags + extra)
            processes.append(process)
            servers[who] = url
        if peer is not None:
            for who, spec in (("llama.cpp", False), ("llama.cpp+spec", True)):
                process, url = start_llama(peer, gguf, threads, spec, draft)
                processes.append(process)
                servers[who] = url
        levels = [int(c) for c in args.levels.split(",")]
        results: dict[tuple[str, str, int], list[dict]] = {}
        for round_ in range(args.rounds):
            for workload in ("repeat", "chat"):
                for concurrency in levels:
                    texts = prompts(workload, max(2, concurrency))
                    order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                    for who in order:
                        time.sleep(1.0)  # llama.cpp's threads poll a while after their work
                        before = spec_counters(servers[who]) if who == "ours+spec" else (0, 0)
                        row = asyncio.run(level(servers[who], texts, concurrency, args.max_tokens))
                        if who == "ours+spec":
                            after = spec_counters(servers[who])
                            row["drafted"], row["accepted"] = (
                                a - b for a, b in zip(after, before, strict=True)
                            )
                        results.setdefault((workload, who, concurrency), []).append(row)
                        print(f"round {round_ + 1} {workload:>6} c={concurrency:<2} {who:>14}:"
                              f" {row['tok_s']:.1f} tok/s", flush=True)  # fmt: skip
    finally:
        for process in processes:
            stop(process)
    rows = []
    for workload in ("repeat", "chat"):
        for concurrency in levels:
            med = {
                who: statistics.median(r["tok_s"] for r in results[(workload, who, concurrency)])
                for who in servers
            }
            runs = results[(workload, "ours+spec", concurrency)]
            plain = results[(workload, "ours", concurrency)]
            same = sum(
                a == b
                for r, p in zip(runs, plain, strict=True)
                for a, b in zip(r["texts"], p["texts"], strict=True)
            )
            total = sum(len(r["texts"]) for r in runs)
            row = {
                "model": name,
                "speculation": f"draft {draft.name}" if draft else "ngram",
                "workload": workload,
                "streams": concurrency,
                "ours_tok_s": med["ours"],
                "ours_spec_tok_s": med["ours+spec"],
                "spec_gain": med["ours+spec"] / med["ours"],
                # each round's pair, run back to back, then the median: a shared machine's
                # slow minutes slow both sides of a pair
                "spec_gain_paired": _paired(results, workload, concurrency, "ours+spec", "ours"),
                "ours_acceptance": _rate(runs),
                "identical": f"{same}/{total}",
            }
            if peer is not None:
                lspec = results[(workload, "llama.cpp+spec", concurrency)]
                row.update(
                    llama_tok_s=med["llama.cpp"],
                    llama_spec_tok_s=med["llama.cpp+spec"],
                    llama_spec_gain=med["llama.cpp+spec"] / med["llama.cpp"],
                    llama_acceptance=_rate(lspec),
                    vs_llama_spec=med["ours+spec"] / med["llama.cpp+spec"],
                    vs_llama_spec_paired=_paired(
                        results, workload, concurrency, "ours+spec", "llama.cpp+spec"
                    ),
                )
            rows.append(row)
    return rows


def _paired(results: dict, workload: str, concurrency: int, top: str, bottom: str) -> float:
    ups, downs = results[(workload, top, concurrency)], results[(workload, bottom, concurrency)]
    return statistics.median(u["tok_s"] / d["tok_s"] for u, d in zip(ups, downs, strict=True))


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
    args = parser.parse_args()
    threads = pin_threads()
    print(cpu_line())
    draft = served_models(args.draft)[0].path if args.draft else None
    all_rows = []
    for bench in served_models(args.models):
        peer = None if args.no_peer else find_peer(bench.path)
        rows = run_model(bench.name, bench.path, peer, threads, args, draft)
        print(table(rows, f"speculation, {bench.name}: median of {args.rounds} rounds"))
        all_rows += rows
    print("wrote", write_csv("spec-draft.csv" if draft else "spec.csv", all_rows))


if __name__ == "__main__":
    sys.exit(main())

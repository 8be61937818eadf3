"""How close a quantized K/V cache stays to the float16 one, beside llama.cpp's own; and how many
tokens each form holds at one budget.

    python -m benchmarks.kv_accuracy [--models smollm2-135m] [--forms q8_0 q4_0] [--tokens 2048]
                                     [--texts 2] [--top 64] [--no-peer]

Per model of the set (benchmarks/models.py), teacher-forced over `--texts` fixed texts of
`--tokens` tokens each (Python's reference manual from `pydoc_data`, prose; torch's tensor
docstrings, prose and code; both fixed by the pinned versions), every position predicting the
text's next token:

- nanoserve: one prefill per text and cache form, its weights as served (the GGUF's own blocks
  under the kernels), the logits of every position; each form against the float16 cache's on the
  same positions: top-1 agreement, mean KL(float16 || form) over the whole vocabulary, and the
  same KL estimated as the peer's must be (below);
- llama.cpp: llama-server with `-ctk/-ctv` of each form (`-fa on`, which its quantized V
  needs, for the float16 run too), one request a position with the prompt cached (each request
  computes one new position, reading the cache), `n_probs` = `--top`: its top-1 and its top
  `--top` log-probabilities. Its KL against its own float16 run can only be estimated from those
  lists: the reference's top tokens that both lists name, and the rest lumped into one outcome
  (a lower bound on the true KL). nanoserve's is estimated the same way from its own lists, so the
  two estimates compare; nanoserve's full-vocabulary KL is printed beside it.

Capacity: the tokens a 1 GiB budget holds in each form (the memory plan's arithmetic).
Prints tables; writes CSV.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import time
from pathlib import Path

import httpx
import torch

from benchmarks.common import RESULTS, cpu_line, pin_threads, table, write_csv
from benchmarks.models import BenchModel, served_models
from benchmarks.peer import Peer, find_peer
from benchmarks.servers import free_port, launch
from nanoserve.core import BlockTable, PrefillChunk, plan_kv_pool, plan_prefill
from nanoserve.core.kv_cache_dtype import KvCacheDtype, parse_kv_cache_dtype
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel

REFERENCE = "float16"
BUDGET = 1 << 30  # the capacity table's budget
TopLists = list[dict[int, float]]  # per position: token id -> log-probability, its top tokens


def texts(tokenizer: object, tokens: int, count: int) -> list[list[int]]:
    """`count` fixed texts, each cut to `tokens` token ids."""
    from pydoc_data.topics import topics

    docs = Path(torch.__file__).parent / "_tensor_docs.py"
    sources = ["\n\n".join(topics[key] for key in sorted(topics)), docs.read_text()]
    out = []
    for source in sources[:count]:
        ids = tokenizer.encode(source)  # type: ignore[attr-defined]
        if len(ids) < tokens:
            raise SystemExit(f"a text has {len(ids)} tokens, fewer than --tokens {tokens}")
        out.append(ids[:tokens])
    return out


def served_model(checkpoint: Checkpoint, form: KvCacheDtype, tokens: int) -> LlamaModel:
    """The model as `nanoserve serve` runs a GGUF (its own blocks under the kernels), its cache
    in `form`, positions for `tokens`."""
    model = LlamaModel.from_checkpoint(
        checkpoint, dtype=torch.bfloat16, quantize="gguf", max_positions=tokens + 64
    )
    model.use_kv_cache_dtype(form)
    return model


def llama_cache_types(form: str) -> tuple[str, str]:
    """llama.cpp's -ctk and -ctv for a nanoserve cache form."""
    pair = parse_kv_cache_dtype(form, torch.float16)
    k, v = ("f16" if f == REFERENCE else f for f in (pair.k, pair.v))
    return k, v


def teacher_forced(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """Log-probabilities after each of `ids`' first n - 1 tokens, the text as one prompt through
    a pool of the model's cache form: [n - 1, vocab] float32."""
    cfg = model.config
    plan = plan_kv_pool(
        num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        dtype=model.kv_dtype, block_size=16, budget_bytes=1 << 31,
        max_blocks=-(-len(ids) // 16) + 1, forms=model.kv_cache_dtype,
    )  # fmt: skip
    pool = KVPool(plan)
    blocks = BlockTable(16, range(plan.num_blocks))
    prefill = plan_prefill([PrefillChunk(0, tuple(ids), 0, blocks)], sink_slot=plan.sink_slot)
    with torch.inference_mode():
        logits = model.forward(prefill, pool.view((0,)), logit_rows=torch.arange(len(ids) - 1))
    return torch.log_softmax(logits, dim=-1)


def top_lists(logprobs: torch.Tensor, top: int) -> TopLists:
    values, ids = logprobs.topk(top, dim=-1)
    return [
        dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(ids, values, strict=True)
    ]


def listed_kl(reference: dict[int, float], other: dict[int, float]) -> float:
    """KL(reference || other) from two top lists: the reference's tokens both name, and the rest
    of each distribution lumped into one outcome (never above the full-vocabulary KL)."""
    shared = [t for t in reference if t in other]
    p = [math.exp(reference[t]) for t in shared]
    q = [math.exp(other[t]) for t in shared]
    kl = sum(pi * (reference[t] - other[t]) for pi, t in zip(p, shared, strict=True))
    p_rest, q_rest = max(1.0 - sum(p), 0.0), max(1.0 - sum(q), 1e-12)
    return kl + (p_rest * math.log(p_rest / q_rest) if p_rest > 0 else 0.0)


def compare(reference: TopLists, other: TopLists) -> tuple[float, float]:
    """(top-1 agreement, mean listed KL) of `other` against `reference`, position by position."""
    agree = [max(r, key=r.__getitem__) == max(o, key=o.__getitem__) for r, o in
             zip(reference, other, strict=True)]  # fmt: skip
    kls = [listed_kl(r, o) for r, o in zip(reference, other, strict=True)]
    return sum(agree) / len(agree), sum(kls) / len(kls)


def full_kl(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """Per position KL(reference || other) over the whole vocabulary, in float64 (256 positions
    at a time: a 262k vocabulary's rows are 2 MiB each in float64)."""
    out = []
    for start in range(0, len(reference), 256):
        ref = reference[start : start + 256].double()
        out.append((ref.exp() * (ref - other[start : start + 256].double())).sum(-1))
    return torch.cat(out)


def ours(
    checkpoint: Checkpoint, ids_set: list[list[int]], forms: list[str], top: int
) -> tuple[list[dict[str, object]], dict[str, TopLists]]:
    """Per form, against float16: rows of figures, and each form's top lists."""
    reference: list[torch.Tensor] = []
    lists: dict[str, TopLists] = {}
    rows = []
    tokens = len(ids_set[0])
    for name in [REFERENCE, *forms]:
        model = served_model(checkpoint, parse_kv_cache_dtype(name, torch.float16), tokens)
        agree, kls = 0.0, []
        lists[name] = []
        for i, ids in enumerate(ids_set):
            logprobs = teacher_forced(model, ids)
            lists[name] += top_lists(logprobs, top)
            if name == REFERENCE:
                reference.append(logprobs)
                continue
            agree += float((logprobs.argmax(-1) == reference[i].argmax(-1)).sum())
            kls.append(full_kl(reference[i], logprobs))
            del logprobs
        del model
        gc.collect()
        if name == REFERENCE:
            continue
        positions = len(lists[name])
        _, listed_mean = compare(lists[REFERENCE], lists[name])
        every = torch.cat(kls)
        rows.append({
            "form": name, "positions": positions, "top1": agree / positions,
            "kl_mean": float(every.mean()), "kl_p99": float(every.quantile(0.99)),
            f"kl_top{top}": listed_mean,
        })  # fmt: skip
    return rows, lists


def peer_lists(
    peer: Peer, gguf: Path, ids_set: list[list[int]], form: str, top: int, threads: int
) -> TopLists:
    """llama.cpp's top `top` log-probabilities after every prefix of each text, its cache in
    `form` (-ctk/-ctv), one request a position with the prompt cached. Kept in
    results/kv_accuracy_peer/ and read back by a later run on the same file, texts and peer
    build (the peer's lists do not change with nanoserve's code; delete the folder to redo)."""
    digest = hashlib.sha256(json.dumps([gguf.name, form, top, ids_set]).encode()).hexdigest()[:16]
    kept = RESULTS / "kv_accuracy_peer" / f"{gguf.stem}-{peer.backend}-{digest}.json"
    if kept.exists():
        return [{int(t): lp for t, lp in row.items()} for row in json.loads(kept.read_text())]
    lists = _peer_lists(peer, gguf, ids_set, form, top, threads)
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(lists))
    return lists


def _peer_lists(
    peer: Peer, gguf: Path, ids_set: list[list[int]], form: str, top: int, threads: int
) -> TopLists:
    port = free_port()
    k, v = llama_cache_types(form)
    command = [
        peer.binary("llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-t", str(threads), "-tb", str(threads), "-c", str(len(ids_set[0]) + 64), "-np", "1",
        "-ctk", k, "-ctv", v, "-fa", "on", "--no-webui",
    ]  # fmt: skip
    server = launch(f"llama.cpp -ctk {k} -ctv {v}", command, f"http://127.0.0.1:{port}")
    try:
        out: TopLists = []
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for ids in ids_set:
                for end in range(1, len(ids)):
                    body = {
                        "prompt": ids[:end], "n_predict": 1, "temperature": 0,
                        "cache_prompt": True, "n_probs": top, "return_tokens": True,
                    }  # fmt: skip
                    reply = client.post("/completion", json=body).json()
                    listed = reply["completion_probabilities"][0]["top_logprobs"]
                    out.append({int(e["id"]): float(e["logprob"]) for e in listed})
        return out
    finally:
        server.stop()


def capacity(checkpoint: Checkpoint, forms: list[str]) -> dict[str, object]:
    """Tokens a `BUDGET` pool holds, by form (the plan's blocks x 16)."""
    cfg = checkpoint.config
    row: dict[str, object] = {}
    for name in [REFERENCE, *forms]:
        form = parse_kv_cache_dtype(name, torch.float16)
        plan = plan_kv_pool(
            num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            dtype=form.torch_dtype, block_size=16, budget_bytes=BUDGET, forms=form,
        )  # fmt: skip
        row[f"{name}_tokens"] = plan.num_blocks * 16
    base = row[f"{REFERENCE}_tokens"]
    for name in forms:
        row[f"{name}_x"] = row[f"{name}_tokens"] / base  # type: ignore[operator]
    return row


def bench_model(
    bench: BenchModel, args: argparse.Namespace, threads: int
) -> tuple[list[dict[str, object]], dict[str, object]]:
    checkpoint = load_checkpoint(bench.path)
    ids_set = texts(checkpoint.tokenizer, args.tokens, args.texts)
    forms = args.forms
    rows, lists = ours(checkpoint, ids_set, forms, args.top)
    rows = [{"model": bench.name, "who": "nanoserve", **row} for row in rows]
    peer = None if args.no_peer else find_peer(bench.path)
    if peer:
        started = time.perf_counter()
        reference = peer_lists(peer, bench.path, ids_set, REFERENCE, args.top, threads)
        for name in args.peer_forms:
            top1, kl = compare(reference, peer_lists(peer, bench.path, ids_set, name, args.top,
                                                     threads))  # fmt: skip
            rows.append({
                "model": bench.name, "who": f"llama.cpp ({peer.backend})", "form": name,
                "positions": len(reference), "top1": top1, "kl_mean": float("nan"),
                "kl_p99": float("nan"), f"kl_top{args.top}": kl,
            })  # fmt: skip
        # llama.cpp's float16 run against nanoserve's: how far the two engines are apart anyway.
        top1, kl = compare(lists[REFERENCE], reference)
        rows.append({
            "model": bench.name, "who": "llama.cpp f16 vs nanoserve f16", "form": REFERENCE,
            "positions": len(reference), "top1": top1, "kl_mean": float("nan"),
            "kl_p99": float("nan"), f"kl_top{args.top}": kl,
        })  # fmt: skip
        print(f"{bench.name}: llama.cpp runs took {time.perf_counter() - started:.0f} s")
    return rows, {"model": bench.name, **capacity(checkpoint, forms)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", help="comma-separated names of the set (default: all served)")
    parser.add_argument(
        "--forms",
        nargs="+",
        default=["q8_0", "q4_0"],
        help="cache forms against float16 (k=q8_0,v=q4_0 for a pair)",
    )
    parser.add_argument("--tokens", type=int, default=2048, help="tokens a text")
    parser.add_argument("--texts", type=int, default=2, choices=(1, 2))
    parser.add_argument("--top", type=int, default=64, help="log-probabilities a position")
    parser.add_argument(
        "--peer-forms",
        nargs="+",
        default=["q8_0", "q4_0"],
        help="the forms llama.cpp is measured in, beside float16",
    )
    parser.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    args = parser.parse_args()
    threads = pin_threads()
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    print(cpu_line())
    rows, capacities = [], []
    for bench in served_models(args.models):
        model_rows, model_capacity = bench_model(bench, args, threads)
        rows += model_rows
        capacities.append(model_capacity)
        print(table(model_rows, f"{bench.name}: against the float16 cache, teacher-forced"))
    print(table(rows, "K/V cache accuracy against float16 (each engine against its own)"))
    print(table(capacities, f"tokens a {BUDGET >> 30} GiB K/V budget holds"))
    print(f"wrote {write_csv('kv_accuracy.csv', rows)}")
    print(f"wrote {write_csv('kv_capacity.csv', capacities)}")


if __name__ == "__main__":
    main()

"""Offline throughput: 64 requests through LLM.generate, beside transformers' batched generate.

    python -m benchmarks.throughput [--dtype bfloat16] [--requests 64] [--skip-reference]

Workload (seed 0): prompt lengths uniform in 32..512, output lengths uniform in 128..256,
ignore_eos so every request produces exactly what it asked for. Aggregate output tok/s =
tokens asked for / wall seconds. transformers runs static batches of --hf-batch, left-padded,
each generating its longest request's length (what static batching costs). A second
workload shares a 384-token system prompt between 32 requests, with the prefix cache on and off.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from benchmarks.common import pin_threads, table, write_csv
from nanoserve.runtime.engine.boot.build import build_engine
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.serving.llm import LLM
from nanoserve.runtime.loading.embedded import embedded_model_path


def workload(requests: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(requests):
        length = rng.randint(32, 512)
        out.append(([rng.randrange(17, 48000) for _ in range(length)], rng.randint(128, 256)))
    return out


def run_ours(llm: LLM, work: list[tuple[list[int], int]]) -> float:
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in work]
    started = time.perf_counter()
    outputs = llm.generate([ids for ids, _ in work], params)
    seconds = time.perf_counter() - started
    assert sum(len(o.outputs[0].token_ids) for o in outputs) == sum(n for _, n in work)
    return seconds


def run_reference(work: list[tuple[list[int], int]], dtype: torch.dtype, batch: int) -> float:
    import transformers

    transformers.logging.set_verbosity_error()
    path = embedded_model_path()
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
        .to(dtype)
        .eval()
    )
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(work), batch):
            group = work[start : start + batch]
            longest = max(len(ids) for ids, _ in group)
            ids = torch.zeros((len(group), longest), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, (prompt, _) in enumerate(group):
                ids[row, longest - len(prompt) :] = torch.tensor(prompt)
                mask[row, longest - len(prompt) :] = 1
            new = max(n for _, n in group)
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
    return time.perf_counter() - started


def shared_prefix(llm: LLM, requests: int = 32) -> tuple[float, float]:
    rng = random.Random(1)
    system = [rng.randrange(17, 48000) for _ in range(384)]
    prompts = [system + [rng.randrange(17, 48000) for _ in range(32)] for _ in range(requests)]
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - started, llm.engine.blocks.stats.hit_rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--hf-batch", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--batch-invariant", type=int, default=0)
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()
    threads = pin_threads()
    work = workload(args.requests)
    asked = sum(n for _, n in work)
    config = dict(
        dtype=args.dtype,
        max_batch=args.max_batch,
        max_model_len=1024,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_budget_bytes=3 << 30,
        batch_invariant=bool(args.batch_invariant),
    )
    llm = LLM(engine=build_engine(EngineConfig(**config)))  # type: ignore[arg-type]
    ours_s = run_ours(llm, work)
    ref_s = (
        float("nan")
        if args.skip_reference
        else run_reference(work, getattr(torch, args.dtype), args.hf_batch)
    )
    rows = [
        {
            "engine": "nanoserve",
            "dtype": args.dtype,
            "requests": len(work),
            "output_tokens": asked,
            "seconds": ours_s,
            "tok_s": asked / ours_s,
            "ratio": ref_s / ours_s,
        },
        {
            "engine": f"transformers (static batch {args.hf_batch})",
            "dtype": args.dtype,
            "requests": len(work),
            "output_tokens": asked,
            "seconds": ref_s,
            "tok_s": asked / ref_s,
            "ratio": 1.0,
        },
    ]
    print(
        table(
            rows,
            f"throughput: {len(work)} requests, prompts 32-512, outputs 128-256, {threads} threads",
        )
    )
    print("wrote", write_csv("throughput.csv", rows))
    prefix_rows = []
    for enabled in (True, False):
        cached = LLM(engine=build_engine(EngineConfig(**config, enable_prefix_cache=enabled)))  # type: ignore[arg-type]
        seconds, hit_rate = shared_prefix(cached)
        prefix_rows.append(
            {
                "prefix_cache": enabled,
                "requests": 32,
                "seconds": seconds,
                "tok_s": 32 * 64 / seconds,
                "hit_rate": hit_rate,
            }
        )
    print(table(prefix_rows, "shared 384-token system prompt, 32 requests x 64 tokens"))
    print("wrote", write_csv("throughput_prefix.csv", prefix_rows))


if __name__ == "__main__":
    main()

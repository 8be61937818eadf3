"""Prefill and single-stream decode over the model set, beside llama.cpp (and transformers).

    python -m benchmarks.forward [--models smollm2-135m,qwen2.5-coder-0.5b] [--repeats 3]
                                 [--no-reference] [--no-peer] [--served-only]

In one process and run, on this machine, per model of the set (benchmarks/models.py):
nanoserve in each weight form, llama.cpp's `llama-bench` (pp512 / tg128) on the same GGUF, and
for the embedded model transformers (fp32, bf16) on the same dequantized weights.

- forms: the embedded model in every form (fp32 exact, bf16, bf16 + int8, q4, q8 and gguf);
  the others as served (gguf: each tensor in its file's type) and re-quantized (q4, q8), with
  fp32 exact (the dequantized weights in float32, torch) as the accuracy reference only;
- prefill: one forward over a 512-token prompt (tok/s), like pp512;
- decode: 128 greedy tokens after a 16-token prompt (tok/s), like tg128;
- roofline: the decode limit the file's bytes allow at the read speed measured in this run,
  and each engine's decode as a share of it (benchmarks/roofline.py);
- accuracy: every form teacher-forced over a fixed ~320-token text against the fp32 exact
  form's logits: max and mean |logit difference| and top-1 agreement per position; and
  llama.cpp's own top-1 on the same positions (its server, greedy, one position a request
  with the prompt cached), against the same reference.

Medians of --repeats runs; ratios are against the baseline measured in this run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import cpu_line, median_seconds, pin_threads, table, write_csv
from benchmarks.models import BenchModel, served_models
from benchmarks.peer import Peer, find_peer, llama_bench, teacher_forced_top1
from benchmarks.roofline import Roofline, bandwidth_line, read_bandwidth, step_bytes
from nanoserve.core import BlockTable, PrefillChunk, plan_kv_pool, plan_prefill
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel

# (label, dtype, quantize, timed): the exact mode first, it is the accuracy reference.
EMBEDDED_FORMS = (
    ("float32 (exact)", torch.float32, None, True),
    ("bfloat16", torch.bfloat16, None, True),
    ("bfloat16+int8", torch.bfloat16, "int8", True),
    ("q4 (kernels)", torch.bfloat16, "q4", True),
    ("q8 (kernels)", torch.bfloat16, "q8", True),
    ("gguf (kernels)", torch.bfloat16, "gguf", True),
)
# A 0.5B model's fp32 torch path decodes at a few tokens a second: a reference, not a rival.
GGUF_FORMS = (
    ("float32 (exact)", torch.float32, None, False),
    ("gguf (kernels)", torch.bfloat16, "gguf", True),
    ("q4 (re-quantized)", torch.bfloat16, "q4", True),
    ("q8 (re-quantized)", torch.bfloat16, "q8", True),
)
TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden press adapted from "
    "those used for wine. Within fifty years presses were running in more than two hundred "
    "cities across Europe, and the price of books fell so far that reading spread from "
    "monasteries and courts to merchants and artisans.\n\n"
    "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n\n"
    "Question: a train leaves at 9:40 and arrives at 13:05. How long is the journey?\n"
    "Answer: 3 hours and 25 minutes.\n\n"
    "User: Can you recommend a book about the ocean for a ten-year-old?\n"
    'Assistant: Try "The Sea Book" by Charlotte Milner. It explains tides, coral reefs and '
    "the creatures of the deep with bright pictures, and it ends with simple ways to keep "
    'beaches clean. If she likes stories more than facts, "Island of the Blue Dolphins" is '
    "a classic about a girl who lives alone on an island for years.\n\n"
    '{"name": "Ada Lovelace", "born": 1815, "known_for": ["Analytical Engine", "first '
    'published algorithm"], "languages": {"english": true, "french": true}}\n\n'
    "To make a simple bread, mix 500 g of flour, 10 g of salt, 7 g of dried yeast and 350 ml "
    "of warm water. Knead for ten minutes until the dough is smooth, then let it rise in a "
    "covered bowl for about an hour. Shape it, let it rise again for thirty minutes, and bake "
    "at 220 degrees for 30 to 35 minutes, until the loaf sounds hollow when tapped.\n\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)\n\n"
    "    def pop(self):\n        if not self.items:\n            raise IndexError('empty')\n"
    "        return self.items.pop()\n\n"
    "The mitochondrion is often called the powerhouse of the cell: it turns sugars and oxygen "
    "into ATP, the molecule that carries energy to the rest of the cell. Mitochondria have "
    "their own small genome, inherited from the mother, which is one reason biologists think "
    "they began as free-living bacteria that were swallowed by an ancestral cell.\n"
    "If x + 3 = 11, then x = 8; and if 2y = 14, then y = 7, so x * y = 56.\n"
)


# More positions than one text gives: top-1 agreement near 99% moves by a position in a few
# hundred, so the accuracy runs over these texts too, each fed whole (one position each).
MORE_TEXTS = (
    "Dear Ms. Okafor,\n\nThank you for your letter of 3 March about the delayed shipment. "
    "I am sorry that the order reached you two weeks late and that two of the twelve chairs "
    "were scratched. We have checked with our carrier: the pallet was held at the port "
    "because a customs form was missing a signature, which was our mistake, not yours. "
    "We will send two new chairs this Friday at no cost, and you do not need to return the "
    "damaged ones. We have also refunded the delivery charge of 45 euros to your card; it "
    "should appear within five working days.\n\nWith best wishes,\nTomas Lindqvist\n"
    "Customer Service, Nordic Oak Furniture\n\n"
    "SELECT c.name, COUNT(o.id) AS orders, SUM(o.total) AS spent\nFROM customers c\n"
    "JOIN orders o ON o.customer_id = c.id\nWHERE o.created_at >= '2024-01-01'\n"
    "GROUP BY c.name\nHAVING COUNT(o.id) > 3\nORDER BY spent DESC\nLIMIT 10;\n\n"
    "Photosynthesis happens in two stages. In the light-dependent reactions, chlorophyll in "
    "the thylakoid membranes absorbs light and uses its energy to split water, releasing "
    "oxygen and making ATP and NADPH. In the Calvin cycle, which takes place in the stroma, "
    "the plant uses that ATP and NADPH to fix carbon dioxide into three-carbon sugars, some "
    "of which become glucose, starch and cellulose.\n\n"
    "1. Preheat the oven to 180 degrees.\n2. Grease a 20 cm tin.\n3. Beat 200 g butter with "
    "200 g sugar until pale.\n4. Add 4 eggs one at a time, then fold in 200 g flour.\n"
    "5. Bake for 25 minutes, until a skewer comes out clean.\n\n"
    "fn fib(n: u64) -> u64 {\n    let (mut a, mut b) = (0, 1);\n    for _ in 0..n {\n"
    "        let t = a + b;\n        a = b;\n        b = t;\n    }\n    a\n}\n\n"
    "The Treaty of Westphalia, signed in 1648, ended the Thirty Years' War and is often "
    "described as the beginning of the modern system of sovereign states: each ruler would "
    "decide the religion of his own territory, and outside powers would not interfere.\n"
    "Q: What is 15% of 240? A: 36. Q: What is the square root of 169? A: 13.\n",
)


def prompt_ids(length: int, vocab: int = 49152) -> list[int]:
    return [(i * 7919) % (vocab - 1200) + 17 for i in range(length)]


def engine_for(model: LlamaModel, checkpoint: Checkpoint) -> Engine:
    return Engine.from_config(
        model,
        checkpoint.tokenizer,
        EngineConfig(
            max_model_len=1024,
            max_num_batched_tokens=1024,
            kv_budget_bytes=1 << 28,
            enable_prefix_cache=False,
            quantize=model.quantize,
        ),
    )


def ours(model: LlamaModel, checkpoint: Checkpoint, repeats: int) -> tuple[float, float]:
    engine = engine_for(model, checkpoint)

    vocab = model.config.vocab_size

    def prefill() -> None:
        engine.add_request("p", prompt_ids(512, vocab), SamplingParams(max_tokens=1, temperature=0))
        engine.run_until_done()

    prefill_s = median_seconds(prefill, repeats)

    def decode() -> float:
        params = SamplingParams(max_tokens=129, temperature=0, ignore_eos=True)
        engine.add_request("d", prompt_ids(16, vocab), params)
        engine.step()  # the prompt and the first token
        started = time.perf_counter()
        engine.run_until_done()
        return time.perf_counter() - started

    decode()
    decode_s = statistics.median(decode() for _ in range(repeats))
    return 512 / prefill_s, 128 / decode_s


def reference(hf_model: Any, repeats: int) -> tuple[float, float]:
    with torch.inference_mode():
        long = torch.tensor([prompt_ids(512)])
        prefill_s = median_seconds(lambda: hf_model(long), repeats)
        short = torch.tensor([prompt_ids(16)])

        def generate(n: int) -> None:
            hf_model.generate(
                short, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
            )

        one = median_seconds(lambda: generate(1), repeats)
        many = median_seconds(lambda: generate(129), repeats)
    return 512 / prefill_s, 128 / (many - one)


def teacher_forced_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """Logits at every position of `ids`, fed as one prompt: [tokens, vocab] float32."""
    cfg = model.config
    plan = plan_kv_pool(
        num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        dtype=model.kv_dtype,
        block_size=16,
        budget_bytes=1 << 28,
        max_blocks=-(-len(ids) // 16) + 1,
    )
    pool = KVPool(plan)
    table_ = BlockTable(16, range(plan.num_blocks))
    prefill = plan_prefill([PrefillChunk(0, tuple(ids), 0, table_)], sink_slot=plan.sink_slot)
    with torch.inference_mode():
        return model.forward(prefill, pool.view((0,)), logit_rows=torch.arange(len(ids)))


def accuracy(logits: torch.Tensor, exact: torch.Tensor) -> dict[str, float]:
    diff = (logits - exact).abs()
    return {
        "max_abs_dlogit": float(diff.max()),
        "mean_abs_dlogit": float(diff.mean()),
        "top1_agreement": float((logits.argmax(-1) == exact.argmax(-1)).float().mean()),
    }


def llamacpp_accuracy(
    peer: Peer, path: Path, texts: list[list[int]], exact: torch.Tensor, threads: int
) -> dict[str, object]:
    picked = torch.tensor(
        [t for ids in texts for t in teacher_forced_top1(peer, path, ids, threads)]
    )
    agreement = float((picked == exact[: len(picked)].argmax(-1)).float().mean())
    return {
        "form": f"llama.cpp ({peer.backend})",
        "positions": len(picked),
        "max_abs_dlogit": float("nan"),
        "mean_abs_dlogit": float("nan"),
        "top1_agreement": agreement,
    }


DECODE_CONTEXT = 16 + 128 // 2  # a tg128 token's mean position after the 16-token prompt


def bench_model(
    bench: BenchModel, args: argparse.Namespace, threads: int, bandwidth_gbs: float
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    path = bench.path
    roofline = Roofline(bandwidth_gbs, step_bytes(path))
    limit = roofline.limit(rows=1, context=DECODE_CONTEXT)
    checkpoint = load_checkpoint(path)
    embedded = bench.name == "smollm2-135m"
    peer = None if args.no_peer else find_peer(path)
    peer_rates = llama_bench(peer, path, threads, args.repeats) if peer else {}
    if peer:
        print(f"{bench.name}: llama.cpp backend {peer.backend} {peer.note}".rstrip())

    hf_rates: dict[torch.dtype, tuple[float, float]] = {}
    if embedded and not args.no_reference and not args.served_only:
        import transformers

        transformers.logging.set_verbosity_error()
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
        for dtype in (torch.float32, torch.bfloat16):
            hf_rates[dtype] = reference(hf.to(dtype), args.repeats)
        del hf

    texts = [checkpoint.tokenizer.encode(t) for t in (TEXT, *MORE_TEXTS)]
    rows, accuracy_rows = [], []
    exact: torch.Tensor | None = None
    nan = float("nan")
    forms = EMBEDDED_FORMS if embedded else GGUF_FORMS
    if args.served_only:  # the served form's speed alone: no reference, no accuracy
        forms = tuple(form for form in forms if form[2] == "gguf")
    for label, dtype, quantize, timed in forms:
        model = LlamaModel.from_checkpoint(
            checkpoint, dtype=dtype, quantize=quantize, max_positions=1024
        )
        if timed:
            prefill, decode = ours(model, checkpoint, args.repeats)
            hf_decode = hf_rates.get(dtype, (nan, nan))[1]
            rows.append(
                {
                    "model": bench.name,
                    "nanoserve": label,
                    "kernels": model.kernels,
                    "prefill_tok_s": prefill,
                    "decode_tok_s": decode,
                    "llamacpp_pp512": peer_rates.get("pp512", nan),
                    "llamacpp_tg128": peer_rates.get("tg128", nan),
                    "prefill_vs_llamacpp": prefill / peer_rates.get("pp512", nan),
                    "decode_vs_llamacpp": decode / peer_rates.get("tg128", nan),
                    "decode_limit_tok_s": limit,
                    "decode_share": decode / limit,
                    "llamacpp_share": peer_rates.get("tg128", nan) / limit,
                    **(
                        {"hf_decode": hf_decode, "decode_vs_hf": decode / hf_decode}
                        if embedded
                        else {}
                    ),
                }
            )
        if args.served_only:
            del model
            continue
        # Positions 0 .. n-2 of each text: each predicts a token of the text (as llama.cpp's).
        logits = torch.cat([teacher_forced_logits(model, ids)[: len(ids) - 1] for ids in texts])
        if exact is None:
            exact = logits
        else:
            accuracy_rows.append(
                {"form": label, "positions": len(logits), **accuracy(logits, exact)}
            )
        del model
        gc.collect()
    if peer and exact is not None:
        accuracy_rows.append(llamacpp_accuracy(peer, path, texts, exact, threads))
    return rows, accuracy_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", help="comma-separated names of the set (default: all served)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-reference", action="store_true", help="skip transformers")
    parser.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    parser.add_argument(
        "--served-only", action="store_true", help="time the served form only, no accuracy"
    )
    args = parser.parse_args()
    threads = pin_threads()
    print(cpu_line())
    bandwidth = read_bandwidth()
    print(bandwidth_line(bandwidth, threads))
    for bench in served_models(args.models):
        rows, accuracy_rows = bench_model(bench, args, threads, bandwidth)
        title = f"forward: {bench.name}, {threads} threads, median of {args.repeats}"
        print(table(rows, title))
        print()
        print("wrote", write_csv(f"forward_{bench.name}.csv", rows))
        if accuracy_rows:
            title = f"{bench.name}: teacher-forced against float32 (exact) logits"
            print(table(accuracy_rows, title))
            print("wrote", write_csv(f"forward_accuracy_{bench.name}.csv", accuracy_rows))


if __name__ == "__main__":
    main()

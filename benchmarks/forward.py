"""Prefill and single-sequence decode speed of the embedded model, beside transformers.

    python -m benchmarks.forward [--repeats 3] [--decode-tokens 64]

Both run the same dequantized SmolLM2-135M weights in the same process, fp32 and bf16.
Prefill: one forward over a 64- and a 512-token prompt. Decode: tokens per second of a
single greedy sequence after a 64-token prompt. Medians of --repeats runs; ratio = ours /
transformers.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import median_seconds, pin_threads, table, write_csv
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.sampling_params import SamplingParams
from nanoserve.runtime.engine_config import EngineConfig
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.loading.embedded import embedded_model_path
from nanoserve.runtime.model.llama import LlamaModel


def prompt_ids(length: int) -> list[int]:
    return [(i * 7919) % 48000 + 17 for i in range(length)]


def ours(
    model: LlamaModel, tokenizer, prompt_len: int, decode_tokens: int, repeats: int
) -> tuple[float, float]:
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(
            max_model_len=1024,
            max_num_batched_tokens=1024,
            kv_budget_bytes=1 << 28,
            enable_prefix_cache=False,
        ),
    )
    ids = prompt_ids(prompt_len)

    def prefill() -> None:
        engine.add_request("p", ids, SamplingParams(max_tokens=1, temperature=0))
        engine.run_until_done()

    prefill_s = median_seconds(prefill, repeats)

    def decode() -> float:
        engine.add_request(
            "d",
            prompt_ids(64),
            SamplingParams(max_tokens=decode_tokens + 1, temperature=0, ignore_eos=True),
        )
        engine.step()  # prefill and the first token
        started = time.perf_counter()
        engine.run_until_done()
        return time.perf_counter() - started

    decode()
    decode_s = sorted(decode() for _ in range(repeats))[repeats // 2]
    return prompt_len / prefill_s, decode_tokens / decode_s


def reference(hf_model, prompt_len: int, decode_tokens: int, repeats: int) -> tuple[float, float]:
    ids = torch.tensor([prompt_ids(prompt_len)])
    with torch.inference_mode():
        prefill_s = median_seconds(lambda: hf_model(ids), repeats)
        short = torch.tensor([prompt_ids(64)])

        def generate(n: int) -> None:
            hf_model.generate(
                short, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
            )

        one = median_seconds(lambda: generate(1), repeats)
        many = median_seconds(lambda: generate(decode_tokens + 1), repeats)
    return prompt_len / prefill_s, decode_tokens / (many - one)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args()
    threads = pin_threads()
    import transformers

    transformers.logging.set_verbosity_error()
    path = embedded_model_path()
    checkpoint = load_checkpoint(path)
    rows = []
    # (dtype, batch invariant, quantization): invariance costs nothing in bf16 (its kernels
    # are invariant), so it is measured on and off only in fp32.
    configs = {
        torch.float32: ((False, None), (True, None)),
        torch.bfloat16: ((True, None), (True, "int8")),
    }
    for dtype, variants in configs.items():
        hf_model = None
        if not args.no_reference:
            hf_model = (
                transformers.AutoModelForCausalLM.from_pretrained(
                    path.parent, gguf_file=path.name, dtype=torch.float32
                )
                .to(dtype)
                .eval()
            )
        ref_rates = (
            {n: reference(hf_model, n, args.decode_tokens, args.repeats) for n in (64, 512)}
            if hf_model
            else None
        )
        for invariant, quantize in variants:
            model = LlamaModel.from_tensors(
                checkpoint.config,
                checkpoint.tensors(),
                dtype=dtype,
                batch_invariant=invariant,
                max_positions=1024,
                quantize=quantize,
            )
            ours_rates = {
                n: ours(model, checkpoint.tokenizer, n, args.decode_tokens, args.repeats)
                for n in (64, 512)
            }
            for n in (64, 512):
                row = {
                    "dtype": str(dtype).removeprefix("torch.")
                    + (f"+{quantize}" if quantize else ""),
                    "batch_invariant": invariant,
                    "prompt": n,
                    "prefill_tok_s": ours_rates[n][0],
                    "hf_prefill_tok_s": ref_rates[n][0] if ref_rates else float("nan"),
                    "prefill_ratio": ours_rates[n][0] / ref_rates[n][0]
                    if ref_rates
                    else float("nan"),
                }
                if n == 64:
                    row |= {
                        "decode_tok_s": ours_rates[n][1],
                        "hf_decode_tok_s": ref_rates[n][1] if ref_rates else float("nan"),
                        "decode_ratio": ours_rates[n][1] / ref_rates[n][1]
                        if ref_rates
                        else float("nan"),
                    }
                else:
                    row |= {"decode_tok_s": "", "hf_decode_tok_s": "", "decode_ratio": ""}
                rows.append(row)
    print(table(rows, f"forward: SmolLM2-135M, {threads} threads, median of {args.repeats}"))
    print("wrote", write_csv("forward.csv", rows))


if __name__ == "__main__":
    main()

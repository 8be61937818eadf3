"""The build log's warm-up tables: measured on the host, then priced at serving size.

    python -m benchmarks.warmbench

Table 1 (measured; a tiny random-weight model, no real weights needed): 2 rows off a
16-token prompt at width multiple 32 — recordings an unwarmed engine makes (cold), the
lazy_captures prediction, what a warmed engine makes in front of clients, and the warm list.
Table 2 (computed): 256 rows, 8192 tokens, width multiple 128, 50 ms a recording — the stall
a request sees against the startup cost of the full and trimmed lists. Table 3 (computed):
what a memory budget buys at 256 rows and 32 heads. Writes CSVs and a PNG plot.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import RESULTS, pin_threads, table, write_csv
from nanoserve.core import (
    BucketSet,
    lazy_captures,
    stall_seconds,
    warm_shapes,
    warmup_seconds,
    width_ceiling,
)
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.text.tokenizer import Tokenizer

# The host table warms an explicit list: a time budget ample enough to record it untrimmed.
EXPLICIT_WARM_SECONDS = 3600.0


def tiny_model() -> tuple[LlamaModel, Tokenizer]:
    import tokenizers

    config = ModelConfig(
        architecture="llama",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rope_theta=10000.0,
        rope_scaling=None,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        max_position_embeddings=256,
        eos_token_ids=(0,),
        bos_token_id=None,
    )
    g = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (64, 32), "model.norm.weight": (32,)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (32, 32),
            p + "self_attn.k_proj.weight": (16, 32),
            p + "self_attn.v_proj.weight": (16, 32),
            p + "self_attn.o_proj.weight": (32, 32),
            p + "mlp.gate_proj.weight": (64, 32),
            p + "mlp.up_proj.weight": (64, 32),
            p + "mlp.down_proj.weight": (32, 64),
            p + "input_layernorm.weight": (32,),
            p + "post_attention_layernorm.weight": (32,),
        }
    weights = {name: torch.randn(shape, generator=g) * 0.3 for name, shape in shapes.items()}
    vocab = {chr(65 + i) if i < 26 else f"t{i}": i for i in range(64)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="A"))
    return LlamaModel(config, weights, max_positions=256), Tokenizer(
        backend, eos_token_ids=(0,), bos_token_id=None
    )


def host_row(model: LlamaModel, tokenizer: Tokenizer, generated: int) -> dict[str, object]:
    def engine() -> Engine:
        return Engine.from_config(
            model,
            tokenizer,
            EngineConfig(
                max_batch=2,
                max_model_len=256,
                width_multiple=32,
                block_size=16,
                kv_budget_bytes=1 << 22,
                decode_mode="recorded",
                warm_seconds=EXPLICIT_WARM_SECONDS,
            ),
        )

    def run(e: Engine) -> int:
        before = e.runner.recordings.num_cold
        for i in range(2):
            e.add_request(
                f"r{i}",
                [1 + i] * 16,
                SamplingParams(max_tokens=generated, temperature=0, ignore_eos=True),
            )
        e.run_until_done()
        return e.runner.recordings.num_cold - before

    cold = run(engine())
    warmed = engine()
    shapes = warm_shapes(
        warmed.runner.buckets,
        max_rows=2,
        max_width=warmed.runner.buckets.width_bucket(16 + generated),
    )
    plan = replace(warmed.plan_warm(), shapes=tuple(shapes), skipped=())
    started = time.perf_counter()
    report = warmed.warm(plan)
    warm_ms = (time.perf_counter() - started) * 1000
    assert not report.skipped, report.skipped  # the whole explicit list, as before
    return {
        "generated": generated,
        "cold_lazy": cold,
        "predicted": lazy_captures(16, generated, 32),
        "cold_warmed": run(warmed),
        "warm_graphs": len(shapes),
        "warm_ms": warm_ms,
    }


def priced_rows() -> list[dict[str, object]]:
    buckets = BucketSet(256, 8192, 128)
    full = len(warm_shapes(buckets))
    rows8 = len(warm_shapes(buckets, max_rows=8))
    rows8_ctx = len(warm_shapes(buckets, max_rows=8, max_width=2048))
    out = []
    for generated in (128, 512, 2048, 8192):
        lazy = lazy_captures(0, generated, 128)
        out.append(
            {
                "generated": generated,
                "lazy_graphs": lazy,
                "stall_s": stall_seconds(lazy, 0.05),
                "warm_full_s": warmup_seconds(full, 0.05),
                "warm_rows8_s": warmup_seconds(rows8, 0.05),
                "warm_rows8_ctx2048_s": warmup_seconds(rows8_ctx, 0.05),
            }
        )
    return out


def budget_rows() -> list[dict[str, object]]:
    buckets = BucketSet(256, 8192, 128)
    out = []
    for megabytes in (64, 268, 1000):
        ceiling = width_ceiling(megabytes * 10**6, 256, 32)
        shapes = warm_shapes(buckets, max_width=ceiling)
        out.append(
            {
                "free_MB": megabytes,
                "width_ceiling": ceiling,
                "shapes": len(shapes),
                "of": len(buckets.shapes),
            }
        )
    return out


def plot(priced: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gen = [r["generated"] for r in priced]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(
        gen, [r["stall_s"] for r in priced], "o-", label="unwarmed: stall in one request's latency"
    )
    for key, label in (
        ("warm_full_s", "warm full list (576 shapes)"),
        ("warm_rows8_s", "warm rows<=8 (256)"),
        ("warm_rows8_ctx2048_s", "warm rows<=8, ctx<=2048 (64)"),
    ):
        ax.plot(gen, [r[key] for r in priced], "--", label=f"startup: {label}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens generated by the request")
    ax.set_ylabel("seconds (50 ms a recording)")
    ax.set_title("256 rows, 8192 tokens, width multiple 128")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    threads = pin_threads()
    model, tokenizer = tiny_model()
    host = [host_row(model, tokenizer, g) for g in (8, 32, 64, 128)]
    print(table(host, f"host: 2 rows off a 16-token prompt, width multiple 32 ({threads} threads)"))
    priced = priced_rows()
    print(table(priced, "priced: 256 rows, 8192 tokens, width multiple 128, 50 ms a recording"))
    budget = budget_rows()
    print(table(budget, "what a budget buys: 256 rows, 32 heads, fp32 scores"))
    for name, rows in (
        ("warmbench_host.csv", host),
        ("warmbench_priced.csv", priced),
        ("warmbench_budget.csv", budget),
    ):
        print("wrote", write_csv(name, rows))
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(priced, RESULTS / "warmbench.png")
    print("wrote", RESULTS / "warmbench.png")


if __name__ == "__main__":
    main()

"""`--kv-cache-dtype`: K/V kept as GGUF blocks in the pool, on the kernels, for the families
that keep K/V (a plain decoder, Gemma 3's windows, a hybrid's attention layers): a row's tokens
are the same alone, batched, bucketed and recorded; the pool holds more tokens in the same
budget; and a form the model cannot read is refused in one line naming the flag."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.core.kv_cache_dtype import KvCacheDtype, KvCacheDtypeError
from nanoserve.runtime.engine.config.engine_config import EngineConfig, EngineConfigError
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel
from tests.runtime.capture_helpers import PROMPTS, run_joining_workload

# Heads of 64 values (two blocks each, and turned through llama.cpp's 64-wide Hadamard matrix);
# Gemma 3's window of 4 and the hybrid's attention layer as the model-family tests have them.
HEAD_64: dict[str, dict[str, Any]] = {
    "llama": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64},
    "gemma3": {"head_dim": 64, "query_pre_attn_scalar": 64},
    "qwen3_5": {"head_dim": 64},
}


@pytest.fixture(scope="module", params=sorted(HEAD_64))
def model_dir(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    make_tiny_model_dir: Callable[..., Path],
) -> Path:
    arch = request.param
    return make_tiny_model_dir(tmp_path_factory.mktemp(arch), arch=arch, **HEAD_64[arch])


def engine(model_dir: Path, kv: str, quantize: str | None = "q8", **config: Any) -> Engine:
    checkpoint = load_checkpoint(model_dir)
    model = LlamaModel.from_tensors(
        checkpoint.config, checkpoint.tensors(), max_positions=256, quantize=quantize
    )
    settings: dict[str, Any] = {
        "max_model_len": 256,
        "max_batch": 8,
        "width_multiple": 8,
        "block_size": 4,
        "kv_budget_bytes": 1 << 20,
        "quantize": quantize,
        "kv_cache_dtype": kv,
    }
    return Engine.from_config(model, checkpoint.tokenizer, EngineConfig(**{**settings, **config}))


@pytest.mark.parametrize("kv", ["q8_0", "k=q8_0,v=q4_0"])
def test_alone_batched_bucketed_and_recorded_agree(model_dir: Path, kv: str) -> None:
    eager = run_joining_workload(engine(model_dir, kv))
    assert sum(len(t) for t in eager.values()) == 6 + 15 + 24 + 20 + 20
    for mode in ("bucketed", "recorded"):
        assert run_joining_workload(engine(model_dir, kv, decode_mode=mode)) == eager
    for i, prompt in enumerate(PROMPTS):
        one = engine(model_dir, kv)
        one.add_request("only", prompt, SamplingParams(
            max_tokens=6 + 9 * i if i < 3 else 20, temperature=0, ignore_eos=True))  # fmt: skip
        assert [t for d in one.run_until_done() for t in d.token_ids] == eager[f"r{i}"]


def test_the_pool_keeps_blocks_and_holds_more(model_dir: Path) -> None:
    """At one budget: q8_0 rows of 2 x 2 x 34 bytes a head against float16's 2 x 128, q4_0's
    2 x 2 x 18."""
    plans = {kv: engine(model_dir, kv).pool_plan for kv in ("auto", "q8_0", "q4_0")}
    assert plans["auto"].kv_cache_dtype == KvCacheDtype("float16", "float16")
    assert [plans[kv].row_bytes for kv in ("auto", "q8_0", "q4_0")] == [256, 136, 72]
    assert plans["q8_0"].kv_cache_dtype == KvCacheDtype("q8_0", "q8_0")
    for kv, plan in plans.items():
        assert plan.total_bytes <= 1 << 20 or kv == "auto"
    assert plans["q8_0"].num_blocks // plans["auto"].num_blocks == 1  # 256 / 136 = 1.88
    assert plans["q4_0"].num_blocks // plans["auto"].num_blocks == 3  # 256 / 72 = 3.56
    served = engine(model_dir, "k=q8_0,v=q4_0")
    run_joining_workload(served)
    layers = served.pool.pools()
    assert layers and all(t.dtype == torch.uint8 and t.shape[-1] == 2 * (34 + 18) for t in layers)
    assert all(t[:-1].any() for t in layers)  # the rows written hold blocks


def test_forms_the_model_cannot_read_are_refused(
    model_dir: Path, tmp_path: Path, make_tiny_model_dir: Callable[..., Path]
) -> None:
    with pytest.raises(EngineConfigError, match="--kv-cache-dtype q8_0: K/V blocks are read by"):
        engine(model_dir, "q8_0", quantize=None)  # dense weights: torch's attention
    with pytest.raises(EngineConfigError, match="on a CUDA device"):
        EngineConfig(device="cuda", kv_cache_dtype="q4_0")
    with pytest.raises(EngineConfigError, match="k=q8_0 with v=float16"):
        EngineConfig(kv_cache_dtype="k=q8_0,v=float16")
    with pytest.raises(EngineConfigError, match="'fp8' is not a K/V form"):
        EngineConfig(kv_cache_dtype="fp8")
    narrow = make_tiny_model_dir(tmp_path, arch="llama")  # heads of 16: no whole block
    with pytest.raises(KvCacheDtypeError, match="head_dim 16 is not a multiple of 32"):
        engine(narrow, "q8_0")

"""The decode modes give the same tokens, bit for bit, as rows join and leave."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.core import DecodePlan, Shape, SlotTable, warm_shapes
from nanoserve.runtime.engine.config.engine_config import EngineConfigError
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.model.kv_pool import CacheRows
from tests.runtime.capture_helpers import (
    buckets_of,
    recordings_of,
    run_joining_workload,
    tiny_engine,
    warm,
)


@pytest.fixture(scope="module")
def eager_tokens(tiny_llama_dir: Path) -> dict[str, list[int]]:
    return run_joining_workload(tiny_engine(tiny_llama_dir))


@pytest.mark.parametrize("mode", ["bucketed", "persistent", "recorded"])
def test_modes_match_eager(tiny_llama_dir: Path, eager_tokens: dict, mode: str) -> None:
    engine = tiny_engine(tiny_llama_dir, decode_mode=mode)
    assert run_joining_workload(engine) == eager_tokens
    assert sum(len(t) for t in eager_tokens.values()) == 6 + 15 + 24 + 20 + 20


def shapes_used(engine: Engine) -> list[Shape]:
    """Run the joining workload, noting the bucket shape of every decode step."""
    recordings = recordings_of(engine)
    assert recordings is not None
    seen: list[Shape] = []
    run = recordings.run

    def noting(plan: DecodePlan, cache: CacheRows) -> torch.Tensor:
        seen.append(Shape(*plan.shape))
        return run(plan, cache)

    recordings.run = noting  # type: ignore[method-assign]
    run_joining_workload(engine)
    return seen


def test_lazy_recordings_are_one_per_shape_not_per_row_set(tiny_llama_dir: Path) -> None:
    """Rows join and leave under a recording: it is made over the empty selection, so a
    changed batch membership replays it. Recordings = shapes used, not steps."""
    engine = tiny_engine(tiny_llama_dir, decode_mode="recorded")
    used = shapes_used(engine)
    recordings = recordings_of(engine)
    assert recordings is not None
    assert recordings.num_recorded == recordings.num_cold == len(set(used)) < len(used)
    assert recordings.num_replays == len(used) - len(set(used))
    assert all(r.seq_ids == () for r in recordings.by_shape.values())
    assert recordings.num_eager_fallback == 0


def test_a_warmed_engine_runs_unlisted_shapes_eagerly(
    tiny_llama_dir: Path, eager_tokens: dict
) -> None:
    """Nothing is recorded in front of a client: a shape outside the warm list runs eagerly
    and is counted; the tokens are the eager engine's."""
    engine = tiny_engine(tiny_llama_dir, decode_mode="recorded")
    listed = warm_shapes(buckets_of(engine), max_rows=2)
    warm(engine, listed)
    recordings = recordings_of(engine)
    assert recordings is not None
    before = recordings.num_recorded
    used = shapes_used(engine)
    outside = [s for s in used if s not in set(listed)]
    assert outside and recordings.num_eager_fallback == len(outside)
    assert recordings.num_recorded == before and recordings.num_cold == 0
    assert recordings.num_replays == len(used) - len(outside)
    engine2 = tiny_engine(tiny_llama_dir, decode_mode="recorded")
    warm(engine2, listed)
    assert run_joining_workload(engine2) == eager_tokens


def test_persistent_inputs_never_move(tiny_llama_dir: Path) -> None:
    engine = tiny_engine(tiny_llama_dir, decode_mode="persistent")
    runner = engine.runner
    inputs = runner.inputs
    assert inputs is not None and isinstance(inputs.table, SlotTable)
    before = (inputs.table.address, inputs.buffers.addresses())
    run_joining_workload(engine)
    assert (inputs.table.address, inputs.buffers.addresses()) == before


def test_an_unknown_decode_mode_is_named() -> None:
    from nanoserve.runtime.engine.config.engine_config import EngineConfig

    with pytest.raises(
        EngineConfigError,
        match=r"^decode_mode must be one of eager, bucketed, persistent, recorded, got 'captured'$",
    ):
        EngineConfig(decode_mode="captured")


def test_bfloat16_is_batch_invariant(tiny_llama_dir: Path) -> None:
    """bf16 on a CPU takes the same recipe as float32 (fixed GEMM tiles, float64 attention):
    oneDNN's bf16 kernels were invariant by themselves on a Zen 4 but not on an Intel AMX Xeon.
    Alone == batched == recorded, tokens and logprobs."""
    from nanoserve.runtime.engine.config.engine_config import EngineConfig
    from nanoserve.runtime.engine.engine import Engine
    from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
    from nanoserve.runtime.loading.checkpoint import load_checkpoint
    from nanoserve.runtime.model.llama import LlamaModel

    checkpoint = load_checkpoint(tiny_llama_dir)
    model = LlamaModel.from_tensors(
        checkpoint.config, checkpoint.tensors(), dtype=torch.bfloat16, max_positions=256
    )
    assert model.accum_dtype == torch.float64
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3)

    def run(prompts: list[list[int]], **mode: Any) -> dict[str, tuple]:
        engine = Engine.from_config(
            model,
            checkpoint.tokenizer,
            EngineConfig(
                max_model_len=256, block_size=4, kv_budget_bytes=1 << 22, width_multiple=8, **mode
            ),
        )
        for i, ids in enumerate(prompts):
            engine.add_request(str(i), ids, params)
        out: dict[str, list] = {}
        for delta in engine.run_until_done():
            out.setdefault(delta.request_id, []).append((delta.token_ids, delta.logprobs))
        return {k: tuple(v) for k, v in out.items()}

    prompts = [[5, 17, 3, 99, 250, 31, 7], [120, 64, 8], [9] * 20, [3, 1, 4, 1, 5, 9, 2, 6]]
    alone = run(prompts[:1])["0"]
    assert run(prompts)["0"] == alone
    assert run(prompts, decode_mode="recorded")["0"] == alone


def test_persistent_equals_recorded_where_the_blas_is_not_batch_invariant(
    tiny_llama_dir: Path,
) -> None:
    """The recorded step computes logits for every row of its bucket; the eager step of the
    same bucket must too, or the output projection runs on another row count (3 rows and 4
    take different MKL kernels, as cuBLAS may pick another per count) and the logits differ in
    their low bits. With batch invariance off (CUDA's setting), persistent == recorded still
    holds bit for bit: the same shapes, the same kernels."""
    from nanoserve.runtime.engine.config.engine_config import EngineConfig
    from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
    from nanoserve.runtime.loading.checkpoint import load_checkpoint
    from nanoserve.runtime.model.llama import LlamaModel

    checkpoint = load_checkpoint(tiny_llama_dir)
    model = LlamaModel.from_tensors(
        checkpoint.config, checkpoint.tensors(), batch_invariant=False, max_positions=256
    )
    assert model.invariance == "bucket shape"
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=2)

    def run(mode: str) -> dict[str, list[tuple]]:
        config = EngineConfig(
            max_model_len=256,
            block_size=4,
            kv_budget_bytes=1 << 22,
            width_multiple=8,
            decode_mode=mode,
        )
        engine = Engine.from_config(model, checkpoint.tokenizer, config)
        for i, ids in enumerate(([5, 17, 3, 99], [120, 64, 8], [11, 13, 17, 19, 23])):
            engine.add_request(str(i), ids, params)  # 3 rows: the bucket of 4
        out: dict[str, list[tuple]] = {}
        for delta in engine.run_until_done():
            out.setdefault(delta.request_id, []).append((delta.token_ids, delta.top_logprobs))
        return out

    assert run("persistent") == run("recorded")

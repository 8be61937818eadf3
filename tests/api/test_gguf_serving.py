"""A GGUF as people download it, served end to end: every weight type the kernels read, mixed
within layers (and one F16 tensor, re-quantized), over the OpenAI API on a real engine,
in-process. /health says what is served; answers are the same alone, batched and streamed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from nanoserve.api.server.engine_client import build_async_engine
from nanoserve.api.server.state import ServerState
from nanoserve.core.draft_budget import DraftCost
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.config.speculative_config import SpeculativeConfig
from nanoserve.runtime.engine.serving.async_engine import AsyncEngine
from tests.api.fake_server import fake_server


def async_engine(server: ServerState) -> AsyncEngine:
    """The server's engine client, which is the real engine's here."""
    assert isinstance(server.engine, AsyncEngine), server.boot_error
    return server.engine


pytestmark = pytest.mark.anyio

SERVED = {
    "q6_k": 3, "q8_0": 3, "q4_k": 2, "q5_0": 2,
    "q5_k": 1, "q4_0": 1, "q3_k": 1, "q5_1": 1, "q4_1": 1, "q2_k": 1,
}  # fmt: skip


async def complete(client: AsyncTestClient, prompt: str, **fields: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True, **fields}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def served_config(gguf: Path, **fields: Any) -> EngineConfig:
    """The server's defaults for the file, in a small pool."""
    return EngineConfig(
        model=str(gguf),
        quantize="auto",
        dtype="auto",
        prefill_budget="auto",
        max_model_len=128,
        max_batch=4,
        kv_budget_bytes=8 << 20,
        **fields,
    )


async def test_a_mixed_gguf_is_served_in_its_own_types(tiny_mixed_gguf: Path) -> None:
    config = served_config(tiny_mixed_gguf)
    async with fake_server(factory=build_async_engine, engine=config) as (client, server):
        assert server.engine is not None, server.boot_error
        health = (await client.get("/health")).json()
        assert health["quantize"] == "gguf" and health["kernels"].startswith("gguf nanoserve/")
        served = {kind: int(n) for kind, n in (p.split("×") for p in health["weights"].split())}
        assert served == SERVED
        assert health["weight_fallbacks"] == "f16×1 as q8_0 (re-quantized)"
        assert health["prefill_budget"]["prompt_token_ms"] > 0

        prompts = ["hello world", "the quick brown fox", "def main():", "naïve café"]
        alone = [(await complete(client, p))["choices"][0]["text"] for p in prompts]
        together = await asyncio.gather(*(complete(client, p) for p in prompts))
        assert [r["choices"][0]["text"] for r in together] == alone  # batch-invariant
        assert all(r["usage"]["completion_tokens"] == 12 for r in together)

        streamed = []
        body = {"prompt": prompts[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
            async for line in s.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    streamed.append(json.loads(line[6:])["choices"][0]["text"])
        assert "".join(streamed) == alone[0]
        assert server.engine.status().blocks_in_use == 0


async def test_speculation_is_served_and_changes_no_greedy_answer(tiny_mixed_gguf: Path) -> None:
    """The same file with prompt lookup on, priced free so that every row with a match drafts:
    the same greedy text for prompts that quote themselves, tokens drafted and accepted by the
    speculator's counters on /health and /metrics, and no block left held."""
    prompts = ["abc abc abc abc", "the cat the cat the cat", "1 2 3 1 2 3 1 2", "xyz"]
    answers = {}
    for speculative in (None, SpeculativeConfig(num_speculative_tokens=4)):
        config = served_config(tiny_mixed_gguf, speculative=speculative)
        async with fake_server(factory=build_async_engine, engine=config) as (client, server):
            assert server.engine is not None, server.boot_error
            if (speculator := async_engine(server).engine.speculator) is not None:
                # The boot timed its steps; a draft token on this tiny model may time as free
                # (per_draft_s is clamped at 0: a fresh clone's CI measured exactly that).
                assert speculator.cost.base_s > 0 and speculator.cost.per_draft_s >= 0
                speculator.cost = DraftCost(
                    base_s=1.0, per_row_s=0.0, switch_s=0.0, per_draft_s=0.0
                )
                speculator.calibrate = False
            together = await asyncio.gather(*(complete(client, p, max_tokens=24) for p in prompts))
            answers[speculative is not None] = [r["choices"][0]["text"] for r in together]
            health = (await client.get("/health")).json()
            metrics = (await client.get("/metrics")).text
            assert server.engine.status().blocks_in_use == 0
    assert answers[True] == answers[False]
    assert health["speculation"]["method"] == "ngram"
    assert health["speculation"]["num_speculative_tokens"] == 4
    spec = health["speculation"]
    assert spec["draft_tokens"] > 0 and 0 < spec["accepted_tokens"] <= spec["draft_tokens"]
    counters = {
        name: float(value)
        for name, value in (
            line.split() for line in metrics.splitlines() if line.startswith("nanoserve:spec")
        )
        if "{" not in name
    }
    assert counters["nanoserve:spec_decode_num_draft_tokens_total"] == spec["draft_tokens"]
    assert counters["nanoserve:spec_decode_num_accepted_tokens_total"] == spec["accepted_tokens"]


async def test_a_draft_model_is_served_and_changes_no_greedy_answer(tiny_mixed_gguf: Path) -> None:
    """The file drafting for itself (`--draft-model` of the same GGUF), priced free so that
    every row drafts: the same greedy text as without, every draft accepted, the draft's pool
    on /health and empty after."""
    prompts = ["hello world", "the quick brown fox", "def main():", "naïve café"]
    answers = {}
    for speculative in (None, SpeculativeConfig.draft(str(tiny_mixed_gguf))):
        config = served_config(tiny_mixed_gguf, speculative=speculative)
        async with fake_server(factory=build_async_engine, engine=config) as (client, server):
            assert server.engine is not None, server.boot_error
            if (speculator := async_engine(server).engine.speculator) is not None:
                assert speculator.cost.propose_s > 0  # the boot timed the draft's forward
                speculator.cost = DraftCost(
                    base_s=1.0, per_row_s=0.0, switch_s=0.0, per_draft_s=0.0
                )
                speculator.calibrate = False
            together = await asyncio.gather(*(complete(client, p, max_tokens=24) for p in prompts))
            answers[speculative is not None] = [r["choices"][0]["text"] for r in together]
            health = (await client.get("/health")).json()
            assert server.engine.status().blocks_in_use == 0
            async_engine(server).engine.check_blocks()  # the draft's pool too: idle, so empty
    assert answers[True] == answers[False]
    spec = health["speculation"]
    assert spec["method"] == "draft_model" and spec["num_speculative_tokens"] == 5
    assert spec["proposer"].startswith("draft model mixed.gguf (gguf nanoserve/")
    assert "its K/V pool" in spec["proposer"]
    assert spec["accepted_tokens"] == spec["draft_tokens"] > 20


async def test_an_lfm2_gguf_is_served_with_its_state_on_health(tmp_path: Path) -> None:
    """The hybrid as llama.cpp's converter writes it (Q8_0 linears, F32 taps), served with the
    server's defaults: /health shows its state slots and checkpoints beside the K/V pool,
    answers are the same alone and batched, and every state slot comes back."""
    from gguf import GGMLQuantizationType

    from tests import tiny_models

    model_dir = tiny_models.make_tiny_model_dir(tmp_path, arch="lfm2")
    gguf = tiny_models.write_tiny_gguf(
        model_dir, tmp_path / "lfm2.gguf", qtype=GGMLQuantizationType.Q8_0
    )
    async with fake_server(factory=build_async_engine, engine=served_config(gguf)) as (
        client,
        server,
    ):
        assert server.engine is not None, server.boot_error
        health = (await client.get("/health")).json()
        assert health["kernels"].startswith("gguf nanoserve/")
        assert health["state_pool"] == {  # 4 rows' slots, 4 checkpoints ("auto"), the sink
            "num_state_slots": 8,
            "sink_state_slot": 8,
            "state_bytes_per_slot": 3 * 64 * 2 * 4,  # three conv layers' [64, 2] windows
            "state_total_bytes": 9 * 3 * 64 * 2 * 4,
            "state_checkpoint_slots": 4,
            "state_checkpoint_bytes": 4 * 3 * 64 * 2 * 4,
            "tensors": 3,  # one window a layer
            "state_slots_in_use": 0,
        }
        assert health["kv_pool"]["num_layers"] == 1
        prompts = ["hello world", "the quick brown fox", "def main():", "naïve café"]
        alone = [(await complete(client, p))["choices"][0]["text"] for p in prompts]
        together = await asyncio.gather(*(complete(client, p) for p in prompts))
        assert [r["choices"][0]["text"] for r in together] == alone
        assert async_engine(server).engine.scheduler.state_slots.num_used == 0
        assert server.engine.status().blocks_in_use == 0


async def test_a_gguf_served_with_a_quantized_kv_cache(tmp_path: Path) -> None:
    """`--kv-cache-dtype k=q8_0,v=q4_0` through the server: /health, /metrics and the pool plan
    say it, the pool holds more blocks in the same budget, answers are the same alone and
    batched, and every block comes back."""
    from gguf import GGMLQuantizationType

    from tests import tiny_models

    model_dir = tiny_models.make_tiny_model_dir(  # heads of 32: one block each
        tmp_path, arch="llama", num_attention_heads=2, num_key_value_heads=1
    )
    gguf = tiny_models.write_tiny_gguf(model_dir, tmp_path / "h32.gguf",
                                       qtype=GGMLQuantizationType.Q8_0)  # fmt: skip
    blocks = {}
    for kv in ("auto", "k=q8_0,v=q4_0"):
        async with fake_server(
            factory=build_async_engine, engine=served_config(gguf, kv_cache_dtype=kv)
        ) as (client, server):
            assert server.engine is not None, server.boot_error
            health = (await client.get("/health")).json()
            blocks[kv] = health["kv_pool"]["num_blocks"]
            if kv == "auto":
                assert health["kv_cache_dtype"] == "float16"
                continue
            assert health["kv_cache_dtype"] == health["kv_pool"]["kv_cache_dtype"] == kv
            metrics = (await client.get("/metrics")).text
            assert f'cache_dtype="{kv}"' in metrics
            prompts = ["hello world", "the quick brown fox", "def main():", "naïve café"]
            alone = [(await complete(client, p))["choices"][0]["text"] for p in prompts]
            together = await asyncio.gather(*(complete(client, p) for p in prompts))
            assert [r["choices"][0]["text"] for r in together] == alone
            assert server.engine.status().blocks_in_use == 0
    # 8 MiB of 16-slot blocks; a slot is 2 layers x 1 head of (K + V): 2 x 64 bytes in float16,
    # 34 + 18 in blocks: (2^23 - 256) // 4096 and (2^23 - 104) // 1664
    assert blocks == {"auto": 2047, "k=q8_0,v=q4_0": 5041}

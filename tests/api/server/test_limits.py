"""Each bound on a request, at its edge: the last value served, the first refused (400, naming
the field), over a real engine on the tiny random model, in-process. Prompt tokens (the
context), n, best_of, stop strings and logit_bias entries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from nanoserve.api.server.engine_client import build_async_engine
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.requests.sampling_params import MAX_LOGIT_BIAS
from tests.api.fake_server import fake_server, openai_error

pytestmark = pytest.mark.anyio

MAX_MODEL_LEN = 64


@pytest.fixture()
async def client(tiny_model_dir: Path) -> AsyncIterator[AsyncTestClient]:
    config = EngineConfig(
        model=str(tiny_model_dir),
        max_model_len=MAX_MODEL_LEN,
        max_batch=8,
        max_waiting=64,
        kv_budget_bytes=8 << 20,
    )
    async with fake_server(factory=build_async_engine, engine=config) as (client, server):
        assert server.engine is not None, server.boot_error
        yield client
        deadline = time.monotonic() + 5
        while server.engine.status().blocks_in_use and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert server.engine.status().blocks_in_use == 0


async def complete(client: AsyncTestClient, **fields: Any) -> Any:
    body = {"prompt": [5] * 4, "max_tokens": 1, "temperature": 0, **fields}
    return await client.post("/v1/completions", json=body)


async def served(client: AsyncTestClient, **fields: Any) -> dict[str, Any]:
    response = await complete(client, **fields)
    assert response.status_code == 200, response.text
    return response.json()


async def test_prompt_tokens_fill_the_context_and_no_more(client: AsyncTestClient) -> None:
    body = await served(client, prompt=[5] * (MAX_MODEL_LEN - 4), max_tokens=4, ignore_eos=True)
    assert body["usage"]["total_tokens"] == MAX_MODEL_LEN
    response = await complete(client, prompt=[5] * (MAX_MODEL_LEN - 3), max_tokens=4)
    openai_error(
        response,
        400,
        param="max_tokens",
        message=f"the prompt (61 tokens) plus max_tokens (4) exceeds max_model_len ({MAX_MODEL_LEN})",
    )


async def test_n_up_to_its_bound(client: AsyncTestClient) -> None:
    assert len((await served(client, n=64))["choices"]) == 64
    openai_error(
        await complete(client, n=65),
        400,
        param="n",
        message="n: must be an integer in [1, 64], got 65",
    )


async def test_best_of_up_to_its_bound(client: AsyncTestClient) -> None:
    body = await served(client, best_of=64, n=2)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 64  # one token from each of 64 samples
    openai_error(
        await complete(client, best_of=65),
        400,
        param="best_of",
        message="best_of must be an integer in [n, 64] (n is 1)",
    )


async def test_best_of_beyond_the_queue_names_best_of(tiny_model_dir: Path) -> None:
    config = EngineConfig(model=str(tiny_model_dir), max_model_len=MAX_MODEL_LEN, max_waiting=4)
    async with fake_server(factory=build_async_engine, engine=config) as (client, _):
        response = await complete(client, best_of=5)
    openai_error(
        response,
        400,
        param="best_of",
        message="best_of: n (5) exceeds the waiting queue's bound (4)",
    )


async def test_sixteen_stop_strings_and_no_more(client: AsyncTestClient) -> None:
    stops = [f"s{i}" for i in range(17)]
    await served(client, stop=stops[:16])
    response = await complete(client, stop=stops)
    error = openai_error(response, 400, param="stop")
    assert error["message"].startswith("stop: must be up to 16 non-empty strings, got (")


async def test_logit_bias_entries_up_to_its_bound(client: AsyncTestClient) -> None:
    bias = {str(token): 0.5 for token in range(MAX_LOGIT_BIAS + 1)}
    await served(client, logit_bias=dict(list(bias.items())[:MAX_LOGIT_BIAS]))
    openai_error(
        await complete(client, logit_bias=bias),
        400,
        param="logit_bias",
        message=f"logit_bias: at most {MAX_LOGIT_BIAS} entries, got {MAX_LOGIT_BIAS + 1}",
    )

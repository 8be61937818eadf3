"""The token routes on the live server (the embedded SmolLM2's real tokenizer and template):
tokenize and detokenize round-trip, and a render's ids are the prompt the chat route bills."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Name a colour."}]


def test_tokenize_detokenize_round_trip(http: httpx.Client) -> None:
    text = "Bonjour, le monde! 123"
    tokens = http.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    assert tokens["count"] == len(tokens["tokens"]) == len(tokens["token_strs"])
    assert tokens["max_model_len"] == 1024
    back = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert back == {"prompt": text}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"response_format": {"type": "json_object"}},
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
            ]
        },
    ],
)
def test_render_is_the_prompt_the_chat_route_runs(
    http: httpx.Client, extra: dict[str, Any]
) -> None:
    body = {"messages": ASK, "max_tokens": 2, "temperature": 0, **extra}
    rendered = http.post("/v1/chat/completions/render", json=body).json()
    tokenized = http.post(
        "/tokenize",
        json={"messages": ASK, **({"tools": extra["tools"]} if "tools" in extra else {})},
    ).json()
    answer = http.post("/v1/chat/completions", json=body).json()
    assert len(rendered["token_ids"]) == answer["usage"]["prompt_tokens"]
    assert rendered["prompt"].endswith("<|im_start|>assistant\n")
    assert (
        http.post("/detokenize", json={"tokens": rendered["token_ids"]}).json()["prompt"]
        == rendered["prompt"]
    )
    assert tokenized["tokens"] == rendered["token_ids"]

"""--api-key: every route but /health wants `Authorization: Bearer KEY`; 401 otherwise."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

KEY = "sk-test-0123456789"
ROUTES = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("GET", "/metrics", None),
    ("GET", "/schema/openapi.json", None),
]
WRONG = [
    None,
    f"Bearer {KEY}x",
    f"Bearer {KEY[:-1]}",
    KEY,
    f"bearer{KEY}",
    "Bearer",
    f"Basic {KEY}",
    f"Bearer  {KEY}",
]


@pytest.fixture(scope="module")
def keyed(start_server: Callable[..., Any], tiny_model_dir: Path) -> Iterator[Any]:
    live = start_server(
        str(tiny_model_dir), "--api-key", KEY, "--max-batch", "4", "--kv-budget", "16MiB"
    )
    yield live
    code = live.stop()
    assert code == 0, f"exit {code} on SIGTERM:\n{live.log()}"


@pytest.mark.parametrize("authorization", WRONG, ids=[f"wrong{i}" for i in range(len(WRONG))])
@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
def test_missing_or_wrong_key_is_401(
    keyed: Any,
    assert_openai_error: Callable[..., dict[str, Any]],
    method: str,
    path: str,
    body: dict[str, Any] | None,
    authorization: str | None,
) -> None:
    headers = {"authorization": authorization} if authorization is not None else {}
    response = httpx.request(method, keyed.url + path, json=body, headers=headers, timeout=30)
    error = assert_openai_error(response, 401)
    assert error["type"] == "authentication_error"
    assert KEY not in response.text


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
def test_right_key_is_accepted(
    keyed: Any, method: str, path: str, body: dict[str, Any] | None
) -> None:
    response = httpx.request(
        method, keyed.url + path, json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert response.status_code == 200, response.text


def test_health_is_public(keyed: Any) -> None:
    assert httpx.get(f"{keyed.url}/health", timeout=10).status_code == 200
    bad = httpx.get(f"{keyed.url}/health", headers={"authorization": "Bearer nope"}, timeout=10)
    assert bad.status_code == 200


def test_unknown_route_without_key(
    keyed: Any, assert_openai_error: Callable[..., dict[str, Any]]
) -> None:
    # Routing comes first: an unknown path is 404 whether or not a key is sent.
    assert_openai_error(httpx.get(f"{keyed.url}/v1/nothing", timeout=10), 404)


def test_openai_client_with_key(keyed: Any) -> None:
    import openai

    with openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=KEY, max_retries=0) as good:
        name = good.models.list().data[0].id
        out = good.completions.create(model=name, prompt="hi", max_tokens=3, temperature=0)
        assert out.usage.completion_tokens >= 1
    with (
        openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="wrong", max_retries=0) as bad,
        pytest.raises(openai.AuthenticationError),
    ):
        bad.models.list()

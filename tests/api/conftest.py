"""Live-server fixtures: real `nanoserve serve` processes on 127.0.0.1, free ports, real models.

`server` is the session's main server (the embedded SmolLM2, small limits). Modules that need a
differently configured server start their own, module-scoped, through `start_server`, so only
the runs that need them pay for their boot. `tiny_model_dir` is a random-weight Hugging Face
checkpoint (transformers' own `save_pretrained`) for servers whose answers do not matter.

pytest runs with `--import-mode=importlib`: test modules cannot import from here, so the helpers
are handed out as fixtures (`start_server`, `run_cli`, `LiveServer` objects).

These are for what only a real engine or a real process shows (real tokens, the warm-up, the
shutdown, the OpenAI client over a socket). Error shapes, auth, SSE framing and field validation
are tested in-process over a FakeEngine (`tests/api/fake_engine.py`, `fake_server.py`), in
milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NANOSERVE = [sys.executable, "-m", "nanoserve.api.cli"]
# The main server: the embedded model, small limits, a small body limit for the 413 test.
MAIN_ARGS = (
    "--max-batch", "8",
    "--max-model-len", "1024",
    "--kv-budget", "256MiB",
    "--max-body-bytes", "64KiB",
    "--grace-seconds", "2",
)  # fmt: skip
BOOT_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without NANOSERVE_* (a developer's settings must not leak in), and with
    no timing or expert cache: a test's server times its own steps, packs its own experts and
    leaves no file behind."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANOSERVE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["NANOSERVE_TIMING_CACHE"] = "off"
    env["NANOSERVE_EXPERT_CACHE"] = "off"
    env.update(extra)
    return env


class LiveServer:
    """One server process: its URL, its log, and a SIGTERM stop that reports the exit code."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        """Poll /health until 200; fail with the server's log if it exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    pytest.fail(
                        f"server exited with {self.proc.returncode} before it was ready:\n"
                        f"{self.log()}"
                    )
                try:
                    response = client.get(f"{self.url}/health")
                    if response.status_code == 200:
                        return
                    last = f"{response.status_code} {response.text[:200]}"
                except httpx.TransportError as error:  # refused until uvicorn binds
                    last = repr(error)
                time.sleep(0.2)
        self.kill()
        pytest.fail(f"server not ready within {timeout_s:.0f} s (last: {last}):\n{self.log()}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then wait; a server that hangs is killed and the test fails."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"server ignored SIGTERM for {timeout_s:.0f} s:\n{self.log()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def start_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., LiveServer]]:
    """`start_server(*args, cmd=None, env=None, cwd=None, wait=True) -> LiveServer`, ready
    (unless `wait=False`: then the caller calls `wait_ready()`).

    `cmd` defaults to `python -m nanoserve.api.cli serve --port PORT`; pass `cmd` (a list, with
    `{port}` in it) to start something else, e.g. `litestar run`. Processes left running at the
    end of the session are killed.
    """
    started: list[LiveServer] = []
    logs = tmp_path_factory.mktemp("server-logs")

    def start(
        *args: str,
        cmd: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        wait: bool = True,
    ) -> LiveServer:
        port = free_port()
        if cmd is None:
            argv = [*NANOSERVE, "serve", "--port", str(port), *args]
        else:
            argv = [part.format(port=port) for part in cmd] + list(args)
        log_path = logs / f"server-{port}.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env if env is not None else clean_env(),
                cwd=cwd or REPO_ROOT,
            )
        server = LiveServer(proc, port, log_path)
        started.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="session")
def server(start_server: Callable[..., LiveServer]) -> Iterator[LiveServer]:
    """The main server: embedded SmolLM2, max batch 8, 1024-token contexts, 64 KiB bodies."""
    live = start_server(*MAIN_ARGS)
    yield live
    code = live.stop()
    assert code == 0, f"server exited with {code} on SIGTERM:\n{live.log()}"


@pytest.fixture(scope="session")
def model_name(server: LiveServer) -> str:
    return httpx.get(f"{server.url}/health", timeout=5).json()["model"]


@pytest.fixture()
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        yield client


@pytest.fixture()
def client(server: LiveServer) -> Iterator[Any]:
    """The official `openai` client, pointed at the main server."""
    import openai

    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60.0
    ) as oai:
        yield oai


@pytest.fixture(scope="session")
def assert_openai_error() -> Callable[..., dict[str, Any]]:
    """`assert_openai_error(response, status, param=...) -> error`: status and body shape."""
    from tests.api.fake_server import openai_error  # imports litestar: only where tests run

    return openai_error


@pytest.fixture(scope="session")
def metrics_of() -> Callable[[LiveServer], dict[str, float]]:
    """`metrics_of(server) -> {sample name{labels}: value}`, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    def scrape(live: LiveServer) -> dict[str, float]:
        response = httpx.get(f"{live.url}/metrics", timeout=10)
        assert response.status_code == 200, response.text
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return samples

    return scrape


@pytest.fixture(scope="session", name="clean_env")
def clean_env_fixture() -> Callable[..., dict[str, str]]:
    """`clean_env(**extra) -> env`: this environment without NANOSERVE_*, plus `extra`."""
    return clean_env


@pytest.fixture(scope="session")
def litestar_bin() -> str:
    path = BIN / "litestar"
    if not path.exists():
        pytest.skip(f"no litestar executable beside {sys.executable}")
    return str(path)


@pytest.fixture(scope="session")
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_cli(*args, timeout=120, env=None) -> CompletedProcess` of `python -m nanoserve.api.cli`."""

    def run(
        *args: str, timeout: float = 120.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*NANOSERVE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env if env is not None else clean_env(),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
        )

    return run


# -- a tiny random-weight model, for servers whose answers do not matter ---------------------------

_TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GGUF of every weight type, mixed within layers (tests/tiny_models.py)."""
    from tests import tiny_models

    return tiny_models.write_mixed_gguf(tmp_path_factory.mktemp("mixed"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight Llama (hidden 64, 2 layers) with a 320-token byte-level BPE."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = tmp_path_factory.mktemp("tiny-model")
    config = transformers.LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(out)

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["hello world, the quick brown fox"] * 3, trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "chat_template": _TINY_CHAT_TEMPLATE,
            }
        )
    )
    return out


@pytest.fixture(scope="session")
def tiny_embedder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 embedder as sentence-transformers saves one (last-token pooling, normalized)."""
    from tests import tiny_models

    return tiny_models.make_tiny_embedder_dir(tmp_path_factory.mktemp("embedder"))

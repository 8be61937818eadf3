"""Fixtures for runtime tests: tiny random-weight models, and the embedded model with its reference.

The tiny models (tests/tiny_models.py) are real Hugging Face checkpoints, small enough to build in
well under a second, the GGUF files llama.cpp's converter would make of them, and a GGUF of every
weight type.

pytest runs with `--import-mode=importlib`, so test modules cannot import helpers from here or
from each other: the helpers are handed out as fixtures instead (`make_tiny_model_dir`,
`write_tiny_gguf`, `hf_state_dict`, `llamacpp_permute`), each returning the function itself.

The embedded model's transformers reference (`hf_reference_model`) takes ~15-30 s to load, so it is
loaded once per session and shared; tests must not modify it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.loading.embedded import embedded_model_path
from tests import tiny_models
from tests.runtime import isa_paths

# -- the helpers, as fixtures --------------------------------------------------------------------


@pytest.fixture(scope="module")
def runnable_isas() -> Iterator[list[str]]:
    """The kernel ISA paths this CPU runs, worst first (the kernels built and loaded)."""
    yield from isa_paths.runnable_isas()


@pytest.fixture(scope="session")
def make_tiny_model_dir() -> Callable[..., Path]:
    """`make_tiny_model_dir(tmp_path, arch="llama", tie=True, seed=0, **overrides) -> Path`."""
    return tiny_models.make_tiny_model_dir


@pytest.fixture(scope="session")
def make_tiny_embedder_dir() -> Callable[..., Path]:
    """`make_tiny_embedder_dir(tmp_path, pooling="lasttoken", *, dense=None, seed=0) -> Path`."""
    return tiny_models.make_tiny_embedder_dir


@pytest.fixture(scope="session")
def make_tiny_classifier_dir() -> Callable[..., Path]:
    """`make_tiny_classifier_dir(tmp_path, num_labels=1, seed=0) -> Path`."""
    return tiny_models.make_tiny_classifier_dir


@pytest.fixture(scope="session")
def write_tiny_gguf() -> Callable[..., Path]:
    """`write_tiny_gguf(model_dir, out, *, qtype=F32, raw_tensors=None, arch=None, pre="smollm")`."""
    return tiny_models.write_tiny_gguf


@pytest.fixture(scope="session")
def random_blocks() -> Callable[..., np.ndarray]:
    """`random_blocks(kind, rows, cols, seed, scale=0.01)`: valid GGUF bytes of any type."""
    return tiny_models.random_blocks


@pytest.fixture(scope="session")
def hf_state_dict() -> Callable[[Path], dict[str, torch.Tensor]]:
    """`hf_state_dict(model_dir)`: the weights as transformers loads them (tied lm_head dropped)."""
    return tiny_models.hf_state_dict


@pytest.fixture(scope="session")
def llamacpp_permute() -> Callable[[np.ndarray, int], np.ndarray]:
    """`llamacpp_permute(weight, num_heads)`: llama.cpp's Q/K row permutation."""
    return tiny_models.llamacpp_permute


# -- tiny models, built once per session (read-only: tests must not write into them) -------------


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), arch="llama", tie=True)


@pytest.fixture(scope="session")
def tiny_llama_untied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), arch="llama", tie=False)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), arch="qwen2", tie=False)


@pytest.fixture(scope="session")
def tiny_mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GGUF holding every weight type the kernels read, mixed within layers."""
    return tiny_models.write_mixed_gguf(tmp_path_factory.mktemp("mixed"))


# -- the embedded model and its transformers reference --------------------------------------------


@pytest.fixture(scope="session")
def embedded_gguf() -> Path:
    return embedded_model_path()


@pytest.fixture(scope="session")
def embedded_checkpoint(embedded_gguf: Path) -> Checkpoint:
    return load_checkpoint(embedded_gguf)


@pytest.fixture(scope="session")
def embedded_tensors(embedded_checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """All of the embedded model's tensors, dequantized by nanoserve (~540 MB, float32)."""
    return dict(embedded_checkpoint.tensors())


@pytest.fixture(scope="session")
def hf_reference_model(embedded_gguf: Path) -> Iterator[Any]:
    """transformers' own float32 load of the embedded GGUF, in eval mode. Do not modify it."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        embedded_gguf.parent, gguf_file=embedded_gguf.name, dtype=torch.float32
    )
    model.eval()
    yield model


@pytest.fixture(scope="session")
def hf_reference_tokenizer(embedded_gguf: Path) -> Any:
    """transformers' tokenizer rebuilt from the embedded GGUF's metadata."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(
        embedded_gguf.parent, gguf_file=embedded_gguf.name
    )


# -- engines over the tiny Llama (fp32, batch-invariant), for the engine suite --------------------


@pytest.fixture(scope="session")
def tiny_llama_checkpoint(tiny_llama_dir: Path) -> Checkpoint:
    return load_checkpoint(tiny_llama_dir)


@pytest.fixture(scope="session")
def tiny_llama_weights(tiny_llama_checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """The tiny Llama's tensors, read once; engines share them (the model never writes weights)."""
    return dict(tiny_llama_checkpoint.tensors())


@pytest.fixture(scope="session")
def tiny_mixed_checkpoint(tiny_mixed_gguf: Path) -> Checkpoint:
    return load_checkpoint(tiny_mixed_gguf)


@pytest.fixture(scope="session")
def tiny_mixed_sources(tiny_mixed_checkpoint: Checkpoint) -> dict[str, Any]:
    """Its tensors as the gguf form reads them: blocks (views of the file), norms as floats."""
    from nanoserve.runtime.model.weight_forms import kept_blocks

    return dict(tiny_mixed_checkpoint.sources(kept_blocks("gguf")))


@pytest.fixture(scope="session")
def tiny_engine_builder(
    tiny_llama_checkpoint: Checkpoint,
    tiny_llama_weights: dict[str, torch.Tensor],
    request: pytest.FixtureRequest,
) -> Callable[..., Any]:
    """`build(*, num_blocks=None, mixed=False, **config) -> Engine` over the tiny Llama, with no
    teardown check.

    Defaults: block_size 4, max_model_len 128, max_batch 16, fp32, batch_invariant, 256 blocks.
    `num_blocks` sizes `kv_budget_bytes` to exactly that many blocks; `dtype=torch.bfloat16`
    and `quantize="q4"` (nanoserve's CPU kernels) change the forms; `mixed=True` serves the
    tiny GGUF of every weight type (`tiny_mixed_gguf`, quantize "gguf") instead. Prefer
    `make_tiny_engine`. `draft=` a LlamaModel is speculative method draft_model's draft.
    """
    from nanoserve.runtime.engine.config.engine_config import EngineConfig
    from nanoserve.runtime.engine.engine import Engine
    from nanoserve.runtime.model.llama import LlamaModel
    from nanoserve.runtime.text.chat_template import ChatTemplate

    def build(
        *,
        num_blocks: int | None = None,
        dtype: torch.dtype = torch.float32,
        mixed: bool = False,
        **overrides: Any,
    ) -> Engine:
        if mixed:
            ck = request.getfixturevalue("tiny_mixed_checkpoint")
            weights = request.getfixturevalue("tiny_mixed_sources")
        else:
            ck, weights = tiny_llama_checkpoint, tiny_llama_weights
        template = ChatTemplate.from_checkpoint(ck)
        config = {"block_size": 4, "max_model_len": 128, "max_batch": 16, **overrides}
        if num_blocks is None and "kv_budget_bytes" not in overrides:
            num_blocks = 256  # not the 1 GiB default: zeroing it costs seconds per engine
        if num_blocks is not None:
            # 2 (K and V) x layers x KV heads x head dim x bytes, per slot; one more: the sink.
            per_slot = 2 * ck.config.num_layers * ck.config.num_kv_heads * ck.config.head_dim
            per_slot *= dtype.itemsize
            config["kv_budget_bytes"] = per_slot * (num_blocks * config["block_size"] + 1)
        model = LlamaModel.from_tensors(
            ck.config,
            weights.items(),
            dtype=dtype,
            batch_invariant=True,
            max_positions=config["max_model_len"],
            quantize=config.get("quantize"),
        )
        draft = config.pop("draft", None)
        return Engine.from_config(
            model,
            ck.tokenizer,
            EngineConfig(**config),
            chat_template=template,
            name="tiny",
            draft=draft,
        )

    return build


@pytest.fixture
def make_tiny_engine(tiny_engine_builder: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """`make_tiny_engine(*, num_blocks=None, **config) -> Engine` (see `tiny_engine_builder`).

    At teardown every engine it built must pass `check_blocks()`, and an idle one must hold no
    block: a test that leaks blocks fails even if its own assertions passed.
    """
    engines: list[Any] = []

    def make(**kwargs: Any) -> Any:
        engine = tiny_engine_builder(**kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.check_blocks()
        if not engine.has_unfinished and engine.blocks.num_in_use:
            raise AssertionError(f"an idle engine holds {engine.blocks.num_in_use} blocks")


@pytest.fixture(scope="module")
def single_torch_thread() -> Iterator[None]:
    """One intra-op thread for the module: tiny-model steps on 2 shared cores run 10-30x faster
    than with torch's 2 threads spinning against other processes (and the tokens are the same)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

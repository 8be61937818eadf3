"""Granite 4.0-H: Mamba2 layers carrying a convolution window and a state per head, beside
attention without rotary, with its embedding, residual, attention and logit multipliers.

Greedy tokens and logits against transformers, with prompts cut into chunks; llama.cpp's GGUF
gives the checkpoint's tokens; the mixture-of-experts sizes are refused at load. Preemption,
the prefix cache's checkpoints and speculation's refusal are in test_hybrid_engine.py; alone,
batched, eager, bucketed, recorded (on torch and on nanoserve's kernels) and the CUDA trace
are in test_architectures.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel
from tests.runtime.hybrid_engine import (
    PROMPT,
    engine_of,
    greedy,
    transformers_greedy,
)
from tests.runtime.paged_logits import paged_logits, rel_error

LONG = [(i * 37 + 5) % 300 for i in range(150)]  # crosses Mamba2's 64-token blocks twice
ARCH = "granitemoehybrid"


@pytest.fixture(scope="module")
def granite_dir(
    tmp_path_factory: pytest.TempPathFactory, make_tiny_model_dir: Callable[..., Path]
) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp(ARCH), arch=ARCH)


@pytest.fixture(scope="module")
def reference(granite_dir: Path) -> object:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(granite_dir).eval()


def test_the_config_is_read_as_a_hybrid(granite_dir: Path) -> None:
    config = load_checkpoint(granite_dir).config
    assert (config.attention_layers, config.recurrent_layers) == ((1,), (0, 2, 3))
    # per Mamba2 layer: the window over x, B and C (128 + 2 x 2 x 16 wide, 3 past inputs) and
    # 8 heads' 16 x 16 state
    assert config.state_shapes == ((192, 3), (8, 16, 16)) * 3
    assert config.no_rope_layers == (0, 1, 2, 3)  # position_embedding_type "nope"
    multipliers = (config.embedding_multiplier, config.residual_multiplier, config.logits_scaling)
    assert multipliers == (2.0, 0.5, 4.0) and config.attention_scale == 0.2


@pytest.mark.parametrize("chunk", [None, 7, 1, 70])
def test_logits_match_transformers_across_chunk_boundaries(
    granite_dir: Path, reference: object, chunk: int | None
) -> None:
    checkpoint = load_checkpoint(granite_dir)
    model = LlamaModel.from_tensors(checkpoint.config, checkpoint.tensors(), max_positions=256)
    with torch.no_grad():
        expected = reference(torch.tensor([LONG])).logits[0]  # type: ignore[operator]
    assert rel_error(paged_logits(model, LONG, chunk), expected) < 1e-4


def test_greedy_tokens_are_transformers_recomputing_everything(
    granite_dir: Path, reference: object
) -> None:
    tokens, _ = greedy(engine_of(granite_dir, max_num_batched_tokens=7), [PROMPT])
    assert tokens["0"] == transformers_greedy(reference, PROMPT)


def test_micro_has_no_experts_and_tiny_routes(
    granite_dir: Path, tmp_path: Path, make_tiny_model_dir: Callable[..., Path]
) -> None:
    """Micro (`num_local_experts: 0`) is the dense MLP alone; with experts (Tiny, Small) every
    layer routes beside it (served in test_mixture_of_experts.py)."""
    assert load_checkpoint(granite_dir).config.experts is None
    moe = make_tiny_model_dir(tmp_path, arch=ARCH, num_local_experts=4, num_experts_per_tok=2)
    experts = load_checkpoint(moe).config.experts
    assert experts is not None and experts.shared_is_mlp and experts.scoring == "topk_softmax"


def test_its_gguf_gives_the_checkpoints_tokens(
    granite_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    """llama.cpp's Granite hybrid GGUF: the shared MLP split, Q and K rows permuted,
    -exp(A_log) and D as columns, the norm by group, the multipliers as *_scale, no rotary."""
    path = write_tiny_gguf(granite_dir, tmp_path / "granitehybrid.gguf")
    config = load_checkpoint(path).config
    assert config.mamba == load_checkpoint(granite_dir).config.mamba
    assert (config.residual_multiplier, config.logits_scaling, config.attention_scale) == (
        0.5,
        4.0,
        pytest.approx(0.2),  # stored as float32
    )
    assert config.no_rope_layers == (0, 1, 2, 3) and not config.fused_mlp
    expected, _ = greedy(engine_of(granite_dir, max_num_batched_tokens=7), [PROMPT])
    tokens, _ = greedy(engine_of(path, max_num_batched_tokens=7), [PROMPT])
    assert tokens == expected

"""Qwen3.5: gated DeltaNet layers carrying a convolution window and a state matrix per value
head, beside gated attention with rotary on a quarter of each head.

Greedy tokens against transformers recomputing the whole sequence each step, with prompts cut
into chunks, on torch and on nanoserve's kernels (q8); the checkpoint with a vision tower
serves its language model; llama.cpp's GGUF gives the checkpoint's tokens. Preemption, the
prefix cache's checkpoints and speculation's refusal are in test_hybrid_engine.py; alone,
batched, eager, bucketed, recorded and the CUDA trace are in test_architectures.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from tests.runtime.hybrid_engine import (
    PROMPT,
    engine_of,
    greedy,
    transformers_greedy,
)
from tests.runtime.paged_logits import paged_logits, rel_error

LONG = [(i * 37 + 5) % 300 for i in range(150)]  # crosses DeltaNet's 64-token blocks twice


@pytest.fixture(scope="module")
def qwen_dir(
    tmp_path_factory: pytest.TempPathFactory, make_tiny_model_dir: Callable[..., Path]
) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("qwen3_5"), arch="qwen3_5")


@pytest.fixture(scope="module")
def reference(qwen_dir: Path) -> object:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(qwen_dir).eval()


def test_the_config_is_read_as_a_hybrid(qwen_dir: Path) -> None:
    config = load_checkpoint(qwen_dir).config
    assert config.architecture == "qwen3_5"
    assert config.attention_layers == (1,)
    assert config.recurrent_layers == (0, 2, 3)
    # per DeltaNet layer: the window over q, k, v (16 + 16 + 4 x 16 wide, 3 past inputs) and
    # 4 value heads' 16 x 16 state
    assert config.state_shapes == ((128, 3), (4, 16, 16)) * 3
    assert (config.rotary_dim, config.norm_offset, config.attn_output_gate) == (4, 1.0, True)


@pytest.mark.parametrize("chunk", [None, 7, 1, 70])
def test_logits_match_transformers_across_chunk_boundaries(
    qwen_dir: Path, reference: object, chunk: int | None
) -> None:
    """The state crosses every chunk boundary (and the 64-token blocks inside a chunk)."""
    from nanoserve.runtime.model.llama import LlamaModel

    checkpoint = load_checkpoint(qwen_dir)
    model = LlamaModel.from_tensors(checkpoint.config, checkpoint.tensors(), max_positions=256)
    with torch.no_grad():
        expected = reference(torch.tensor([LONG])).logits[0]  # type: ignore[operator]
    assert rel_error(paged_logits(model, LONG, chunk), expected) < 1e-4


@pytest.mark.parametrize("quantize", [None, "q8"])
def test_greedy_tokens_are_transformers_recomputing_everything(
    qwen_dir: Path, reference: object, quantize: str | None
) -> None:
    expected = transformers_greedy(reference, PROMPT)
    tokens, _ = greedy(engine_of(qwen_dir, quantize, max_num_batched_tokens=7), [PROMPT])
    assert tokens["0"] == expected


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory: pytest.TempPathFactory, qwen_dir: Path) -> tuple[Path, object]:
    """Qwen3_5ForConditionalGeneration's own save (and the model): the language model nested
    under `model.language_model.`, beside a one-block vision tower."""
    import transformers

    text = json.loads((qwen_dir / "config.json").read_text())
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 16,
    }
    config = transformers.Qwen3_5Config(
        text_config=text, vision_config=vision, tie_word_embeddings=True
    )
    model = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    out = tmp_path_factory.mktemp("qwen3_5-vl") / "model"
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((qwen_dir / name).read_bytes())
    return out, model


def test_the_checkpoint_with_a_vision_tower_serves_its_language_model(
    vl_model: tuple[Path, object],
) -> None:
    path, model = vl_model
    checkpoint = load_checkpoint(path)
    assert checkpoint.config.architecture == "qwen3_5"
    assert checkpoint.skipped == {"vision tower": 21}  # counted for the boot line
    tokens, _ = greedy(engine_of(path, max_num_batched_tokens=7), [PROMPT])
    assert tokens["0"] == transformers_greedy(model, PROMPT)


def test_the_boot_names_the_skipped_tower_and_the_state(vl_model: tuple[Path, object]) -> None:
    """What `nanoserve serve` runs, and says: the tower not loaded, the state's slots and
    bytes, the prefix cache off; then a chat through the template, greedy."""
    from nanoserve.runtime.engine.boot.build import build_engine
    from nanoserve.runtime.engine.config.engine_config import EngineConfig
    from nanoserve.runtime.engine.serving.llm import LLM

    said: list[str] = []
    config = EngineConfig(model=str(vl_model[0]), max_model_len=128, kv_budget_bytes=1 << 22)
    llm = LLM(engine=build_engine(config, say=said.append))
    assert "not loaded: the vision tower (21 tensors); the language model alone is served" in said
    per_slot = 3 * (128 * 3 + 4 * 16 * 16) * 4 / 2**10
    assert any(
        line.startswith("recurrent state: ")
        and f"{per_slot:.1f} KiB each" in line
        and line.endswith("float32, 3 layers)")
        for line in said
    ), said
    assert (
        "prefix cache: a state checkpoint every 32 blocks (512 tokens) and where a longer"
        f" prompt ends; a hit restores the deepest, {per_slot:.1f} KiB copied"
    ) in said
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    (out,) = llm.chat([{"role": "user", "content": "hello world"}], params)
    assert len(out.outputs[0].token_ids) == 8
    llm.engine.check_blocks()


def test_its_gguf_gives_the_checkpoints_tokens_and_skips_the_mtp_block(
    qwen_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    """llama.cpp's Qwen3.5 GGUF: value heads tiled, -exp(A_log), 1 + w norms, and an MTP block
    after the text model's (its 11 tensors skipped and counted for the boot line)."""
    path = write_tiny_gguf(qwen_dir, tmp_path / "qwen35.gguf", mtp_blocks=1)
    checkpoint = load_checkpoint(path)
    assert checkpoint.config.num_layers == 4
    assert checkpoint.config.delta_net is not None and checkpoint.config.delta_net.tiled
    assert checkpoint.skipped == {"MTP heads": 11}
    expected, _ = greedy(engine_of(qwen_dir, max_num_batched_tokens=7), [PROMPT])
    tokens, _ = greedy(engine_of(path, max_num_batched_tokens=7), [PROMPT])
    assert tokens == expected

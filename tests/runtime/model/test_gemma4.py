"""Gemma 4's deltas on the one forward (per-layer inputs, full layers with heads of their own
whose V is their K, proportional rotary, K/V shared by the last layers, v_norm, layer scalars,
the soft-capped logits): its config as read, its pool, its rotary tables and its logits against
transformers' own class; greedy tokens through the engine and after a prefix hit. Alone,
batched, eager, bucketed, recorded, on the kernels, from its GGUF and the CUDA trace are in
test_architectures.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.runtime.errors import ConfigError
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.loading.per_layer_inputs import PerLayerInputs
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.rotary import rotary_table
from tests.runtime.hybrid_engine import PROMPT, engine_of, greedy, transformers_greedy
from tests.runtime.paged_logits import fresh_pool, paged_logits, rel_error


@pytest.fixture(scope="module")
def gemma4_dir(
    tmp_path_factory: pytest.TempPathFactory, make_tiny_model_dir: Callable[..., Path]
) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("gemma4"), arch="gemma4")


@pytest.fixture(scope="module")
def reference(gemma4_dir: Path) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(gemma4_dir).eval()


def test_its_config_reads_every_delta(gemma4_dir: Path) -> None:
    config = load_checkpoint(gemma4_dir).config
    assert config.architecture == "gemma4"
    assert config.sliding_layers == (0, 2, 4) and config.sliding_window == 4
    assert (config.head_dim, config.full_head_dim, config.full_kv_heads) == (16, 32, 1)
    assert [config.layer_head_dim(i) for i in range(6)] == [16, 32] * 3
    assert [config.layer_kv_heads(i) for i in range(6)] == [2, 1] * 3
    assert config.shared_kv_layers == (4, 5) and config.kv_layers == (0, 1, 2, 3)
    assert [config.kv_source(i) for i in range(6)] == [0, 1, 2, 3, 2, 3]
    assert (config.k_eq_v, config.v_norm, config.layer_scalar) == (True, True, True)
    assert [config.layer_intermediate_size(i) for i in range(6)] == [128] * 4 + [256] * 2
    assert config.per_layer_inputs == PerLayerInputs(vocab_size=320, width=32)
    assert (config.final_logit_softcap, config.full_rope_fraction) == (5.0, 0.25)
    assert (config.rope_theta, config.sliding_rope_theta) == (1e6, 1e4)
    assert (config.query_scale, config.norm_offset, config.rotary_dim) == (1.0, 0.0, None)


def test_the_pool_holds_the_writing_layers_each_in_its_shape(gemma4_dir: Path) -> None:
    """Four layers of the six hold K/V; the full ones keep one head of 32, the sliding ones two
    of 16: one slot is 4 layers * 32 values * K and V * 2 bytes (IEEE half, the kernels')."""
    model = LlamaModel.from_checkpoint(load_checkpoint(gemma4_dir), quantize="q8")
    plan = fresh_pool(model, max_blocks=2).plan
    assert plan.layer_shapes == ((2, 16), (1, 32)) * 2
    assert plan.bytes_per_slot == 4 * 32 * 2 * 2
    assert model.kv_index == {0: 0, 1: 1, 2: 2, 3: 3, 4: 2, 5: 3}


def test_rotary_tables_are_transformers(gemma4_dir: Path, reference: Any) -> None:
    """The sliding layers' default rotary at base 1e4 over 16; the full layers' proportional
    one over 32: a quarter of the pairs turn at base 1e6, the rest stand still (cos 1, sin 0)."""
    config = load_checkpoint(gemma4_dir).config
    positions = torch.arange(40)[None]
    x = torch.zeros(1, dtype=torch.float32)
    for kind, sliding in (("sliding_attention", True), ("full_attention", False)):
        cos, sin = reference.model.rotary_emb(x, positions, kind)
        ours = rotary_table(config, 40, torch.device("cpu"), sliding=sliding)
        assert torch.equal(ours[0], cos[0]) and torch.equal(ours[1], sin[0])
    full_cos, full_sin = rotary_table(config, 40, torch.device("cpu"))
    still = [*range(4, 16), *range(20, 32)]  # pairs 4..15 of 16, in both halves
    assert bool((full_cos[:, still] == 1).all()) and bool((full_sin[:, still] == 0).all())


@pytest.mark.parametrize("chunk", [None, 5])
def test_logits_match_transformers(gemma4_dir: Path, reference: Any, chunk: int | None) -> None:
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    assert expected.abs().max() > 4  # the soft cap at 5 bites (tanh(0.8) is 0.66)
    model = LlamaModel.from_checkpoint(load_checkpoint(gemma4_dir))
    assert rel_error(paged_logits(model, PROMPT, chunk), expected) < 1e-5


def test_greedy_tokens_are_transformers_and_survive_a_prefix_hit(
    gemma4_dir: Path, reference: Any
) -> None:
    """The shared layers read the cached layers' K/V of the hit blocks as of their own."""
    engine = engine_of(gemma4_dir)
    first, _ = greedy(engine, [PROMPT])
    assert first["0"] == transformers_greedy(reference, PROMPT)
    shared = [*PROMPT[:16], 77, 78, 79]  # blocks 0-3 are PROMPT's
    second, _ = greedy(engine, [shared])
    assert engine.status().prefix_cache.hit_tokens == 16
    assert second["0"] == transformers_greedy(reference, shared)
    engine.check_blocks()


def test_the_checkpoint_with_its_towers_serves_its_text(gemma4_dir: Path, tmp_path: Path) -> None:
    """model_type 'gemma4' (the released checkpoints: vision and audio towers beside the text):
    the text_config is read, `model.language_model.` is the model, the towers are skipped."""
    from safetensors.torch import load_file, save_file

    text = json.loads((gemma4_dir / "config.json").read_text())
    wrapped = {"model_type": "gemma4", "text_config": text, "vision_config": {}}
    out = tmp_path / "gemma4-it"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(wrapped))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_text((gemma4_dir / name).read_text())
    tensors = load_file(gemma4_dir / "model.safetensors")
    renamed = {n.replace("model.", "model.language_model.", 1): t for n, t in tensors.items()}
    renamed["model.vision_tower.patch.weight"] = torch.zeros(4, 4)
    save_file(renamed, out / "model.safetensors")
    checkpoint = load_checkpoint(out)
    assert checkpoint.config == load_checkpoint(gemma4_dir).config
    assert dict(checkpoint.skipped) == {"vision tower": 1}
    expected, _ = greedy(engine_of(gemma4_dir), [PROMPT])
    assert greedy(engine_of(out), [PROMPT])[0] == expected


def test_an_experts_block_without_its_counts_is_refused_in_one_line(gemma4_dir: Path) -> None:
    text = json.loads((gemma4_dir / "config.json").read_text())
    moe = {**text, "enable_moe_block": True, "num_experts": 4, "moe_intermediate_size": 32}
    with pytest.raises(ConfigError, match="experts_per_token=None must be a positive integer"):
        ModelConfig.from_hf(moe)


def test_the_26b_a4b_checkpoint_with_its_towers_serves_its_text(
    tmp_path: Path, make_tiny_model_dir: Callable[..., Path]
) -> None:
    """The experts block as the released checkpoint stores it, under the towers' prefix
    (`model.language_model.layers.N.experts.gate_up_proj`, `router.proj`, `router.scale`,
    `router.per_expert_scale`): read as the text-only checkpoint is, and served the same."""
    from safetensors.torch import load_file, save_file

    moe_dir = make_tiny_model_dir(tmp_path, arch="gemma4_moe")
    text = json.loads((moe_dir / "config.json").read_text())
    out = tmp_path / "gemma4-26b-a4b-it"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": text}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_text((moe_dir / name).read_text())
    tensors = load_file(moe_dir / "model.safetensors")
    assert "model.layers.0.experts.gate_up_proj" in tensors
    save_file({n.replace("model.", "model.language_model.", 1): t for n, t in tensors.items()},
              out / "model.safetensors")  # fmt: skip
    config = load_checkpoint(out).config
    assert config == load_checkpoint(moe_dir).config
    assert config.experts is not None and config.experts.beside_mlp
    expected, _ = greedy(engine_of(moe_dir), [PROMPT])
    assert greedy(engine_of(out), [PROMPT])[0] == expected


def test_k_and_v_a_sharing_layer_still_stores_are_left_unread(
    gemma4_dir: Path, reference: Any, tmp_path: Path
) -> None:
    """A checkpoint may keep the K/V-sharing layers' own k and v projections and norms
    (transformers ignores them on load): they are accepted, and never read."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path / "with-unread"
    shutil.copytree(gemma4_dir, out)
    tensors = load_file(out / "model.safetensors")
    attn = "model.layers.4.self_attn"
    tensors[f"{attn}.k_proj.weight"] = torch.full((32, 64), float("nan"))
    tensors[f"{attn}.v_proj.weight"] = torch.full((32, 64), float("nan"))
    tensors[f"{attn}.k_norm.weight"] = torch.full((16,), float("nan"))
    save_file(tensors, out / "model.safetensors")
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    model = LlamaModel.from_checkpoint(load_checkpoint(out))
    assert rel_error(paged_logits(model, PROMPT), expected) < 1e-5

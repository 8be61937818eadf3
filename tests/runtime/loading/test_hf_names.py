"""A family's own tensor names and the loader's, both ways."""

from __future__ import annotations

import pytest

from nanoserve.runtime.loading.hf_names import canonical_name, family_name, skipped_part

LFM2 = [
    ("model.layers.0.operator_norm.weight", "model.layers.0.input_layernorm.weight"),
    ("model.layers.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
    ("model.layers.2.self_attn.out_proj.weight", "model.layers.2.self_attn.o_proj.weight"),
    ("model.layers.2.self_attn.q_layernorm.weight", "model.layers.2.self_attn.q_norm.weight"),
    ("model.layers.2.self_attn.k_layernorm.weight", "model.layers.2.self_attn.k_norm.weight"),
    ("model.layers.0.feed_forward.w1.weight", "model.layers.0.mlp.gate_proj.weight"),
    ("model.layers.0.feed_forward.w3.weight", "model.layers.0.mlp.up_proj.weight"),
    ("model.layers.0.feed_forward.w2.weight", "model.layers.0.mlp.down_proj.weight"),
    ("model.embedding_norm.weight", "model.norm.weight"),
    ("model.layers.0.conv.conv.weight", "model.layers.0.conv.conv.weight"),  # its own
    ("model.layers.2.self_attn.q_proj.weight", "model.layers.2.self_attn.q_proj.weight"),
]


@pytest.mark.parametrize(("stored", "known"), LFM2)
def test_lfm2_names_map_both_ways(stored: str, known: str) -> None:
    assert canonical_name("lfm2", stored) == known
    assert family_name("lfm2", known) == stored


def test_other_families_keep_their_names() -> None:
    for name in ("model.norm.weight", "model.layers.0.mlp.gate_proj.weight"):
        assert canonical_name("llama", name) == name == family_name("qwen3", name)


def test_qwen3_5s_language_model_is_read_from_under_its_vision_checkpoint() -> None:
    nested = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"
    assert canonical_name("qwen3_5", nested) == "model.layers.0.linear_attn.in_proj_qkv.weight"
    assert canonical_name("qwen3_5", "model.language_model.norm.weight") == "model.norm.weight"
    assert canonical_name("qwen3_5", "lm_head.weight") == "lm_head.weight"
    assert skipped_part("qwen3_5", "model.visual.blocks.0.attn.qkv.weight") == "vision tower"
    assert skipped_part("qwen3_5", "mtp.layers.0.mlp.up_proj.weight") == "MTP heads"
    assert skipped_part("qwen3_5", nested) is None
    assert skipped_part("llama", "model.visual.proj.weight") is None  # no part of a family's


def test_granites_shared_mlp_is_the_mlp() -> None:
    stored = "model.layers.3.shared_mlp.input_linear.weight"
    assert canonical_name("granitemoehybrid", stored) == "model.layers.3.mlp.gate_up_proj.weight"
    assert family_name("granitemoehybrid", "model.layers.3.mlp.down_proj.weight") == (
        "model.layers.3.shared_mlp.output_linear.weight"
    )
    mamba = "model.layers.0.mamba.in_proj.weight"  # its own, kept
    assert canonical_name("granitemoehybrid", mamba) == mamba

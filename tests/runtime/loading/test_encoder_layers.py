"""An encoder's config from Hugging Face's config.json and llama.cpp's GGUF keys, its tensor
names from every source, and what is refused."""

from __future__ import annotations

import pytest

from nanoserve.runtime.errors import UnsupportedModelError
from nanoserve.runtime.loading.encoder_names import (
    encoder_name,
    encoder_skipped_part,
    gguf_encoder_name,
)
from nanoserve.runtime.loading.model_config import ModelConfig

BERT = {
    "model_type": "bert",
    "vocab_size": 100,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_act": "gelu",
}


def test_bert() -> None:
    config = ModelConfig.from_hf(BERT)
    assert config.architecture == "bert" and config.attention_layers == ()
    assert config.encoder is not None
    assert (config.encoder.act, config.encoder.position_offset) == ("gelu", 0)
    assert config.encoder.learned_positions and config.encoder.biases
    assert (config.max_position_embeddings, config.head_dim) == (512, 16)


def test_xlm_roberta_positions_start_past_its_padding_id() -> None:
    config = ModelConfig.from_hf(
        {**BERT, "model_type": "xlm-roberta", "pad_token_id": 1, "max_position_embeddings": 514}
    )
    assert config.encoder is not None and config.encoder.position_offset == 2
    assert config.max_position_embeddings == 512  # the positions an input may use


def test_nomic_bert_in_nomics_own_config() -> None:
    hub = {
        "model_type": "nomic_bert",
        "vocab_size": 100,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": 128,
        "n_positions": 2048,
        "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0,
        "activation_function": "swiglu",
        "qkv_proj_bias": False,
        "layer_norm_epsilon": 1e-12,
        "type_vocab_size": 2,
    }
    config = ModelConfig.from_hf(hub)
    assert config.architecture == "nomic_bert" and config.encoder is not None
    assert config.encoder.swiglu and not config.encoder.biases
    assert not config.encoder.learned_positions and config.rope_theta == 1000.0
    with pytest.raises(UnsupportedModelError, match="partial or interleaved rotary"):
        ModelConfig.from_hf({**hub, "rotary_emb_fraction": 0.5})


def test_relative_positions_are_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="position_embedding_type='relative_key'"):
        ModelConfig.from_hf({**BERT, "position_embedding_type": "relative_key"})


@pytest.mark.parametrize(
    ("stored", "known"),
    [
        ("bert.encoder.layer.0.attention.self.query.weight", "encoder.layer.0.attention.self.query.weight"),
        ("roberta.embeddings.LayerNorm.bias", "embeddings.LayerNorm.bias"),
        ("encoder.layers.1.attn.Wqkv.weight", "encoder.layer.1.attention.self.qkv.weight"),
        ("encoder.layers.1.mlp.fc11.weight", "encoder.layer.1.intermediate.dense.weight"),
        ("encoder.layers.1.mlp.fc12.weight", "encoder.layer.1.intermediate.gate.weight"),
        ("encoder.layers.1.norm2.bias", "encoder.layer.1.output.LayerNorm.bias"),
        ("layers.0.self_attn.o_proj.weight", "encoder.layer.0.attention.output.dense.weight"),
        ("layers.0.post_attention_layernorm.weight", "encoder.layer.0.attention.output.LayerNorm.weight"),
        ("emb_ln.weight", "embeddings.LayerNorm.weight"),
        ("classifier.out_proj.weight", "classifier.out_proj.weight"),
    ],
)  # fmt: skip
def test_stored_names(stored: str, known: str) -> None:
    assert encoder_name(stored) == known


def test_gguf_names_and_skipped_heads() -> None:
    assert gguf_encoder_name("blk.3.attn_qkv.weight") == "encoder.layer.3.attention.self.qkv.weight"
    assert (
        gguf_encoder_name("blk.0.layer_output_norm.bias") == "encoder.layer.0.output.LayerNorm.bias"
    )
    assert gguf_encoder_name("token_types.weight") == "embeddings.token_type_embeddings.weight"
    assert gguf_encoder_name("cls.output.bias") == "classifier.out_proj.bias"
    assert gguf_encoder_name("output_norm.weight") is None
    assert encoder_skipped_part("cls.predictions.decoder.weight") == "masked-LM head"
    assert encoder_skipped_part("roberta.lm_head.dense.weight") == "masked-LM head"
    assert encoder_skipped_part("encoder.layer.0.output.dense.weight") is None

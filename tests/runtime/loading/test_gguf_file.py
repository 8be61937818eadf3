from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file

from nanoserve.runtime.errors import (
    ConfigError,
    UnsupportedModelError,
    UnsupportedQuantError,
    WeightsError,
)
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.loading.gguf_file import hf_tensor_name

F32_EPS = float(np.float32(1e-5))  # GGUF stores rms_norm_eps as float32


def _hf_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


Permute = Callable[[np.ndarray, int], np.ndarray]


def _permuted(
    name: str, tensor: torch.Tensor, checkpoint: Checkpoint, permute: Permute
) -> np.ndarray:
    """`tensor` as llama.cpp lays it out (Q/K rows permuted for Llama), for comparing in GGUF order."""
    config = checkpoint.config
    values = tensor.numpy()
    if config.architecture == "llama" and ".q_proj." in name:
        return permute(values, config.num_heads)
    if config.architecture == "llama" and ".k_proj." in name:
        return permute(values, config.num_kv_heads)
    return values


@pytest.mark.parametrize(
    ("gguf_name", "hf_name"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.12.attn_k.bias", "model.layers.12.self_attn.k_proj.bias"),
        ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"),
        ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("blk.3.ffn_gate.weight", "model.layers.3.mlp.gate_proj.weight"),
        ("blk.3.ffn_up.weight", "model.layers.3.mlp.up_proj.weight"),
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
        ("blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"),
        ("blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
        ("rope_freqs.weight", None),
        ("blk.0.attn_q_norm.weight", "model.layers.0.self_attn.q_norm.weight"),
        ("blk.0.post_ffw_norm.weight", None),
    ],
)
def test_tensor_names(gguf_name: str, hf_name: str | None) -> None:
    assert hf_tensor_name(gguf_name) == hf_name


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_llama_untied_dir", "tiny_qwen2_dir"])
def test_f32_gguf_loads_to_the_hf_weights_exactly(
    fixture: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    write_tiny_gguf: Callable[..., Path],
) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    hf = load_checkpoint(model_dir)
    checkpoint = load_checkpoint(write_tiny_gguf(model_dir, tmp_path / "tiny.gguf"))
    assert checkpoint.format == "gguf"
    assert checkpoint.config == dataclasses.replace(hf.config, rms_norm_eps=F32_EPS)
    ours = dict(checkpoint.tensors())
    reference = _hf_weights(model_dir)
    assert set(ours) == set(reference)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, reference[name]), name


def test_llama_q_and_k_rows_are_stored_permuted(
    tiny_llama_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    # The test above only proves something if the file really holds permuted rows.
    path = write_tiny_gguf(tiny_llama_dir, tmp_path / "tiny.gguf")
    raw = {t.name: t.data for t in gguf.GGUFReader(path).tensors}
    hf = _hf_weights(tiny_llama_dir)
    for gguf_name, hf_name in [("attn_q", "q_proj"), ("attn_k", "k_proj")]:
        stored = torch.from_numpy(np.array(raw[f"blk.0.{gguf_name}.weight"]))
        assert not torch.equal(stored, hf[f"model.layers.0.self_attn.{hf_name}.weight"])
    v_stored = torch.from_numpy(np.array(raw["blk.0.attn_v.weight"]))
    assert torch.equal(v_stored, hf["model.layers.0.self_attn.v_proj.weight"])


QUANTIZABLE = [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]  # gguf-py can write these


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=[q.name for q in QUANTIZABLE])
def test_quantized_tensors_dequantize_like_gguf(
    qtype: Q,
    tiny_llama_dir: Path,
    tmp_path: Path,
    write_tiny_gguf: Callable[..., Path],
    llamacpp_permute: Permute,
) -> None:
    checkpoint = load_checkpoint(write_tiny_gguf(tiny_llama_dir, tmp_path / "q.gguf", qtype=qtype))
    reference = _hf_weights(tiny_llama_dir)
    for name, tensor in checkpoint.tensors():
        ref = reference[name].numpy()
        if ref.ndim == 2:  # matrices went through quantize; compare in the file's row order
            ref = llamacpp_permute(ref, 4) if ".q_proj." in name else ref
            ref = llamacpp_permute(ref, 2) if ".k_proj." in name else ref
            expected = gguf.quants.dequantize(gguf.quants.quantize(ref, qtype), qtype)
            assert np.array_equal(
                _permuted(name, tensor, checkpoint, llamacpp_permute), expected
            ), name
            # and it is still the same matrix, to quantization error
            assert np.abs(expected - ref).max() < 0.35, name
        else:
            assert np.array_equal(tensor.numpy(), ref), name


def _random_k_blocks(qtype: Q, rows: int, cols: int, seed: int) -> np.ndarray:
    """Valid K-quant bytes: random quants, with the fp16 super-block scales set to sane values."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = np.random.default_rng(seed).integers(0, 256, (rows, cols // block_elems, block_bytes))
    blocks = blocks.astype(np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if qtype == Q.Q4_K:  # d, dmin lead the block
        blocks[..., 0:2], blocks[..., 2:4] = scale, scale
    else:  # Q6_K: d ends it
        blocks[..., -2:] = scale
    return blocks.reshape(rows, -1)


def test_k_quants_dequantize_like_gguf(
    tmp_path: Path,
    write_tiny_gguf: Callable[..., Path],
    make_tiny_model_dir: Callable[..., Path],
    llamacpp_permute: Permute,
) -> None:
    # K-quants pack 256 values per block, so this model has 256-wide rows.
    model_dir = make_tiny_model_dir(tmp_path, hidden_size=256, intermediate_size=256)
    raw = {
        "blk.0.attn_q.weight": (_random_k_blocks(Q.Q6_K, 256, 256, seed=1), Q.Q6_K),
        "blk.0.attn_k.weight": (_random_k_blocks(Q.Q4_K, 128, 256, seed=2), Q.Q4_K),
        "blk.1.ffn_up.weight": (_random_k_blocks(Q.Q4_K, 256, 256, seed=3), Q.Q4_K),
    }
    checkpoint = load_checkpoint(write_tiny_gguf(model_dir, tmp_path / "k.gguf", raw_tensors=raw))
    tensors = dict(checkpoint.tensors())
    for gguf_name, (data, qtype) in raw.items():
        name = hf_tensor_name(gguf_name)
        assert name is not None
        expected = gguf.quants.dequantize(data, qtype)
        assert np.array_equal(
            _permuted(name, tensors[name], checkpoint, llamacpp_permute), expected
        ), name


# -- errors ----------------------------------------------------------------------------------------


def test_unsupported_quant_type_names_type_and_tensor(
    tiny_llama_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    q8_1 = np.zeros((128, 2 * 40), dtype=np.uint8)  # Q8_1: an activation type, never a weight
    path = write_tiny_gguf(
        tiny_llama_dir, tmp_path / "q81.gguf", raw_tensors={"blk.1.ffn_up.weight": (q8_1, Q.Q8_1)}
    )
    with pytest.raises(UnsupportedQuantError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: tensor 'blk.1.ffn_up.weight' is Q8_1")
    assert "Q4_K" in message and "IQ4_XS" in message  # and says what is supported


def test_iq_types_load_through_the_gguf_package(
    tiny_llama_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    """A type nanoserve has no code for (IQ4_NL) is still read: dequantized by `gguf`."""
    iq4 = _random_iq4_nl(128, 64, seed=4)
    path = write_tiny_gguf(
        tiny_llama_dir, tmp_path / "iq4.gguf", raw_tensors={"blk.1.ffn_up.weight": (iq4, Q.IQ4_NL)}
    )
    tensors = dict(load_checkpoint(path).tensors())
    expected = gguf.quants.dequantize(iq4, Q.IQ4_NL)
    assert np.array_equal(tensors["model.layers.1.mlp.up_proj.weight"].numpy(), expected)


def _random_iq4_nl(rows: int, cols: int, seed: int) -> np.ndarray:
    blocks = np.random.default_rng(seed).integers(0, 256, (rows, cols // 32, 18)).astype(np.uint8)
    blocks[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def test_truncated_gguf(
    tiny_llama_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    path = write_tiny_gguf(tiny_llama_dir, tmp_path / "tiny.gguf")
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(WeightsError, match=f"^{re.escape(str(path))}: cannot be parsed as GGUF"):
        load_checkpoint(path)


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(
        WeightsError, match=re.escape("is not a GGUF file (starts with b'PK\\x03\\x04'")
    ):
        load_checkpoint(path)


def test_unknown_architecture(
    tiny_llama_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    path = write_tiny_gguf(tiny_llama_dir, tmp_path / "g.gguf", arch="gemma")
    with pytest.raises(UnsupportedModelError, match=re.escape("GGUF architecture 'gemma'")):
        load_checkpoint(path)


def test_rope_freqs_of_the_wrong_length_are_refused(
    tiny_llama_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    freqs = (np.ones(5, dtype=np.float32), Q.F32)
    path = write_tiny_gguf(
        tiny_llama_dir, tmp_path / "r.gguf", raw_tensors={"rope_freqs.weight": freqs}
    )
    with pytest.raises(ConfigError, match="rope_freqs must be 8 positive factors, got 5"):
        load_checkpoint(path)


def test_metadata_disagreeing_with_tensor_shapes(
    tiny_llama_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    model_dir = Path(shutil.copytree(tiny_llama_dir, tmp_path / "model"))
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    config["intermediate_size"] = 96  # the metadata says 96, the tensors are 128 wide
    (model_dir / "config.json").write_text(json.dumps(config))
    path = write_tiny_gguf(model_dir, tmp_path / "bad.gguf")
    with pytest.raises(WeightsError) as caught:
        load_checkpoint(path)
    assert str(caught.value) == (
        f"{path}: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128, 64], "
        "but the config implies [96, 64]"
    )


# -- the embedded model ----------------------------------------------------------------------------


@pytest.mark.slow
def test_embedded_config(embedded_checkpoint: Checkpoint) -> None:
    config = embedded_checkpoint.config
    assert (config.architecture, config.num_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.intermediate_size, config.num_heads, config.num_kv_heads) == (1536, 9, 3)
    assert (config.head_dim, config.vocab_size, config.max_position_embeddings) == (64, 49152, 8192)
    assert (config.rope_theta, config.rope_scaling) == (100000.0, None)
    assert config.rms_norm_eps == F32_EPS
    assert (config.tie_word_embeddings, config.attention_bias) == (True, False)
    assert (config.eos_token_ids, config.bos_token_id) == ((2,), 1)


@pytest.mark.slow
def test_embedded_tensors_equal_transformers(
    embedded_tensors: dict[str, torch.Tensor], hf_reference_model: Any
) -> None:
    reference = hf_reference_model.state_dict()
    assert len(embedded_tensors) == 272
    assert set(reference) - set(embedded_tensors) == {"lm_head.weight"}  # tied to the embedding
    for name, tensor in embedded_tensors.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, reference[name]), name
    assert sum(t.numel() for t in embedded_tensors.values()) == 134_515_008


@pytest.mark.slow
def test_embedded_chat_template_is_transformers(
    embedded_checkpoint: Checkpoint, hf_reference_tokenizer: Any
) -> None:
    assert embedded_checkpoint.chat_template == hf_reference_tokenizer.chat_template
    assert embedded_checkpoint.chat_template.startswith("{% for message in messages %}")

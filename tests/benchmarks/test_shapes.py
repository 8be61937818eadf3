"""The dense 3-4B shapes (benchmarks/shapes.py) as shape_gguf.py writes them: llama.cpp's
tensor names for each architecture, read by nanoserve, which decodes from them. Tiny copies of
each shape keep the test small; the names, types and fusions are the full shapes'."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import gguf
import pytest
import torch

from benchmarks.shape_gguf import tensors_of, write
from benchmarks.shapes import LLAMA_3_2_3B, PHI_4_MINI, QWEN2_5_3B, Shape
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel
from tests.runtime.hybrid_engine import NEW_TOKENS, engine_of, greedy
from tests.runtime.paged_logits import paged_logits, rel_error


def tiny(shape: Shape, layers: int = 2) -> Shape:
    """The shape at a few layers of 256 wide (a Q4_K row is 256 values), its metadata kept."""
    return dataclasses.replace(
        shape,
        name=f"tiny-{shape.name}",
        vocab=512,
        hidden=256,
        layers=layers,
        attention=tuple(range(layers)),
        heads=2,
        kv_heads=1,
        ffn=512,
        metadata={**shape.metadata, "rope.dimension_count": 96 if shape.arch == "phi3" else 128},
    )


@pytest.mark.parametrize("shape", [LLAMA_3_2_3B, QWEN2_5_3B, PHI_4_MINI], ids=lambda s: s.arch)
def test_every_tensor_is_one_llama_cpp_names_for_the_architecture(shape: Shape) -> None:
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == shape.arch)
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}
    for name in tensors_of(shape):
        stem = re.sub(r"^blk\.\d+\.", "blk.{bid}.", name).removesuffix(".weight")
        assert stem.removesuffix(".bias") in known, name


def test_each_architecture_is_named_as_llama_cpp_names_it() -> None:
    llama, qwen, phi = (set(tensors_of(tiny(s))) for s in (LLAMA_3_2_3B, QWEN2_5_3B, PHI_4_MINI))
    assert {"rope_freqs.weight", "blk.1.attn_q.weight", "blk.1.ffn_gate.weight"} <= llama
    assert "output.weight" not in llama | qwen | phi  # all three tie their output
    assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"} <= qwen
    assert {"blk.0.attn_qkv.weight", "rope_factors_long.weight"} <= phi
    assert not {"blk.0.attn_q.weight", "blk.0.ffn_gate.weight"} & phi
    fused = tensors_of(tiny(PHI_4_MINI))
    assert fused["blk.0.attn_qkv.weight"] == ((256 + 2 * 128, 256), "Q5_K")
    assert fused["blk.0.ffn_up.weight"] == ((2 * 512, 256), "Q4_K")
    assert fused["rope_factors_short.weight"] == ((48,), "F32")


@pytest.mark.parametrize("shape", [LLAMA_3_2_3B, QWEN2_5_3B, PHI_4_MINI], ids=lambda s: s.arch)
def test_nanoserve_reads_and_decodes_each_file(tmp_path: Path, shape: Shape) -> None:
    """The file loads as its architecture, its kernels' logits are finite and near the
    dequantized weights' in float32 (one layer: random weights this large amplify each
    layer's rounding), and the engine decodes from it."""
    path = write(tiny(shape, layers=1), tmp_path / "model.gguf")
    checkpoint = load_checkpoint(path)
    assert checkpoint.config.architecture == shape.arch
    ids = [1, 2, 3, 4, 5, 6]
    kernels = paged_logits(LlamaModel.from_checkpoint(checkpoint, quantize="gguf"), ids)
    exact = paged_logits(LlamaModel.from_checkpoint(checkpoint, dtype=torch.float32), ids)
    assert torch.isfinite(kernels).all() and exact.abs().max() > 0
    assert rel_error(kernels, exact) < 0.1  # the kernels round activations to 8 bits
    tokens, _ = greedy(engine_of(path, quantize="gguf"), [ids])
    assert len(tokens["0"]) == NEW_TOKENS

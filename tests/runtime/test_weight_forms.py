"""Weight forms: the quantize option checked in one place, and a GGUF's own blocks reaching the
kernels exactly (llama.cpp's weights, not a float round trip)."""

from __future__ import annotations

import pytest
import torch

from nanoserve.runtime.engine_config import EngineConfig, EngineConfigError
from nanoserve.runtime.errors import UnknownQuantizationError
from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.loading.gguf_blocks import BLOCK_TYPES, GgufBlocks
from nanoserve.runtime.model.int8_weight import Int8Weight
from nanoserve.runtime.model.quant_weight import Q4Levels, Q4Weight, Q8Weight
from nanoserve.runtime.model.weight_forms import (
    check_quantize,
    dense,
    head_form,
    kept_blocks,
    make_linear,
)

CPU = torch.device("cpu")


def test_unknown_quantization_is_refused_in_one_place() -> None:
    with pytest.raises(EngineConfigError, match=r"^quantize must be one of int8, q4, q8, auto or"):
        EngineConfig(quantize="int4")
    with pytest.raises(UnknownQuantizationError, match=r"^quantize must be one of int8, q4, q8 or"):
        check_quantize("int4")  # a model is built only with a resolved form
    assert EngineConfig(quantize="none").quantize is None
    for ok in (None, "int8", "q4", "q8"):
        check_quantize(ok)


def test_kernel_forms_are_cpu_only() -> None:
    with pytest.raises(
        EngineConfigError, match="quantize q4 runs on nanoserve's CPU kernels, not on cuda"
    ):
        EngineConfig(quantize="q4", device="cuda")


def test_forms_by_role() -> None:
    assert kept_blocks("q4") == kept_blocks("q8") == BLOCK_TYPES
    assert kept_blocks(None) == kept_blocks("int8") == frozenset()
    assert head_form("q4") == "q8" and head_form("q8") == "q8" and head_form(None) is None


def test_make_linear_stacks_parts_in_every_form() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 64, generator=g), torch.randn(32, 64, generator=g)
    plain = make_linear([a, b], None, torch.float32, CPU)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, torch.cat((a, b)))
    assert isinstance(make_linear([a, b], "int8", torch.float32, CPU), Int8Weight)
    q4 = make_linear([a, b], "q4", torch.float32, CPU)
    assert isinstance(q4, Q4Weight) and q4.shape == (48, 64)
    assert torch.equal(q4.dequantize(), Q4Levels.quantize(torch.cat((a, b))).dequantize())
    assert isinstance(make_linear([a], "q8", torch.float32, CPU), Q8Weight)


@pytest.mark.slow
def test_embedded_gguf_blocks_are_served_as_stored(embedded_checkpoint: Checkpoint) -> None:
    """The embedded model's Q4_1 layers and Q8_0 embedding, taken as blocks and packed, read back
    to exactly the floats the dequantizing loader gives (Q/K rows unpermuted alike)."""
    names = (
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.3.mlp.down_proj.weight",
        "model.embed_tokens.weight",
    )
    blocks = dict(embedded_checkpoint.source.iter_tensors(list(names), BLOCK_TYPES))
    floats = dict(embedded_checkpoint.source.iter_tensors(list(names)))
    for name in names:
        source = blocks[name]
        assert isinstance(source, GgufBlocks)
        assert source.kind == ("Q8_0" if "embed" in name else "Q4_1")
        form = "q8" if source.kind == "Q8_0" else "q4"
        packed = make_linear([source], form, torch.float32, CPU)
        assert isinstance(packed, Q4Weight | Q8Weight)
        assert torch.equal(packed.dequantize(), floats[name]), name
        assert torch.equal(dense(source, torch.float32, CPU), floats[name])

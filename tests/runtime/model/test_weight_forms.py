"""Weight forms: the quantize option checked in one place, the type each tensor is served in, and
a GGUF's own blocks reaching the kernels exactly (llama.cpp's weights, not a float round trip)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from nanoserve.runtime.engine.config.engine_config import EngineConfig, EngineConfigError
from nanoserve.runtime.errors import UnknownQuantizationError
from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.gguf_types import DEQUANTIZED_HERE, KERNEL_TYPES
from nanoserve.runtime.model.int8_weight import Int8Weight
from nanoserve.runtime.model.quant_weight import QuantLinear, dequantize_blocks, quantize_q4_1
from nanoserve.runtime.model.weight_forms import (
    auto_quantize,
    check_quantize,
    dense,
    describe_fallbacks,
    describe_types,
    kept_blocks,
    make_linear,
    served_type,
)

CPU = torch.device("cpu")


def test_unknown_quantization_is_refused_in_one_place() -> None:
    with pytest.raises(
        EngineConfigError, match=r"^quantize must be one of gguf, int8, q4, q8, auto or"
    ):
        EngineConfig(quantize="int4")
    with pytest.raises(
        UnknownQuantizationError, match=r"^quantize must be one of gguf, int8, q4, q8 or"
    ):
        check_quantize("int4")  # a model is built only with a resolved form
    assert EngineConfig(quantize="none").resolve(model_max_len=64).quantize is None
    for ok in (None, "gguf", "int8", "q4", "q8"):
        check_quantize(ok)


@pytest.mark.parametrize("form", ["gguf", "q4", "q8"])
def test_kernel_forms_are_cpu_only(form: str) -> None:
    with pytest.raises(
        EngineConfigError, match=f"quantize {form} runs on nanoserve's CPU kernels, not on cuda"
    ):
        EngineConfig(quantize=form, device="cuda")


def test_auto_serves_a_gguf_in_its_own_blocks_on_the_cpu() -> None:
    mixed = frozenset({"Q5_0", "Q8_0", "Q4_K", "Q6_K"})
    assert auto_quantize(mixed, "cpu") == "gguf"
    assert auto_quantize(frozenset({"IQ2_XS", "Q4_K"}), "cpu") == "gguf"  # IQ2_XS re-quantized
    assert auto_quantize(frozenset({"F16"}), "cpu") is None  # a float file: the dtype
    assert auto_quantize(frozenset(), "cpu") is None  # a Hugging Face directory
    assert auto_quantize(mixed, "cuda") is None


def test_the_type_each_form_serves() -> None:
    for kind in KERNEL_TYPES:
        assert served_type("gguf", kind) == kind
        assert served_type("gguf", kind, head=True) == kind
        assert served_type("q8", kind) == "Q8_0"
    for other in ("F16", "BF16", "F32", "IQ4_XS", None):
        assert served_type("gguf", other) == "Q8_0"
    assert served_type("q4", "Q4_0") == "Q4_0" and served_type("q4", "Q4_1") == "Q4_1"
    assert served_type("q4", "Q6_K") == "Q4_1" and served_type("q4", None) == "Q4_1"
    assert served_type("q4", "Q4_1", head=True) == "Q8_0"  # its logits pick the token
    assert kept_blocks("gguf") == kept_blocks("q4") == DEQUANTIZED_HERE
    assert kept_blocks(None) == kept_blocks("int8") == frozenset()


def test_make_linear_stacks_parts_in_every_form(random_blocks: Callable[..., np.ndarray]) -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 256, generator=g), torch.randn(32, 256, generator=g)
    plain = make_linear([a, b], None, torch.float32, CPU)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, torch.cat((a, b)))
    assert isinstance(make_linear([a, b], "int8", torch.float32, CPU), Int8Weight)
    q4 = make_linear([a, b], "q4", torch.float32, CPU)
    assert isinstance(q4, QuantLinear) and q4.shape == (48, 256) and q4.kinds == ("Q4_1", "Q4_1")
    # gguf: blocks in their own types, floats re-quantized to Q8_0
    k = GgufBlocks("Q4_K", torch.from_numpy(random_blocks("Q4_K", 8, 256, seed=1)), (8, 256))
    mixed = make_linear([k, a], "gguf", torch.float32, CPU)
    assert isinstance(mixed, QuantLinear) and mixed.kinds == ("Q4_K", "Q8_0")
    assert [p.stored for p in mixed.parts] == ["Q4_K", "F32"]
    assert describe_types(mixed.parts) == "q4_k×1 q8_0×1"
    assert describe_fallbacks(mixed.parts) == "f32×1 as q8_0 (re-quantized)"
    assert describe_fallbacks(mixed.parts[:1]) is None


def test_blocks_reach_the_kernel_as_stored_and_release_their_pages(
    random_blocks: Callable[..., np.ndarray],
) -> None:
    released = []
    rows = torch.from_numpy(random_blocks("Q6_K", 16, 256, seed=2))
    blocks = GgufBlocks("Q6_K", rows, (16, 256), release=lambda: released.append(True))
    linear = make_linear([blocks], "gguf", torch.float32, CPU)
    assert isinstance(linear, QuantLinear) and linear.kinds == ("Q6_K",)
    assert released == [True]  # the file's pages are dropped once packed
    # its product is of the stored values: re-quantizing them would move it
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(3))
    requantized = make_linear([dequantize_blocks(blocks)], "q4", torch.float32, CPU)
    assert not torch.equal(linear.matmul(x), requantized.matmul(x))


def test_dense_dequantizes_blocks() -> None:
    blocks = quantize_q4_1(torch.randn(4, 64, generator=torch.Generator().manual_seed(4)))
    values = dense(blocks, torch.bfloat16, CPU)
    assert values.dtype == torch.bfloat16
    assert torch.equal(values, dequantize_blocks(blocks).bfloat16())


@pytest.mark.slow
def test_embedded_gguf_blocks_are_served_as_stored(embedded_checkpoint: Checkpoint) -> None:
    """The embedded model's Q4_1 layers and Q8_0 embedding, taken as blocks, read back to exactly
    the floats the dequantizing loader gives (Q/K rows unpermuted alike)."""
    names = (
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.3.mlp.down_proj.weight",
        "model.embed_tokens.weight",
    )
    blocks = dict(embedded_checkpoint.source.iter_tensors(list(names), DEQUANTIZED_HERE))
    floats = dict(embedded_checkpoint.source.iter_tensors(list(names)))
    for name in names:
        source = blocks[name]
        assert isinstance(source, GgufBlocks)
        assert source.kind == ("Q8_0" if "embed" in name else "Q4_1")
        want = floats[name]
        assert isinstance(want, torch.Tensor)
        assert torch.equal(dense(source, torch.float32, CPU), want), name
        linear = make_linear([source], "gguf", torch.float32, CPU)
        assert isinstance(linear, QuantLinear) and linear.kinds == (source.kind,)


def test_auto_resolving_to_a_kernel_form_off_the_cpu_is_refused() -> None:
    """What "auto" resolves to is checked as if it had been asked for."""
    with pytest.raises(EngineConfigError, match="runs on nanoserve's CPU kernels, not on cuda"):
        EngineConfig(device="cuda", quantize="auto").resolve(model_max_len=64, auto_quantize="gguf")

"""Weight forms: how a linear is stored, and checkpoint tensors (or GGUF blocks) turned into it.

`--quantize` names a form for the model's linears:

| quantize | layers' linears           | output projection | read by                          |
|----------|---------------------------|-------------------|----------------------------------|
| unset    | the model dtype           | the model dtype   | torch (MKL, oneDNN, cuBLAS)      |
| int8     | int8, a scale per row     | the same          | torch's `_weight_int8pack_mm`    |
| q4       | GGUF Q4_1 (4.5 bits)      | GGUF Q8_0         | nanoserve's CPU kernels          |
| q8       | GGUF Q8_0 (8.5 bits)      | GGUF Q8_0         | nanoserve's CPU kernels          |

`auto` (the server's default) serves a GGUF in its own block form on the CPU: q4 when its
layers are Q4_0/Q4_1, q8 when they hold Q8_0; anything else (K-quants, float checkpoints, a
GPU) loads in the model dtype, as unset does.

For q4 and q8 a GGUF's Q4_0, Q4_1 and Q8_0 tensors are taken as stored, so llama.cpp's own
weights are served bit for bit; anything else (float checkpoints, other GGUF types) is
quantized with llama.cpp's rounding. Parts of one linear (q, k, v; gate, up) are concatenated
as levels, before packing, which equals quantizing the concatenation: groups run along inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import torch

from nanoserve.runtime.errors import UnknownQuantizationError
from nanoserve.runtime.loading.gguf_blocks import BLOCK_TYPES, GgufBlocks
from nanoserve.runtime.model.int8_weight import Int8Weight
from nanoserve.runtime.model.quant_weight import Q4Levels, Q4Weight, Q8Levels, Q8Weight

QUANTIZATIONS = ("int8", "q4", "q8")  # the weight forms a model may be loaded in, besides its dtype
KERNEL_FORMS = ("q4", "q8")  # the forms only nanoserve's CPU kernels read
AUTO = "auto"  # a config's choice, resolved from the checkpoint before a model is built

Linear: TypeAlias = torch.Tensor | Int8Weight | Q4Weight | Q8Weight
Source: TypeAlias = torch.Tensor | GgufBlocks


def check_quantize(quantize: str | None, *, allow_auto: bool = False) -> None:
    """The one check of a quantize option (EngineConfig and LlamaModel both call it; a model is
    built only with a resolved form)."""
    known = (*QUANTIZATIONS, AUTO) if allow_auto else QUANTIZATIONS
    if quantize is not None and quantize not in known:
        raise UnknownQuantizationError(
            f"quantize must be one of {', '.join(known)} or unset, got {quantize!r}"
        )


def auto_quantize(linear_types: frozenset[str], device: str) -> str | None:
    """What `auto` serves: a GGUF's own block form, on the CPU (its layers' linear types)."""
    if device.split(":")[0] != "cpu" or not linear_types or not linear_types <= BLOCK_TYPES:
        return None
    return "q8" if "Q8_0" in linear_types else "q4"


def kept_blocks(quantize: str | None) -> frozenset[str]:
    """The GGUF block types a checkpoint should hand over as stored for this form."""
    return BLOCK_TYPES if quantize in KERNEL_FORMS else frozenset()


def head_form(quantize: str | None) -> str | None:
    """The output projection's form: 8 bits under q4, since its logits pick the token."""
    return "q8" if quantize == "q4" else quantize


def dense(source: Source, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The source as a float tensor in dtype on device (blocks dequantized)."""
    if isinstance(source, GgufBlocks):
        source = (q4_levels(source) if source.kind != "Q8_0" else q8_levels(source)).dequantize()
    if source.device != device:
        source = source.to(device)
    return source if source.dtype == dtype else source.to(dtype)


def make_linear(
    parts: Sequence[Source], form: str | None, dtype: torch.dtype, device: torch.device
) -> Linear:
    """One linear from its parts (stacked along the output features) in the given form."""
    if form == "q4":
        return Q4Levels.cat([q4_levels(p) for p in parts]).pack()
    if form == "q8":
        return Q8Levels.cat([q8_levels(p) for p in parts]).pack()
    weights = [dense(p, dtype, device) for p in parts]
    weight = weights[0] if len(weights) == 1 else torch.cat(weights)
    return Int8Weight.quantize(weight, dtype) if form == "int8" else weight


def q4_levels(source: Source) -> Q4Levels:
    if isinstance(source, GgufBlocks):
        if source.kind == "Q4_1":
            return Q4Levels.from_q4_1_blocks(source.data)
        if source.kind == "Q4_0":
            return Q4Levels.from_q4_0_blocks(source.data)
        return Q4Levels.quantize(q8_levels(source).dequantize())
    return Q4Levels.quantize(source)


def q8_levels(source: Source) -> Q8Levels:
    if isinstance(source, GgufBlocks):
        if source.kind == "Q8_0":
            return Q8Levels.from_q8_0_blocks(source.data)
        return Q8Levels.quantize(q4_levels(source).dequantize())
    return Q8Levels.quantize(source)

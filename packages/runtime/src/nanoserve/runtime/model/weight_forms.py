"""Weight forms: how a linear is stored, and checkpoint tensors (or GGUF blocks) turned into it.

`--quantize` names a form for the model's linears:

| quantize | layers' linears                  | output projection | read by                       |
|----------|----------------------------------|-------------------|-------------------------------|
| unset    | the model dtype                  | the model dtype   | torch (MKL, oneDNN, cuBLAS)   |
| int8     | int8, a scale per row            | the same          | torch's `_weight_int8pack_mm` |
| gguf     | each tensor in its file's type   | its file's type   | nanoserve's CPU kernels       |
| q4       | GGUF Q4_0/Q4_1 (Q4_1 elsewhere)  | GGUF Q8_0         | nanoserve's CPU kernels       |
| q8       | GGUF Q8_0                        | GGUF Q8_0         | nanoserve's CPU kernels       |

`auto` (the server's default) is `gguf` for a GGUF on the CPU with at least one linear in a
type the kernels read: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, each
tensor in its own type, as llama.cpp serves the file. A tensor of another type (F16, IQ4_XS, ...) is
re-quantized to Q8_0 under `gguf`, and the boot line says so (`fallbacks`). A float checkpoint
or a GPU loads in the model dtype, as unset does.

Blocks are taken from the file unchanged wherever the form serves their type, so a weight is
llama.cpp's bit for bit; anything else is quantized with llama.cpp's rounding. A linear's parts
(q, k, v; gate, up) keep their own types (`QuantLinear`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TypeAlias

import torch

from nanoserve.runtime.errors import QuantizationError, UnknownQuantizationError
from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.gguf_types import DEQUANTIZED_HERE, KERNEL_TYPES
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.int8_weight import Int8Weight
from nanoserve.runtime.model.quant_weight import (
    QuantLinear,
    QuantWeight,
    dequantize_blocks,
    quantize_q4_1,
    quantize_q8_0,
)

QUANTIZATIONS = (
    "gguf",
    "int8",
    "q4",
    "q8",
)  # the forms a model may be loaded in, besides its dtype
KERNEL_FORMS = ("gguf", "q4", "q8")  # the forms only nanoserve's CPU kernels read
AUTO = "auto"  # a config's choice, resolved from the checkpoint before a model is built

Linear: TypeAlias = torch.Tensor | Int8Weight | QuantLinear
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
    """What `auto` serves: a GGUF in its own blocks on the CPU, if any linear is in a type the
    kernels read; else (float files, a GPU) the model dtype."""
    if device.split(":")[0] != "cpu" or not linear_types & KERNEL_TYPES:
        return None
    return "gguf"


def kept_blocks(quantize: str | None) -> frozenset[str]:
    """The GGUF types a checkpoint should hand over as stored (a view of the file) for this
    form: everything nanoserve's own code reads; other types arrive dequantized."""
    return DEQUANTIZED_HERE if quantize in KERNEL_FORMS else frozenset()


def served_type(form: str, stored: str | None, head: bool = False) -> str:
    """The GGUF type a weight stored as `stored` (None: floats) is served in under `form`."""
    if form == "gguf":
        return stored if stored in KERNEL_TYPES else "Q8_0"
    if form == "q4" and not head:
        return stored if stored in ("Q4_0", "Q4_1") else "Q4_1"
    return "Q8_0"  # q8, and the output projection under q4: its logits pick the token


def dense(source: Source, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The source as a float tensor in dtype on device (blocks dequantized)."""
    if isinstance(source, GgufBlocks):
        source = dequantize_blocks(source)
    if source.device != device:
        source = source.to(device)
    return source if source.dtype == dtype else source.to(dtype)


def quant_weight(source: Source, form: str, head: bool = False) -> QuantWeight:
    """One tensor packed in the type `form` serves it in: its own blocks where that is its type
    (then its pages of the file are dropped), else re-quantized with llama.cpp's rounding."""
    stored = source.kind if isinstance(source, GgufBlocks) else None
    target = served_type(form, stored, head)
    if isinstance(source, GgufBlocks) and source.kind == target:
        weight = QuantWeight.pack(source)
        source.done()
        return weight
    floats = dense(source, torch.float32, torch.device("cpu"))
    if isinstance(source, GgufBlocks):
        source.done()  # read for good: its floats are in hand
    blocks = quantize_q4_1(floats) if target == "Q4_1" else quantize_q8_0(floats)
    return QuantWeight.pack(blocks, stored=stored or _float_name(floats))


def _float_name(t: torch.Tensor) -> str:
    return {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}.get(t.dtype, "F32")


def make_linear(
    parts: Sequence[Source],
    form: str | None,
    dtype: torch.dtype,
    device: torch.device,
    head: bool = False,
) -> Linear:
    """One linear from its parts (stacked along the output features) in the given form."""
    if form in KERNEL_FORMS:
        assert form is not None
        return QuantLinear(tuple(quant_weight(p, form, head) for p in parts))
    weights = [dense(p, dtype, device) for p in parts]
    weight = weights[0] if len(weights) == 1 else torch.cat(weights)
    return Int8Weight.quantize(weight, dtype) if form == "int8" else weight


def describe_types(weights: Sequence[QuantWeight | GgufBlocks]) -> str:
    """ "q5_0×133 q8_0×13 q6_k×12 q4_k×12": the types served, most used first."""
    counts = Counter(w.kind.lower() for w in weights)
    return " ".join(f"{kind}×{n}" for kind, n in counts.most_common())


def describe_fallbacks(weights: Sequence[QuantWeight]) -> str | None:
    """ "f16×2 as q8_0 (re-quantized)": the stored types that had no kernel, and what served
    them; None when every weight was served in its own type."""
    moved = Counter((w.stored.lower(), w.kind.lower()) for w in weights if w.stored != w.kind)
    if not moved:
        return None
    return ", ".join(f"{s}×{n} as {k} (re-quantized)" for (s, k), n in sorted(moved.items()))


def prepare_kernels(config: ModelConfig, quantize: str | None, device: torch.device) -> None:
    """For a weight form only nanoserve's CPU kernels read: the device is a CPU, the shapes fit
    the kernels, and the kernels are built (a decoder's and an encoder's one check)."""
    if quantize not in KERNEL_FORMS:
        return
    if device.type != "cpu":
        raise QuantizationError(f"quantize {quantize} runs on the CPU, not {device}")
    check_kernel_geometry(config)
    load_cpu_kernels()


def check_kernel_geometry(config: ModelConfig) -> None:
    """The shapes nanoserve's CPU kernels take: 16-lane vectors along every row they read."""
    problems = [
        f"{name} {value} is not a multiple of {multiple}"
        for name, value, multiple in (
            ("hidden_size", config.hidden_size, 32),
            ("intermediate_size", config.intermediate_size, 32),
            ("head_dim", config.head_dim, 16),
            ("q_size", config.q_size, 32),
        )
        if value % multiple
    ]
    if problems:
        raise QuantizationError(f"the CPU kernels cannot run this model: {'; '.join(problems)}")


def linear_kernels(quantize: str | None, dtype: torch.dtype, device: torch.device) -> str:
    """What runs the linears and the rest of a layer, for the boot line and /health."""
    if quantize in KERNEL_FORMS:
        forms = "gguf" if quantize == "gguf" else f"{quantize}+q8"
        return f"{forms} nanoserve/{load_cpu_kernels().isa}"
    if quantize == "int8":
        return "int8 torch/_weight_int8pack_mm"
    name = str(dtype).removeprefix("torch.")
    if device.type != "cpu":
        return f"{name} torch/{device.type}"
    return f"{name} torch/{'mkl' if dtype == torch.float32 else 'onednn'}"

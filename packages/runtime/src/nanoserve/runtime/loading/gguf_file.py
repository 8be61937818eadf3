"""A llama.cpp GGUF file read as a Hugging Face checkpoint: HF names, HF layout, its own blocks.

Three things differ from a Hugging Face checkpoint and are undone here, tensor by tensor:

- names: `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`, and so on;
- shapes: GGUF lists dimensions fastest-first, the reverse of torch;
- rows: llama.cpp's converter permutes the rows of Llama's (and SmolLM3's) Q and K projections
  (per head, the two rotary halves interleaved) for its rotary kernel. Qwen2, Qwen3 and Gemma 3
  are converted without it.

A mixture of experts stores each layer's experts stacked (`ffn_gate_exps`: [experts, rows,
cols]); each expert is presented as its own tensor (`mlp.experts.{e}.gate_proj.weight`), a
slice of the stacked one's bytes, so an expert's blocks are still a view of the file.

A hybrid's recurrent layers (LFM2's convolutions, Qwen3.5's DeltaNet) are stored in their own
names, shapes and values: gguf_recurrent.py. Gemma 3's and Qwen3.5's converters also add the 1
of their `(1 + w)` norms into the stored weights, so a GGUF's config says `norm_offset=0`. The
metadata is read as a ModelConfig in gguf_config.py, with what llama.cpp's loader fixes rather
than the file stores.

Opening parses the header (gguf_reader.py) and maps the file; nothing of the weights is read.
`iter_tensors` hands each tensor over when it reaches it: as its blocks, a view of the map
(GgufBlocks), for the types a caller keeps; else as float32 values, dequantized by nanoserve's
own code for the types it knows (bit for bit the file's values) and by the `gguf` package for
the rest. Tensor types and shapes are all checked at open, before anything is read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from nanoserve.runtime.errors import (
    UnsupportedModelError,
    UnsupportedQuantError,
    WeightsError,
)
from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.loading.encoder_names import gguf_encoder_name
from nanoserve.runtime.loading.expert_layers import (
    GGUF_EXPERT_BIAS,
    GGUF_EXPERT_PARTS,
    GGUF_GEMMA4_SCALES,
    GGUF_SHARED_IS_MLP,
    GGUF_SHARED_PARTS,
)
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.gguf_config import gguf_config, rope_scaling_tensors
from nanoserve.runtime.loading.gguf_reader import GgufReader, TensorInfo
from nanoserve.runtime.loading.gguf_recurrent import (
    GRANITE_LAYER_NAMES,
    GRANITE_WHOLE_NAMES,
    LFM2_LAYER_NAMES,
    MTP,
    QWEN35_LAYER_NAMES,
    QWEN35_WHOLE_NAMES,
    hf_shape,
    hf_values,
    text_layers,
)
from nanoserve.runtime.loading.gguf_types import DEQUANTIZED_HERE, GGML_TYPES, GgmlType
from nanoserve.runtime.loading.model_config import Architecture, ModelConfig
from nanoserve.runtime.loading.pooler_config import GGUF_DENSE
from nanoserve.runtime.text.family_templates import family_template
from nanoserve.runtime.text.tokenizer import Tokenizer

# The `gguf` package dequantizes these too (its `quants` module), more slowly.
_GGUF_PACKAGE_TYPES = frozenset(
    {"IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ3_XXS", "IQ4_NL", "IQ4_XS"}
    | {"MXFP4", "TQ1_0", "TQ2_0"}
)
SUPPORTED_TYPES = DEQUANTIZED_HERE | _GGUF_PACKAGE_TYPES
# GGUF's architecture name -> the family's
_ARCHITECTURES: dict[str, Architecture] = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "gemma4": "gemma4",
    "gemma-embedding": "gemma3",  # EmbeddingGemma: bidirectional, two Dense after pooling
    "smollm3": "smollm3",
    "phi3": "phi3",
    "lfm2": "lfm2",
    "lfm2moe": "lfm2",  # LFM2-MoE: LFM2 with experts
    "qwen35": "qwen3_5",
    "qwen35moe": "qwen3_5",  # Qwen3.5-MoE: Qwen3.5 with experts
    "granitehybrid": "granitemoehybrid",
    "qwen3moe": "qwen3_moe",
    "olmoe": "olmoe",
    "gpt-oss": "gpt_oss",
    "bert": "bert",
    "nomic-bert": "nomic_bert",
}
# Q/K rows interleaved per head
_PERMUTED: tuple[Architecture, ...] = ("llama", "smollm3", "granitemoehybrid")
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    # Gemma 4's per-layer embedding: its table, the projection of the first, that one's norm
    "per_layer_token_embd": "model.embed_tokens_per_layer",
    "per_layer_model_proj": "model.per_layer_model_projection",
    "per_layer_proj_norm": "model.per_layer_projection_norm",
}
_LFM2_GLOBAL_NAMES = _GLOBAL_NAMES | {"token_embd_norm": "model.norm"}  # its final norm
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router
    **GGUF_SHARED_PARTS,  # and its shared expert
}
# Gemma 3's four norms: llama.cpp's ffn_norm is the one before the MLP there.
_GEMMA3_LAYER_NAMES = _LAYER_NAMES | {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Phi-3's fused projections, stored whole (llama.cpp's ffn_up holds gate then up there).
_PHI3_LAYER_NAMES = _LAYER_NAMES | {
    "attn_qkv": "self_attn.qkv_proj",
    "ffn_up": "mlp.gate_up_proj",
}
_LAYER_NAMES_BY_ARCH = {
    "gemma3": _GEMMA3_LAYER_NAMES,
    "gemma4": _GEMMA3_LAYER_NAMES
    | {
        "inp_gate": "per_layer_input_gate",
        "proj": "per_layer_projection",
        "post_norm": "post_per_layer_input_norm",
        # its experts block's norms (26B-A4B)
        "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
        "post_ffw_norm_1": "post_feedforward_layernorm_1",
        "post_ffw_norm_2": "post_feedforward_layernorm_2",
    },
    "phi3": _PHI3_LAYER_NAMES,
    "lfm2": _LAYER_NAMES | LFM2_LAYER_NAMES,
    "qwen3_5": _LAYER_NAMES | QWEN35_LAYER_NAMES,
    "granitemoehybrid": _LAYER_NAMES | GRANITE_LAYER_NAMES | GGUF_SHARED_IS_MLP,
    "gpt_oss": _LAYER_NAMES | {"post_attention_norm": "post_attention_layernorm"},
}
_WHOLE_NAMES_BY_ARCH = {
    "qwen3_5": QWEN35_WHOLE_NAMES,
    "granitemoehybrid": GRANITE_WHOLE_NAMES,
    "lfm2": {GGUF_EXPERT_BIAS: "mlp.expert_bias"},  # LFM2-MoE's choosing bias
    "gpt_oss": {"attn_sinks.weight": "self_attn.sinks"},
    "gemma4": {"layer_output_scale.weight": "layer_scalar", **GGUF_GEMMA4_SCALES},
}
_ROPE_TENSORS = frozenset(
    {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
)
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.([\w.]+)\.(weight|bias)")
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for one without an HF counterpart."""
    if arch in ("bert", "nomic_bert"):
        return gguf_encoder_name(gguf_name)
    whole = _WHOLE_NAMES_BY_ARCH.get(arch, {})
    if (match := _LAYER.fullmatch(gguf_name)) and match.group(2) in whole:
        return f"model.layers.{match.group(1)}.{whole[match.group(2)]}"
    if match := _LAYER_TENSOR.fullmatch(gguf_name):
        layer, part, kind = match.groups()
        names = _LAYER_NAMES_BY_ARCH.get(arch, _LAYER_NAMES)
        return f"model.layers.{layer}.{names[part]}.{kind}" if part in names else None
    if gguf_name in GGUF_DENSE:  # EmbeddingGemma's projections after pooling (pooler_config)
        return gguf_name
    stem, _, kind = gguf_name.rpartition(".")
    names = _LFM2_GLOBAL_NAMES if arch == "lfm2" else _GLOBAL_NAMES
    return f"{names[stem]}.{kind}" if stem in names else None


@dataclass(frozen=True, slots=True)
class GgufFile:
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    tensors: Mapping[str, TensorInfo] = field(repr=False)  # HF name -> the GGUF tensor
    reader: GgufReader = field(repr=False, compare=False)
    # Parts of the file not loaded (Qwen3.5's MTP blocks): part -> its tensor count.
    skipped: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path) -> GgufFile:
        reader = GgufReader.open(path)
        metadata = reader.metadata
        stored_arch = metadata.get("general.architecture")
        if stored_arch not in _ARCHITECTURES:
            supported = ", ".join(_ARCHITECTURES)
            raise UnsupportedModelError(
                path, f"GGUF architecture {stored_arch!r} is not supported (supported: {supported})"
            )
        arch = _ARCHITECTURES[stored_arch]
        layers = text_layers(metadata, stored_arch)
        tensors: dict[str, TensorInfo] = {}
        skipped: dict[str, int] = {}
        for tensor in reader.tensors.values():
            if tensor.name in _ROPE_TENSORS:  # rotary scaling (gguf_config.py)
                continue
            if (block := _LAYER.fullmatch(tensor.name)) and int(block.group(1)) >= layers:
                skipped[MTP] = skipped.get(MTP, 0) + 1  # a multi-token-prediction block
                continue
            if (part := _LAYER_TENSOR.fullmatch(tensor.name)) and part[2] in GGUF_EXPERT_PARTS:
                tensors.update(_experts(tensor, part[1], GGUF_EXPERT_PARTS[part[2]], part[3]))
                continue
            name = hf_tensor_name(tensor.name, arch)
            if name is None:
                raise WeightsError(path, f"tensor {tensor.name!r} has no Hugging Face counterpart")
            kind = GGML_TYPES[tensor.type_id].name
            if kind not in SUPPORTED_TYPES:
                supported = ", ".join(sorted(SUPPORTED_TYPES))
                raise UnsupportedQuantError(
                    path,
                    f"tensor {tensor.name!r} is {kind}, which nanoserve cannot read"
                    f" (supported: {supported})",
                )
            tensors[name] = tensor
        tokenizer = Tokenizer.from_gguf_metadata(metadata, source=str(path))
        gguf_names = frozenset(reader.tensors)
        scaling = rope_scaling_tensors(reader, stored_arch, path)
        config = gguf_config(metadata, arch, stored_arch, gguf_names, tokenizer, path, scaling)
        return cls(
            path=path,
            config=config,
            tokenizer=tokenizer,
            chat_template=metadata.get("tokenizer.chat_template")
            or family_template(arch, metadata.get("tokenizer.ggml.tokens") or ()),
            tensors=tensors,
            reader=reader,
            skipped=skipped,
        )

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: hf_shape(name, t.shape) for name, t in self.tensors.items()}

    def tensor_type(self, name: str) -> GgmlType:
        return GGML_TYPES[self.tensors[name].type_id]

    def iter_tensors(
        self, names: Sequence[str], keep_blocks: frozenset[str] = frozenset()
    ) -> Iterator[tuple[str, torch.Tensor | GgufBlocks]]:
        """`(name, float32 tensor)` in Hugging Face layout, one at a time; a matrix whose type
        is in `keep_blocks` comes as its blocks (a view of the file, rows in HF order by
        `order`)."""
        for name in names:
            info = self.tensors[name]
            kind = GGML_TYPES[info.type_id].name
            shape = hf_shape(name, info.shape)
            if kind in keep_blocks and len(shape) == 2:
                order = self._row_order(name, shape[0])
                rows = self.reader.tensor_rows(info)
                release = lambda info=info: self.reader.release(info)  # noqa: E731
                yield name, GgufBlocks(kind, rows, (shape[0], shape[1]), order, release)
                continue
            values = hf_values(name, self._dequantize(info, kind).reshape(shape))
            if self.config.architecture in _PERMUTED:
                values = _unpermute_llama_rows(name, values, self.config)
            yield name, values

    def _dequantize(self, info: TensorInfo, kind: str) -> torch.Tensor:
        raw = self.reader.tensor_rows(info)  # [rows, bytes]
        width = info.dims[0]
        if kind == "F32":
            return raw.clone().view(torch.float32)  # a copy (aligned): the map is the file's
        if kind in DEQUANTIZED_HERE:
            from nanoserve.runtime.kernels.cpu_kernels import kernels_available

            if kernels_available():
                return kernel_ops.dequantize_rows(raw, info.type_id, width, None)
        import gguf  # the reference dequantizer, for every type nanoserve's code does not read

        values = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType(info.type_id))
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))

    def _row_order(self, name: str, rows: int) -> torch.Tensor | None:
        """Where llama.cpp permuted Q and K rows: HF row f is file row order[f]."""
        if self.config.architecture not in _PERMUTED:
            return None
        order = _unpermute_llama_rows(name, torch.arange(rows), self.config)
        return None if order is None or torch.equal(order, torch.arange(rows)) else order


def _experts(stacked: TensorInfo, layer: str, part: str, kind: str) -> dict[str, TensorInfo]:
    """A stacked expert tensor ([experts, rows, cols]; a bias: [experts, rows]) as one tensor
    per expert, each a slice of the file's bytes, by Hugging Face name."""
    stacked_dims = 3 if kind == "weight" else 2
    experts = stacked.dims[-1] if len(stacked.dims) == stacked_dims else 0
    if not experts or stacked.num_bytes % experts:
        raise WeightsError("gguf", f"tensor {stacked.name!r} of {stacked.dims} is not stacked")
    size = stacked.num_bytes // experts
    if part == "gate_up_proj":  # Gemma 4's: each expert's gate rows, then its up rows
        if stacked.dims[1] % 2 or size % 2:
            raise WeightsError("gguf", f"tensor {stacked.name!r} of {stacked.dims} is not halved")
        cols, rows = stacked.dims[0], stacked.dims[1] // 2
        return {
            f"model.layers.{layer}.mlp.experts.{e}.{which}_proj.{kind}": TensorInfo(
                f"{stacked.name}[{e}].{which}",
                stacked.type_id,
                (cols, rows),
                stacked.offset + e * size + half * (size // 2),
                size // 2,
            )
            for e in range(experts)
            for half, which in enumerate(("gate", "up"))
        }
    return {
        f"model.layers.{layer}.mlp.experts.{e}.{part}.{kind}": TensorInfo(
            f"{stacked.name}[{e}]",
            stacked.type_id,
            stacked.dims[:-1],
            stacked.offset + e * size,
            size,
        )
        for e in range(experts)
    }


def _unpermute_llama_rows(name: str, tensor: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf.py `LlamaModel.permute`).

    llama.cpp wrote, per head, `w.reshape(heads, 2, head_dim // 2, ...).swapaxes(1, 2)`: the two
    rotary halves interleaved, so HF row `h*head_dim + s*head_dim/2 + j` sits at GGUF row
    `h*head_dim + 2*j + s`. Reading it as `(heads, head_dim // 2, 2)` and swapping back restores it.
    """
    if ".self_attn.q_proj." in name:
        heads = config.num_heads
    elif ".self_attn.k_proj." in name:
        heads = config.num_kv_heads
    else:
        return tensor
    shape = tensor.shape
    return (
        tensor.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )

"""A llama.cpp GGUF file read as a Hugging Face checkpoint: HF names, HF layout, its own blocks.

Three things differ from a Hugging Face checkpoint and are undone here, tensor by tensor:

- names: `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`, and so on;
- shapes: GGUF lists dimensions fastest-first, the reverse of torch;
- rows: llama.cpp's converter permutes the rows of Llama's (and SmolLM3's) Q and K projections
  (per head, the two rotary halves interleaved) for its rotary kernel. Qwen2, Qwen3 and Gemma 3
  are converted without it.

A hybrid's recurrent layers (LFM2's convolutions, Qwen3.5's DeltaNet) are stored in their own
names, shapes and values: gguf_recurrent.py. Gemma 3's and Qwen3.5's converters also add the 1
of their `(1 + w)` norms into the stored weights, so a GGUF's config says `norm_offset=0`; and llama.cpp fixes what the file does not store (the sliding
layers' rotary base 10000, every sixth layer global, SmolLM3's rotary-free fourth layers) as
its loader does.

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
from typing import Any

import numpy as np
import torch

from nanoserve.runtime.errors import (
    ConfigError,
    UnsupportedModelError,
    UnsupportedQuantError,
    WeightsError,
)
from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.gguf_reader import GgufReader, TensorInfo
from nanoserve.runtime.loading.gguf_recurrent import (
    GRANITE_LAYER_NAMES,
    GRANITE_WHOLE_NAMES,
    LFM2_LAYER_NAMES,
    MTP,
    QWEN35_LAYER_NAMES,
    QWEN35_WHOLE_NAMES,
    granite_mamba,
    hf_shape,
    hf_values,
    lfm2_short_conv,
    qwen35_delta_net,
    text_layers,
)
from nanoserve.runtime.loading.gguf_types import DEQUANTIZED_HERE, GGML_TYPES, GgmlType
from nanoserve.runtime.loading.model_config import Architecture, ModelConfig
from nanoserve.runtime.loading.rope import FreqFactors, LinearRope, LongRope
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
    "smollm3": "smollm3",
    "phi3": "phi3",
    "lfm2": "lfm2",
    "qwen35": "qwen3_5",
    "granitehybrid": "granitemoehybrid",
}
# Q/K rows interleaved per head
_PERMUTED: tuple[Architecture, ...] = ("llama", "smollm3", "granitemoehybrid")
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
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
    "phi3": _PHI3_LAYER_NAMES,
    "lfm2": _LAYER_NAMES | LFM2_LAYER_NAMES,
    "qwen3_5": _LAYER_NAMES | QWEN35_LAYER_NAMES,
    "granitemoehybrid": _LAYER_NAMES | GRANITE_LAYER_NAMES,
}
_WHOLE_NAMES_BY_ARCH = {"qwen3_5": QWEN35_WHOLE_NAMES, "granitemoehybrid": GRANITE_WHOLE_NAMES}
_ROPE_TENSORS = frozenset(
    {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
)
_GEMMA3_SLIDING_PATTERN = 6  # llama.cpp's: five sliding layers, then one global
_GEMMA3_LOCAL_ROPE_THETA = 10000.0
_SMOLLM3_NO_ROPE_INTERVAL = 4  # llama.cpp's: every fourth layer without rotary
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.([\w.]+)\.(weight|bias)")
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for one without an HF counterpart."""
    whole = _WHOLE_NAMES_BY_ARCH.get(arch, {})
    if (match := _LAYER.fullmatch(gguf_name)) and match.group(2) in whole:
        return f"model.layers.{match.group(1)}.{whole[match.group(2)]}"
    if match := _LAYER_TENSOR.fullmatch(gguf_name):
        layer, part, kind = match.groups()
        names = _LAYER_NAMES_BY_ARCH.get(arch, _LAYER_NAMES)
        return f"model.layers.{layer}.{names[part]}.{kind}" if part in names else None
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
            if tensor.name in _ROPE_TENSORS:  # rotary scaling, read by _rope_scaling
                continue
            if (block := _LAYER.fullmatch(tensor.name)) and int(block.group(1)) >= layers:
                skipped[MTP] = skipped.get(MTP, 0) + 1  # a multi-token-prediction block
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
        scaling = _rope_scaling(reader, stored_arch, path)
        config = _config(metadata, arch, stored_arch, gguf_names, tokenizer, path, scaling)
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


def _config(
    metadata: Mapping[str, Any],
    arch: Architecture,
    stored_arch: str,
    gguf_names: frozenset[str],
    tokenizer: Tokenizer,
    path: Path,
    stored_scaling: FreqFactors | LongRope | None = None,
) -> ModelConfig:
    missing = object()

    def key(name: str, default: Any = missing) -> Any:
        value = metadata.get(f"{stored_arch}.{name}", default)
        if value is missing:
            raise ConfigError(path, f"GGUF metadata has no {stored_arch}.{name!r}")
        return value

    hidden_size = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    num_kv_heads = key("attention.head_count_kv", num_heads)
    short_conv = None
    num_layers = text_layers(metadata, stored_arch)
    qwen3_5 = arch == "qwen3_5"
    delta_net = qwen35_delta_net(key, num_layers, path) if qwen3_5 else None
    granite = arch == "granitemoehybrid"
    mamba = None
    if isinstance(num_kv_heads, list):  # some files list it per layer
        if arch == "lfm2":  # none on a convolution layer
            short_conv = lfm2_short_conv(num_kv_heads, int(key("shortconv.l_cache")), gguf_names)
        if granite:  # none on a Mamba2 layer
            mamba = granite_mamba(key, num_kv_heads[:num_layers], gguf_names)
        num_kv_heads = [n for n in num_kv_heads[:num_layers] if n] or num_kv_heads
        if len(set(num_kv_heads)) != 1:
            raise UnsupportedModelError(path, f"per-layer head_count_kv {num_kv_heads} differs")
        num_kv_heads = num_kv_heads[0]
    head_dim = int(key("attention.key_length", hidden_size // max(num_heads, 1)))
    rope_dim = int(key("rope.dimension_count", head_dim))
    scaling = key("rope.scaling.type", "none")
    rope_scaling: LinearRope | FreqFactors | LongRope | None = stored_scaling
    if scaling == "linear" and arch == "gemma3":  # the global layers of Gemma 3 4B and up
        rope_scaling = LinearRope(float(key("rope.scaling.factor")))
    elif scaling not in ("none", "llama3"):  # llama3: the factors are the rope_freqs tensor
        raise UnsupportedModelError(path, f"{arch}.rope.scaling.type={scaling!r} is not supported")
    window = key("attention.sliding_window", None) if arch in ("gemma3", "phi3") else None
    if window is not None and (not window or window >= int(key("context_length"))):
        window = None  # a window no narrower than the context is none
    gemma = arch == "gemma3"
    try:
        return ModelConfig(
            architecture=arch,
            vocab_size=int(key("vocab_size", len(metadata["tokenizer.ggml.tokens"]))),
            hidden_size=hidden_size,
            # Granite's dense MLP is its "shared expert": its width is stored as such
            intermediate_size=int(
                key("expert_shared_feed_forward_length")
                if granite and key("expert_shared_feed_forward_length", None)
                else key("feed_forward_length")
            ),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(num_kv_heads),
            head_dim=head_dim,
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_scaling=rope_scaling,
            rotary_dim=rope_dim if rope_dim != head_dim else None,
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            # llama.cpp writes `output.weight` only when the output projection is not the embedding
            tie_word_embeddings="output.weight" not in gguf_names,
            attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in gguf_names,
            max_position_embeddings=int(key("context_length")),
            eos_token_ids=tokenizer.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,
            hidden_act="gelu_tanh" if gemma else "silu",
            qk_norm=arch in ("qwen3", "gemma3", "lfm2", "qwen3_5"),
            sandwich_norm=gemma,
            embedding_multiplier=float(hidden_size) ** 0.5
            if gemma
            else float(key("embedding_scale", 1.0)),
            # llama.cpp scales Gemma 3's queries by 1/sqrt(head_dim) (query_pre_attn_scalar is
            # head_dim for every size but 27B, which llama.cpp special-cases the same way)
            query_scale=head_dim**-0.5
            if gemma
            else float(key("attention.scale"))
            if granite and key("attention.scale", None)
            else None,
            no_rope_layers=_no_rope_layers(arch, num_layers, key),
            sliding_window=None if window is None else int(window),
            sliding_layers=tuple(
                i for i in range(num_layers) if not gemma or (i + 1) % _GEMMA3_SLIDING_PATTERN
            )
            if window is not None
            else (),
            sliding_rope_theta=_GEMMA3_LOCAL_ROPE_THETA if gemma else None,
            short_conv=short_conv,
            delta_net=delta_net,
            attn_output_gate=qwen3_5,
            mamba=mamba,
            residual_multiplier=float(key("residual_scale", 1.0)) if granite else 1.0,
            logits_scaling=float(key("logit_scale", 1.0)) if granite else 1.0,
            fused_mlp=arch == "phi3",  # llama.cpp splits Granite's shared MLP in two
        )
    except ConfigError as error:  # re-raised naming the file rather than the class
        raise ConfigError(path, error.problem) from None


def _no_rope_layers(arch: str, num_layers: int, key: Any) -> tuple[int, ...]:
    """SmolLM3's every fourth layer; every layer of a Granite hybrid whose file says its rotary
    is not used (`rope.scaling.finetuned` false, as the converter writes for a hybrid)."""
    if arch == "smollm3":
        return tuple(i for i in range(num_layers) if (i + 1) % _SMOLLM3_NO_ROPE_INTERVAL == 0)
    if arch == "granitemoehybrid" and not key("rope.scaling.finetuned", True):
        return tuple(range(num_layers))
    return ()


def _rope_scaling(reader: GgufReader, arch: str, path: Path) -> FreqFactors | LongRope | None:
    """Rotary scaling that llama.cpp's converter stores as tensors: Llama 3.1+'s one factor per
    frequency (`rope_freqs`), or Phi-3's longrope divisors (`rope_factors_long`/`_short`, with
    the attention factor and the pretraining context in the metadata); else None."""
    if "rope_freqs.weight" in reader.tensors:
        return FreqFactors(_f32_vector(reader, "rope_freqs.weight", path))
    if "rope_factors_long.weight" not in reader.tensors:
        return None
    metadata = reader.metadata
    original = metadata.get(f"{arch}.rope.scaling.original_context_length")
    if not isinstance(original, int):
        raise ConfigError(path, f"longrope without {arch}.rope.scaling.original_context_length")
    return LongRope(
        short_factor=_f32_vector(reader, "rope_factors_short.weight", path),
        long_factor=_f32_vector(reader, "rope_factors_long.weight", path),
        original_max_position_embeddings=original,
        attention_factor=float(metadata.get(f"{arch}.rope.scaling.attn_factor", 1.0)),
    )


def _f32_vector(reader: GgufReader, name: str, path: Path) -> tuple[float, ...]:
    info = reader.tensors.get(name)
    if info is None or GGML_TYPES[info.type_id].name != "F32" or len(info.dims) != 1:
        raise WeightsError(path, f"{name} must be a float32 vector")
    return tuple(float(v) for v in reader.tensor_bytes(info).clone().view(torch.float32))

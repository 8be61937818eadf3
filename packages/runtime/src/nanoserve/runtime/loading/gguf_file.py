"""A llama.cpp GGUF file read as a Hugging Face checkpoint: HF names, HF layout, float32 values.

Three things differ from a Hugging Face checkpoint and are undone here, tensor by tensor:

- names: `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`, and so on;
- shapes: GGUF lists dimensions fastest-first, the reverse of torch;
- rows: llama.cpp's converter permutes the rows of Llama's Q and K projections (per head, the
  two rotary halves interleaved) for its rotary kernel. Qwen2 is converted without it.

Opening reads only the header; each tensor is dequantized (with `gguf.quants`) when `iter_tensors`
reaches it, or, for the block types a caller keeps, handed over as its raw blocks (GgufBlocks).
Tensor types and shapes are all checked at open, before anything is read.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import torch
from gguf import GGMLQuantizationType as Q
from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs installed

from nanoserve.runtime.errors import (
    ConfigError,
    UnsupportedModelError,
    UnsupportedQuantError,
    WeightsError,
)
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.model_config import Architecture, ModelConfig
from nanoserve.runtime.text.tokenizer import Tokenizer

GGUF_MAGIC = b"GGUF"
SUPPORTED_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0}
    | {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)
_ARCHITECTURES: tuple[Architecture, ...] = ("llama", "qwen2")
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
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
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for one without an HF counterpart."""
    if match := _LAYER_TENSOR.fullmatch(gguf_name):
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}" if part in _LAYER_NAMES else None
    stem, _, kind = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES[stem]}.{kind}" if stem in _GLOBAL_NAMES else None


@dataclass(frozen=True, slots=True)
class GgufFile:
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    # HF name -> the GGUF tensor (its data a view of the mmap)
    tensors: Mapping[str, gguf.ReaderTensor] = field(repr=False)

    @classmethod
    def open(cls, path: Path) -> GgufFile:
        reader = _reader(path)
        metadata = {key: value.contents() for key, value in reader.fields.items()}
        arch = metadata.get("general.architecture")
        if arch not in _ARCHITECTURES:
            raise UnsupportedModelError(
                path, f"GGUF architecture {arch!r} is not supported (supported: {_ARCHITECTURES})"
            )
        tensors: dict[str, gguf.ReaderTensor] = {}
        for tensor in reader.tensors:
            name = hf_tensor_name(tensor.name)
            if tensor.name == "rope_freqs.weight":  # Llama-3.1 rope scaling, baked into a tensor
                raise UnsupportedModelError(
                    path, "rope_freqs (Llama-3 rope scaling) is not supported"
                )
            if name is None:
                raise WeightsError(path, f"tensor {tensor.name!r} has no Hugging Face counterpart")
            if tensor.tensor_type not in SUPPORTED_TYPES:
                supported = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
                raise UnsupportedQuantError(
                    path,
                    f"tensor {tensor.name!r} is {tensor.tensor_type.name}, which nanoserve cannot "
                    f"dequantize (supported: {supported})",
                )
            tensors[name] = tensor
        tokenizer = Tokenizer.from_gguf_metadata(metadata, source=str(path))
        gguf_names = frozenset(t.name for t in reader.tensors)
        config = _config(metadata, arch, gguf_names, tokenizer, path)
        return cls(
            path=path,
            config=config,
            tokenizer=tokenizer,
            chat_template=metadata.get("tokenizer.chat_template"),
            tensors=tensors,
        )

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: _torch_shape(t) for name, t in self.tensors.items()}

    def iter_tensors(
        self, names: Sequence[str], keep_blocks: frozenset[str] = frozenset()
    ) -> Iterator[tuple[str, torch.Tensor | GgufBlocks]]:
        """`(name, float32 tensor)` in Hugging Face layout, dequantized one at a time; a tensor
        whose type is in `keep_blocks` comes as its blocks (rows in Hugging Face order)."""
        progress = tqdm(names, desc=f"reading {self.path.name}", unit="tensor", disable=None)
        for name in progress:
            tensor = self.tensors[name]
            if tensor.tensor_type.name in keep_blocks:
                rows = torch.from_numpy(tensor.data.copy())  # [out, bytes]; the mmap is read-only
                if self.config.architecture == "llama":
                    rows = _unpermute_llama_rows(name, rows, self.config)
                shape = _torch_shape(tensor)
                yield name, GgufBlocks(tensor.tensor_type.name, rows, (shape[0], shape[1]))
                continue
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            values = values.reshape(_torch_shape(tensor))
            if not values.flags.writeable:  # F32 comes back as a view of the read-only mmap
                values = values.copy()
            out = torch.from_numpy(values)
            if self.config.architecture == "llama":
                out = _unpermute_llama_rows(name, out, self.config)
            yield name, out


def _reader(path: Path) -> gguf.GGUFReader:
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as error:
        raise WeightsError(path, f"cannot be read ({error.strerror})") from None
    if magic != GGUF_MAGIC:
        raise WeightsError(path, f"is not a GGUF file (starts with {magic!r}, not {GGUF_MAGIC!r})")
    try:
        return gguf.GGUFReader(path, "r")
    except (ValueError, KeyError, IndexError, OSError, struct.error) as error:
        # A truncated file fails here: gguf maps each tensor's bytes as it parses the header.
        raise WeightsError(path, f"cannot be parsed as GGUF, truncated? ({error})") from None


def _torch_shape(tensor: gguf.ReaderTensor) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(tensor.shape))


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
    gguf_names: frozenset[str],
    tokenizer: Tokenizer,
    path: Path,
) -> ModelConfig:
    missing = object()

    def key(name: str, default: Any = missing) -> Any:
        value = metadata.get(f"{arch}.{name}", default)
        if value is missing:
            raise ConfigError(path, f"GGUF metadata has no {arch}.{name!r}")
        return value

    hidden_size = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    num_kv_heads = key("attention.head_count_kv", num_heads)
    if isinstance(num_kv_heads, list):  # some files list it per layer
        if len(set(num_kv_heads)) != 1:
            raise UnsupportedModelError(path, f"per-layer head_count_kv {num_kv_heads} differs")
        num_kv_heads = num_kv_heads[0]
    head_dim = int(key("attention.key_length", hidden_size // max(num_heads, 1)))
    rope_dim = int(key("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise UnsupportedModelError(path, f"partial rotary ({rope_dim} of {head_dim} dims)")
    scaling = key("rope.scaling.type", "none")
    if scaling != "none":
        raise UnsupportedModelError(path, f"{arch}.rope.scaling.type={scaling!r} is not supported")
    try:
        return ModelConfig(
            architecture=arch,
            vocab_size=int(key("vocab_size", len(metadata["tokenizer.ggml.tokens"]))),
            hidden_size=hidden_size,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=num_heads,
            num_kv_heads=int(num_kv_heads),
            head_dim=head_dim,
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_scaling=None,
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            # llama.cpp writes `output.weight` only when the output projection is not the embedding
            tie_word_embeddings="output.weight" not in gguf_names,
            attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in gguf_names,
            max_position_embeddings=int(key("context_length")),
            eos_token_ids=tokenizer.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,
        )
    except ConfigError as error:  # re-raised naming the file rather than the class
        raise ConfigError(path, error.problem) from None

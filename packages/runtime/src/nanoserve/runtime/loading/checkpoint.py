"""A model on disk, opened and checked: its config, tokenizer, chat template, and tensors on demand.

`load_checkpoint` accepts a Hugging Face directory or a `.gguf` file. Both are presented the same
way: tensors under Hugging Face names in Hugging Face layout. Before a `Checkpoint` is returned,
every tensor the config implies is checked to exist with the implied shape (from file headers,
without reading data), so iterating `tensors()` cannot fail halfway for a malformed checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import torch

from nanoserve.runtime.errors import WeightsError
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.hf_dir import HfDir
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.text.tokenizer import Tokenizer

if TYPE_CHECKING:  # gguf_file imports gguf, which a GPU machine without an index may lack
    from nanoserve.runtime.loading.gguf_file import GgufFile

# Tensors some checkpoints carry that are derived, not learned: skipped rather than rejected.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


class TensorSource(Protocol):
    """Where a checkpoint's tensors come from: header shapes now, data on iteration."""

    def tensor_shapes(self) -> Mapping[str, tuple[int, ...]]: ...

    def iter_tensors(
        self, names: Sequence[str], keep_blocks: frozenset[str] = frozenset()
    ) -> Iterator[tuple[str, torch.Tensor | GgufBlocks]]: ...


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: Path
    format: Literal["hf", "gguf"]
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    source: TensorSource = field(repr=False, compare=False)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor `tensors()` yields, in that order, with its shape."""
        return expected_tensor_shapes(self.config)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`(hf_name, tensor)` one at a time, in `tensor_shapes()` order.

        Hugging Face directories yield the stored dtype; GGUF files yield float32 (dequantized).
        Each tensor is freshly read: the caller owns it and may keep, cast or drop it.
        """
        for name, tensor in self.sources():
            assert isinstance(tensor, torch.Tensor)  # no block type was kept
            yield name, tensor

    def linear_types(self) -> frozenset[str]:
        """The stored types of the layers' linear weights ("Q4_1", ...): a GGUF's; a Hugging
        Face directory's are floats and named by none."""
        if self.format != "gguf":
            return frozenset()
        source: GgufFile = self.source  # type: ignore[assignment]
        return frozenset(
            source.tensor_type(name).name
            for name in source.tensors
            if ".layers." in name and name.endswith("_proj.weight")
        )

    def sources(
        self, keep_blocks: frozenset[str] = frozenset()
    ) -> Iterator[tuple[str, torch.Tensor | GgufBlocks]]:
        """As `tensors()`, except that a GGUF tensor whose type is in `keep_blocks` comes as its
        blocks, for a weight form that reads them as stored."""
        shapes = self.tensor_shapes()
        for name, tensor in self.source.iter_tensors(list(shapes), keep_blocks):
            if tuple(tensor.shape) != shapes[name]:  # checked at load; a changed file lands here
                raise WeightsError(self.path, _shape_problem(name, shapes[name], tensor.shape))
            yield name, tensor


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Open a Hugging Face directory or a `.gguf` file, and check its tensors against its config."""
    path = Path(path)
    source: HfDir | GgufFile
    fmt: Literal["hf", "gguf"]
    if path.is_dir():
        source, fmt = HfDir.open(path), "hf"
    elif path.is_file() and path.suffix.lower() == ".gguf":
        # Imported here: only a .gguf needs the gguf package; a Hugging Face directory does not.
        from nanoserve.runtime.loading.gguf_file import GgufFile

        source, fmt = GgufFile.open(path), "gguf"
    elif path.exists():
        raise WeightsError(path, "is neither a model directory nor a .gguf file")
    else:
        raise WeightsError(path, "no such file or directory")
    check_tensor_shapes(path, source.config, source.tensor_shapes())
    return Checkpoint(
        path=path,
        format=fmt,
        config=source.config,
        tokenizer=source.tokenizer,
        chat_template=source.chat_template,
        source=source,
    )


def expected_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor names -> shapes for `config`, in load order."""
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        if config.fused_projections:
            shapes[f"{attn}.qkv_proj.weight"] = (config.q_size + 2 * config.kv_size, hidden)
        else:
            shapes[f"{attn}.q_proj.weight"] = (config.q_size, hidden)
            shapes[f"{attn}.k_proj.weight"] = (config.kv_size, hidden)
            shapes[f"{attn}.v_proj.weight"] = (config.kv_size, hidden)
        if config.attention_bias:
            shapes[f"{attn}.q_proj.bias"] = (config.q_size,)
            shapes[f"{attn}.k_proj.bias"] = (config.kv_size,)
            shapes[f"{attn}.v_proj.bias"] = (config.kv_size,)
        shapes[f"{attn}.o_proj.weight"] = (hidden, config.q_size)
        if config.fused_projections:
            shapes[f"{mlp}.gate_up_proj.weight"] = (2 * inter, hidden)
        else:
            shapes[f"{mlp}.gate_proj.weight"] = (inter, hidden)
            shapes[f"{mlp}.up_proj.weight"] = (inter, hidden)
        shapes[f"{mlp}.down_proj.weight"] = (hidden, inter)
        if config.qk_norm:  # one RMSNorm weight per head dimension, shared by the heads
            shapes[f"{attn}.q_norm.weight"] = (config.head_dim,)
            shapes[f"{attn}.k_norm.weight"] = (config.head_dim,)
        for norm in layer_norm_names(config):
            shapes[f"model.layers.{i}.{norm}.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def layer_norm_names(config: ModelConfig) -> tuple[str, ...]:
    """A layer's RMSNorms by Hugging Face name: Llama's two (before attention, before the MLP);
    with sandwich norms (Gemma 3) four, where `post_attention_layernorm` normalises attention's
    output and `pre_feedforward_layernorm` is the one before the MLP."""
    if config.sandwich_norm:
        return (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        )
    return ("input_layernorm", "post_attention_layernorm")


def check_tensor_shapes(
    path: Path, config: ModelConfig, actual: Mapping[str, tuple[int, ...]]
) -> None:
    """Raise `WeightsError` unless `actual` holds exactly the tensors `config` implies."""
    expected = expected_tensor_shapes(config)
    missing = [name for name in expected if name not in actual]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(path, f"tensor {missing[0]!r} is missing{more}")
    for name, shape in expected.items():
        if tuple(actual[name]) != shape:
            raise WeightsError(path, _shape_problem(name, shape, actual[name]))
    # A tied checkpoint may still store lm_head (a copy of the embedding); it is not read.
    allowed = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unexpected = sorted(
        name
        for name in actual
        if name not in expected and name not in allowed and not name.endswith(_IGNORED_SUFFIXES)
    )
    if unexpected:
        raise WeightsError(
            path, f"holds tensors the config does not imply: {', '.join(unexpected[:5])}"
        )


def _shape_problem(name: str, expected: tuple[int, ...], actual: Sequence[int]) -> str:
    return f"tensor {name!r} has shape {list(actual)}, but the config implies {list(expected)}"

"""A model on disk, opened and checked: its config, tokenizer, chat template, and tensors on demand.

`load_checkpoint` accepts a Hugging Face directory or a `.gguf` file. Both are presented the same
way: tensors under Hugging Face names in Hugging Face layout. Before a `Checkpoint` is returned,
every tensor the config implies is checked to exist with the implied shape (from file headers,
without reading data), so iterating `tensors()` cannot fail halfway for a malformed checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import torch

from nanoserve.core.pooling import PoolingMethod
from nanoserve.runtime.errors import WeightsError
from nanoserve.runtime.loading.encoder_names import HEAD_NAMES, encoder_tensor_shapes
from nanoserve.runtime.loading.expert_layers import EXPERT_BRANCH_NORMS
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.hf_dir import HfDir
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.loading.pooler_config import (
    GENERATE,
    GGUF_DENSE,
    DenseLayer,
    PoolerConfig,
    encoder_pooler,
    read_gguf_pooler,
    read_hf_pooler,
)
from nanoserve.runtime.loading.recurrent_layers import (
    DeltaNetLayers,
    Mamba2Layers,
    ShortConvLayers,
)
from nanoserve.runtime.text.tokenizer import Tokenizer

if TYPE_CHECKING:  # gguf_file imports gguf, which a GPU machine without an index may lack
    from nanoserve.runtime.loading.gguf_file import GgufFile

LM_HEAD = "lm_head.weight"
CLASSIFIER = ("score.weight", "score.bias")  # a *ForSequenceClassification head
# Tensors some checkpoints carry that are derived, not learned: skipped rather than rejected.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq", "embeddings.position_ids")


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
    pooler: PoolerConfig = GENERATE  # what the files say the model is for (pooler_config.py)

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

    @property
    def skipped(self) -> Mapping[str, int]:
        """Parts of the checkpoint not loaded (Qwen3.5's vision tower): part -> tensor count."""
        skipped: Mapping[str, int] = getattr(self.source, "skipped", {})
        return skipped

    def linear_types(self) -> frozenset[str]:
        """The stored types of the layers' linear weights ("Q4_1", ...): a GGUF's; a Hugging
        Face directory's are floats and named by none."""
        if self.format != "gguf":
            return frozenset()
        source: GgufFile = self.source  # type: ignore[assignment]
        return frozenset(
            source.tensor_type(name).name
            for name in source.tensors
            if (".layers." in name and name.endswith("_proj.weight"))
            or (
                name.startswith("encoder.layer.")
                and name.endswith(".weight")
                and "Norm" not in name
            )
        )

    def head_tensor(self, name: str) -> torch.Tensor | None:
        """A scoring head's tensor (`score.weight`), which the forward does not read; None if
        the checkpoint has none."""
        if name not in self.source.tensor_shapes():
            return None
        for _, tensor in self.source.iter_tensors([name]):
            assert isinstance(tensor, torch.Tensor)
            return tensor.float()
        return None

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
    if isinstance(source, HfDir):
        pooler = read_hf_pooler(path, dict(source.config_json))
    else:
        metadata = source.reader.metadata
        pooler = read_gguf_pooler(metadata, str(metadata.get("general.architecture")))
    config = source.config
    shapes = source.tensor_shapes()
    if config.encoder is not None:  # an encoder embeds or scores, by its first token unless told
        pooler = encoder_pooler(pooler, shapes)
    elif config.bidirectional and pooler.task == "generate":  # EmbeddingGemma's own pooling
        pooler = PoolerConfig("embed", PoolingMethod.MEAN, True, source="bidirectional attention")
    if not isinstance(source, HfDir) and pooler.task == "embed":  # its Dense modules, if stored
        pooler = dataclasses.replace(pooler, dense=_gguf_dense(source))
    if pooler.task != "generate" and not config.tie_word_embeddings and LM_HEAD not in shapes:
        # An embedder saved without its LM head: the embedding table stands in (never served)
        config = dataclasses.replace(config, tie_word_embeddings=True)
    check_tensor_shapes(path, config, shapes, heads=pooler.head == "classifier")
    return Checkpoint(
        path=path,
        format=fmt,
        config=config,
        tokenizer=source.tokenizer,
        chat_template=source.chat_template,
        source=source,
        pooler=pooler,
    )


def _gguf_dense(source: GgufFile) -> tuple[DenseLayer, ...]:
    """A GGUF embedder's Dense projections after pooling (EmbeddingGemma's), in order."""
    names = [name for name in GGUF_DENSE if name in source.tensors]
    return tuple(
        DenseLayer(tensor.float(), None, "identity")
        for _, tensor in source.iter_tensors(names)
        if isinstance(tensor, torch.Tensor)
    )


def expected_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor names -> shapes for `config`, in load order."""
    hidden, inter = config.hidden_size, config.intermediate_size
    if config.encoder is not None:
        return encoder_tensor_shapes(
            config.encoder,
            vocab=config.vocab_size,
            hidden=hidden,
            inter=inter,
            layers=config.num_layers,
            positions=config.max_position_embeddings,
        )
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    conv, delta, mamba = config.short_conv, config.delta_net, config.mamba
    # Qwen3.5's query projection is twice as wide: each head's query, then its output gate.
    q_rows = 2 * config.q_size if config.attn_output_gate else config.q_size
    for i in range(config.num_layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        inter = config.layer_intermediate_size(i)
        if config.architecture == "gemma4":  # heads of each layer's own shape, shared K/V
            shapes.update(gemma4_attention_shapes(config, i))
        elif conv is not None and i in conv.layers:  # LFM2's gated short convolution
            shapes.update(short_conv_shapes(f"model.layers.{i}.conv", hidden, conv))
        elif delta is not None and i in delta.layers:  # Qwen3.5's gated DeltaNet
            shapes.update(delta_net_shapes(f"model.layers.{i}.linear_attn", hidden, delta))
        elif mamba is not None and i in mamba.layers:  # Granite 4.0-H's Mamba2
            shapes.update(mamba2_shapes(f"model.layers.{i}.mamba", hidden, mamba))
        elif config.fused_projections:
            shapes[f"{attn}.qkv_proj.weight"] = (config.q_size + 2 * config.kv_size, hidden)
        else:
            shapes[f"{attn}.q_proj.weight"] = (q_rows, hidden)
            shapes[f"{attn}.k_proj.weight"] = (config.kv_size, hidden)
            shapes[f"{attn}.v_proj.weight"] = (config.kv_size, hidden)
        attends = i not in config.recurrent_layers
        own_heads = config.architecture == "gemma4"  # its attention's tensors are all above
        attends = attends and not own_heads
        if config.attention_bias and attends:
            shapes[f"{attn}.q_proj.bias"] = (config.q_size,)
            shapes[f"{attn}.k_proj.bias"] = (config.kv_size,)
            shapes[f"{attn}.v_proj.bias"] = (config.kv_size,)
        if attends:
            shapes[f"{attn}.o_proj.weight"] = (hidden, config.q_size)
        if attends and config.output_bias:
            shapes[f"{attn}.o_proj.bias"] = (hidden,)
        if attends and config.attention_sinks:
            shapes[f"{attn}.sinks"] = (config.num_heads,)
        experts = config.experts
        routed = experts is not None and i in experts.layers
        if routed and experts is not None:  # the router, experts
            shapes.update(experts.expert_shapes(mlp, hidden, config.fused_mlp))
        if routed and not (experts is not None and experts.beside_mlp):
            pass  # the experts in place of the MLP (Gemma 4 keeps its MLP beside them)
        elif config.fused_mlp:
            shapes[f"{mlp}.gate_up_proj.weight"] = (2 * inter, hidden)
            shapes[f"{mlp}.down_proj.weight"] = (hidden, inter)
        else:
            shapes[f"{mlp}.gate_proj.weight"] = (inter, hidden)
            shapes[f"{mlp}.up_proj.weight"] = (inter, hidden)
            shapes[f"{mlp}.down_proj.weight"] = (hidden, inter)
        if config.qk_norm and attends:  # one RMSNorm weight per head dimension, shared by heads
            shapes[f"{attn}.q_norm.weight"] = (config.head_dim,)
            shapes[f"{attn}.k_norm.weight"] = (config.head_dim,)
        if config.projection_qk_norm and attends:  # one over each whole projection (OLMoE)
            shapes[f"{attn}.q_norm.weight"] = (config.q_size,)
            shapes[f"{attn}.k_norm.weight"] = (config.kv_size,)
        for norm in layer_norm_names(config):
            shapes[f"model.layers.{i}.{norm}.weight"] = (hidden,)
        if config.per_layer_inputs is not None:
            width = config.per_layer_inputs.width
            shapes[f"model.layers.{i}.per_layer_input_gate.weight"] = (width, hidden)
            shapes[f"model.layers.{i}.per_layer_projection.weight"] = (hidden, width)
        if config.layer_scalar:
            shapes[f"model.layers.{i}.layer_scalar"] = (1,)
    shapes["model.norm.weight"] = (hidden,)
    if config.per_layer_inputs is not None:
        p, packed = config.per_layer_inputs, config.num_layers * config.per_layer_inputs.width
        shapes["model.embed_tokens_per_layer.weight"] = (p.vocab_size, packed)
        shapes["model.per_layer_model_projection.weight"] = (packed, hidden)
        shapes["model.per_layer_projection_norm.weight"] = (p.width,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def short_conv_shapes(
    prefix: str, hidden: int, conv: ShortConvLayers
) -> dict[str, tuple[int, ...]]:
    """An LFM2 convolution layer's tensors: the projection to B, C and x, the depthwise kernel
    (Conv1d's [channels, 1, taps]), the output projection; with `conv_bias`, their biases."""
    shapes: dict[str, tuple[int, ...]] = {
        f"{prefix}.in_proj.weight": (3 * hidden, hidden),
        f"{prefix}.conv.weight": (hidden, 1, conv.kernel),
        f"{prefix}.out_proj.weight": (hidden, hidden),
    }
    if conv.bias:
        shapes[f"{prefix}.in_proj.bias"] = (3 * hidden,)
        shapes[f"{prefix}.conv.bias"] = (hidden,)
        shapes[f"{prefix}.out_proj.bias"] = (hidden,)
    return shapes


def delta_net_shapes(prefix: str, hidden: int, delta: DeltaNetLayers) -> dict[str, tuple[int, ...]]:
    """A gated DeltaNet layer's tensors: the projections to q/k/v, to the output gate z, to beta
    and to the decay (a, with its bias dt_bias and rate A_log per value head), the depthwise
    kernel over q/k/v, the norm of a value head's output, and the output projection."""
    return {
        f"{prefix}.in_proj_qkv.weight": (delta.conv_size, hidden),
        f"{prefix}.in_proj_z.weight": (delta.value_size, hidden),
        f"{prefix}.in_proj_b.weight": (delta.v_heads, hidden),
        f"{prefix}.in_proj_a.weight": (delta.v_heads, hidden),
        f"{prefix}.conv1d.weight": (delta.conv_size, 1, delta.kernel),
        f"{prefix}.dt_bias": (delta.v_heads,),
        f"{prefix}.A_log": (delta.v_heads,),
        f"{prefix}.norm.weight": (delta.v_dim,),
        f"{prefix}.out_proj.weight": (hidden, delta.value_size),
    }


def mamba2_shapes(prefix: str, hidden: int, mamba: Mamba2Layers) -> dict[str, tuple[int, ...]]:
    """A Mamba2 layer's tensors: the projection to z, x, B, C and dt, the depthwise kernel over
    x, B and C (with its bias), dt's bias, the decay rate A_log and skip D per head, the norm of
    the gated output, and the output projection (each projection with a bias if configured)."""
    shapes: dict[str, tuple[int, ...]] = {
        f"{prefix}.in_proj.weight": (mamba.in_size, hidden),
        f"{prefix}.conv1d.weight": (mamba.conv_size, 1, mamba.kernel),
        f"{prefix}.dt_bias": (mamba.heads,),
        f"{prefix}.A_log": (mamba.heads,),
        f"{prefix}.D": (mamba.heads,),
        f"{prefix}.norm.weight": (mamba.inner_size,),
        f"{prefix}.out_proj.weight": (hidden, mamba.inner_size),
    }
    if mamba.conv_bias:
        shapes[f"{prefix}.conv1d.bias"] = (mamba.conv_size,)
    if mamba.proj_bias:
        shapes[f"{prefix}.in_proj.bias"] = (mamba.in_size,)
        shapes[f"{prefix}.out_proj.bias"] = (hidden,)
    return shapes


def gemma4_attention_shapes(config: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """A Gemma 4 layer's attention tensors: q, k and v of its own head shape (a full layer's
    V is its K with `k_eq_v`), per-head norms; a K/V-sharing layer has q and its norm only."""
    attn, hidden = f"model.layers.{i}.self_attn", config.hidden_size
    dim, kv = config.layer_head_dim(i), config.layer_kv_heads(i) * config.layer_head_dim(i)
    q = config.num_heads * dim
    shapes = {f"{attn}.q_proj.weight": (q, hidden), f"{attn}.q_norm.weight": (dim,)}
    if i not in config.shared_kv_layers:
        shapes[f"{attn}.k_proj.weight"] = (kv, hidden)
        if not (config.k_eq_v and config.is_full_layer(i)):
            shapes[f"{attn}.v_proj.weight"] = (kv, hidden)
        shapes[f"{attn}.k_norm.weight"] = (dim,)
    shapes[f"{attn}.o_proj.weight"] = (hidden, q)
    return shapes


def layer_norm_names(config: ModelConfig) -> tuple[str, ...]:
    """A layer's RMSNorms by Hugging Face name: Llama's two (before attention, before the MLP);
    with sandwich norms (Gemma 3) four, where `post_attention_layernorm` normalises attention's
    output and `pre_feedforward_layernorm` is the one before the MLP."""
    if config.sandwich_norm:
        sandwich = (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        )
        extra: tuple[str, ...] = (
            ("post_per_layer_input_norm",) if config.per_layer_inputs is not None else ()
        )
        if config.experts is not None and config.experts.beside_mlp:  # Gemma 4's experts block
            extra += EXPERT_BRANCH_NORMS
        return sandwich + extra
    return ("input_layernorm", "post_attention_layernorm")


def check_tensor_shapes(
    path: Path, config: ModelConfig, actual: Mapping[str, tuple[int, ...]], *, heads: bool = False
) -> None:
    """Raise `WeightsError` unless `actual` holds exactly the tensors `config` implies (with
    `heads`, a classification head's `score.weight` and `score.bias` too, read by the pooler)."""
    expected = expected_tensor_shapes(config)
    missing = [name for name in expected if name not in actual]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(path, f"tensor {missing[0]!r} is missing{more}")
    for name, shape in expected.items():
        if tuple(actual[name]) != shape:
            raise WeightsError(path, _shape_problem(name, shape, actual[name]))
    # A tied checkpoint may still store lm_head (a copy of the embedding); it is not read.
    allowed = {LM_HEAD} if config.tie_word_embeddings else set()
    if heads:
        allowed |= set(CLASSIFIER)
    if config.encoder is not None:  # a cross-encoder's head, or a base model's unused pooler
        allowed |= set(HEAD_NAMES)
    allowed |= set(GGUF_DENSE)  # read by the pooler
    for i in config.shared_kv_layers:  # Gemma 4's K/V-sharing layers may still store their own
        attn = f"model.layers.{i}.self_attn"
        allowed |= {f"{attn}.{part}.weight" for part in ("k_proj", "v_proj", "k_norm", "v_norm")}
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

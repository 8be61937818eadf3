"""An encoder's tensors: the names the loader knows them by (BERT's, without a model prefix),
their shapes, and the names each source stores them under.

- Hugging Face BERT and RoBERTa/XLM-R checkpoints store BERT's names, under `bert.` or
  `roberta.` in a `*ForSequenceClassification` (whose head is `classifier.*`, and BERT's
  `pooler.dense` before it); a base model, as sentence-transformers saves it, without a prefix.
- NomicBERT in transformers' names (`layers.N.self_attn.q_proj`, `mlp.gate_proj`,
  `post_attention_layernorm`, `post_mlp_layernorm`) or nomic's own (`encoder.layers.N.attn.Wqkv`,
  `mlp.fc11` up, `fc12` gate, `fc2` down, `norm1`, `norm2`, `emb_ln`).
- llama.cpp's GGUF names for `bert` and `nomic-bert` (`token_embd`, `token_types`,
  `position_embd`, `token_embd_norm`, `blk.N.attn_q`, `attn_qkv`, `attn_output`,
  `attn_output_norm`, `ffn_up`, `ffn_gate`, `ffn_down`, `layer_output_norm`; a reranker's
  `cls` and `cls.output`).

A masked-LM head (`cls.predictions.*`, RoBERTa's `lm_head.*`) is a part the loader skips.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from nanoserve.runtime.loading.encoder_layers import EncoderLayers
from nanoserve.runtime.loading.model_config import ModelConfig

EMBEDDINGS = "embeddings"
# A cross-encoder's head, read by the pooler: BERT's pooler (dense + tanh on the first token)
# and classifier, or RoBERTa's classifier.dense (+ tanh) and classifier.out_proj
HEAD_NAMES = (
    "pooler.dense.weight",
    "pooler.dense.bias",
    "classifier.weight",
    "classifier.bias",
    "classifier.dense.weight",
    "classifier.dense.bias",
    "classifier.out_proj.weight",
    "classifier.out_proj.bias",
)
SKIPPED_PREFIXES = (("cls.predictions.", "masked-LM head"), ("lm_head.", "masked-LM head"))
_MODEL_PREFIXES = ("bert.", "roberta.", "model.", "nomic_bert.")
_NOMIC_NAMES = (
    (r"^(encoder\.)?layers\.(\d+)\.", r"encoder.layer.\2."),
    (r"\.self_attn\.q_proj\.", ".attention.self.query."),
    (r"\.self_attn\.k_proj\.", ".attention.self.key."),
    (r"\.self_attn\.v_proj\.", ".attention.self.value."),
    (r"\.self_attn\.o_proj\.", ".attention.output.dense."),
    (r"\.attn\.Wqkv\.", ".attention.self.qkv."),
    (r"\.attn\.out_proj\.", ".attention.output.dense."),
    (r"\.(post_attention_layernorm|norm1)\.", ".attention.output.LayerNorm."),
    (r"\.mlp\.(up_proj|fc11)\.", ".intermediate.dense."),
    (r"\.mlp\.(gate_proj|fc12)\.", ".intermediate.gate."),
    (r"\.mlp\.(down_proj|fc2)\.", ".output.dense."),
    (r"\.(post_mlp_layernorm|norm2)\.", ".output.LayerNorm."),
    (r"^emb_ln\.", "embeddings.LayerNorm."),
)
_GGUF_GLOBAL = {
    "token_embd": "embeddings.word_embeddings",
    "token_types": "embeddings.token_type_embeddings",
    "position_embd": "embeddings.position_embeddings",
    "token_embd_norm": "embeddings.LayerNorm",
    "cls": "classifier.dense",
    "cls.output": "classifier.out_proj",
}
_GGUF_LAYER = {
    "attn_q": "attention.self.query",
    "attn_k": "attention.self.key",
    "attn_v": "attention.self.value",
    "attn_qkv": "attention.self.qkv",
    "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_gate": "intermediate.gate",
    "ffn_down": "output.dense",
    "layer_output_norm": "output.LayerNorm",
}
_GGUF_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def encoder_name(name: str) -> str:
    """A stored Hugging Face name as the loader knows it (module docstring)."""
    for prefix in _MODEL_PREFIXES:
        if name.startswith(prefix):
            name = name.removeprefix(prefix)
            break
    if name.startswith(("layers.", "encoder.layers.", "emb_ln.")):  # NomicBERT's
        for pattern, known in _NOMIC_NAMES:
            name = re.sub(pattern, known, name)
    return name


def encoder_skipped_part(name: str) -> str | None:
    for prefix, part in SKIPPED_PREFIXES:
        if name.removeprefix("roberta.").startswith(prefix):
            return part
    return None


def gguf_encoder_name(gguf_name: str) -> str | None:
    """The loader's name of a `bert`/`nomic-bert` GGUF tensor, or None."""
    if match := _GGUF_LAYER_TENSOR.fullmatch(gguf_name):
        layer, part, kind = match.groups()
        return f"encoder.layer.{layer}.{_GGUF_LAYER[part]}.{kind}" if part in _GGUF_LAYER else None
    stem, _, kind = gguf_name.rpartition(".")
    return f"{_GGUF_GLOBAL[stem]}.{kind}" if stem in _GGUF_GLOBAL else None


def with_fused_qkv(config: ModelConfig, names: Iterable[str]) -> ModelConfig:
    """`config` with q, k and v fused where the stored `names` (the loader's) have them so."""
    assert config.encoder is not None
    fused = any(".attention.self.qkv." in name for name in names)
    return replace(config, encoder=replace(config.encoder, fused_qkv=fused))


def encoder_tensor_shapes(
    encoder: EncoderLayers,
    *,
    vocab: int,
    hidden: int,
    inter: int,
    layers: int,
    positions: int,
) -> dict[str, tuple[int, ...]]:
    """Every tensor an encoder's forward reads, by the loader's name, in load order."""
    shapes: dict[str, tuple[int, ...]] = {f"{EMBEDDINGS}.word_embeddings.weight": (vocab, hidden)}
    if encoder.learned_positions:
        rows = positions + encoder.position_offset
        shapes[f"{EMBEDDINGS}.position_embeddings.weight"] = (rows, hidden)
    if encoder.type_vocab_size:
        shapes[f"{EMBEDDINGS}.token_type_embeddings.weight"] = (encoder.type_vocab_size, hidden)
    shapes.update(_layer_norm(EMBEDDINGS, hidden))
    for i in range(layers):
        prefix = f"encoder.layer.{i}"
        parts = ("qkv",) if encoder.fused_qkv else ("query", "key", "value")
        for part in parts:
            rows = 3 * hidden if part == "qkv" else hidden
            shapes.update(_linear(f"{prefix}.attention.self.{part}", rows, hidden, encoder))
        shapes.update(_linear(f"{prefix}.attention.output.dense", hidden, hidden, encoder))
        shapes.update(_layer_norm(f"{prefix}.attention.output", hidden))
        shapes.update(_linear(f"{prefix}.intermediate.dense", inter, hidden, encoder))
        if encoder.swiglu:
            shapes.update(_linear(f"{prefix}.intermediate.gate", inter, hidden, encoder))
        shapes.update(_linear(f"{prefix}.output.dense", hidden, inter, encoder))
        shapes.update(_layer_norm(f"{prefix}.output", hidden))
    return shapes


def _linear(name: str, rows: int, cols: int, encoder: EncoderLayers) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {f"{name}.weight": (rows, cols)}
    if encoder.biases:
        shapes[f"{name}.bias"] = (rows,)
    return shapes


def _layer_norm(prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.LayerNorm.weight": (hidden,), f"{prefix}.LayerNorm.bias": (hidden,)}

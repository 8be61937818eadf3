"""Shape-true embedder GGUFs with random weights: a bge-base-sized BERT and a
Qwen3-Embedding-0.6B-sized decoder, in llama.cpp's names, for the embedding benchmark.

    python -m benchmarks.embed_shapes [--dir DIR]

- `bge-base-shape`: BERT, hidden 768, 12 layers of 12 heads, MLP 3072, 512 positions, 2 token
  types, vocabulary 30,522 (WordPiece: BERT's five specials, then fillers), CLS pooling
  (`bert.pooling_type` 2), as bge-base-en-v1.5;
- `qwen3-embedding-0.6b-shape`: Qwen3, hidden 1024, 28 layers of 16 heads of 128 (8 K/V
  heads), MLP 3072, vocabulary 151,669, tied, last-token pooling (`qwen3.pooling_type` 3).

Every matrix is Q8_0, the type the published `*-q8_0.gguf` embedders use (the embedding table
too); the position and token-type tables, norms and biases are F32 (norms 1, biases 0). Blocks are
random bytes with finite small fp16 scales (shape_gguf.py): the speed of a forward does not
depend on the values. The scales are small enough (weights of ~0.02) that attention stays
smooth: two engines' roundings then give nearly the same vectors, which the benchmark checks.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.shape_gguf import Tensors, byte_vocabulary, write_random_tensors

BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def bge_base_tensors() -> Tensors:
    h, ffn, layers = 768, 3072, 12
    out: Tensors = {
        "token_embd.weight": ((30522, h), "Q8_0"),
        "position_embd.weight": ((512, h), "F32"),
        "token_types.weight": ((2, h), "F32"),
        "token_embd_norm.weight": ((h,), "F32"),
        "token_embd_norm.bias": ((h,), "F32"),
    }
    for i in range(layers):
        b = f"blk.{i}."
        for name, rows, cols in (
            ("attn_q", h, h), ("attn_k", h, h), ("attn_v", h, h), ("attn_output", h, h),
            ("ffn_up", ffn, h), ("ffn_down", h, ffn),
        ):  # fmt: skip
            out[f"{b}{name}.weight"] = ((rows, cols), "Q8_0")
            out[f"{b}{name}.bias"] = ((rows,), "F32")
        for norm in ("attn_output_norm", "layer_output_norm"):
            out[f"{b}{norm}.weight"] = ((h,), "F32")
            out[f"{b}{norm}.bias"] = ((h,), "F32")
    return out


def qwen3_embedding_tensors() -> Tensors:
    h, ffn, layers, heads, kv, dim = 1024, 3072, 28, 16, 8, 128
    out: Tensors = {"token_embd.weight": ((151669, h), "Q8_0"), "output_norm.weight": ((h,), "F32")}
    for i in range(layers):
        b = f"blk.{i}."
        out[f"{b}attn_norm.weight"] = ((h,), "F32")
        out[f"{b}ffn_norm.weight"] = ((h,), "F32")
        out[f"{b}attn_q.weight"] = ((heads * dim, h), "Q8_0")
        out[f"{b}attn_k.weight"] = ((kv * dim, h), "Q8_0")
        out[f"{b}attn_v.weight"] = ((kv * dim, h), "Q8_0")
        out[f"{b}attn_output.weight"] = ((h, heads * dim), "Q8_0")
        out[f"{b}attn_q_norm.weight"] = ((dim,), "F32")
        out[f"{b}attn_k_norm.weight"] = ((dim,), "F32")
        out[f"{b}ffn_gate.weight"] = ((ffn, h), "Q8_0")
        out[f"{b}ffn_up.weight"] = ((ffn, h), "Q8_0")
        out[f"{b}ffn_down.weight"] = ((h, ffn), "Q8_0")
    return out


def _values(name: str, size: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("norm.weight"):
        return np.ones(size, dtype=np.float32)
    if name.endswith(".bias"):
        return np.zeros(size, dtype=np.float32)
    return (rng.standard_normal(size) * 0.02).astype(np.float32)


def write_bge_base(out: Path, seed: int = 0) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(out), "bert")
    writer.add_name("bge-base-shape")
    writer.add_context_length(512)
    writer.add_embedding_length(768)
    writer.add_feed_forward_length(3072)
    writer.add_block_count(12)
    writer.add_head_count(12)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.CLS)
    writer.add_token_type_count(2)
    writer.add_tokenizer_model("bert")
    fillers = [f"\u2581w{i}" for i in range(30522 - len(BERT_SPECIALS))]
    writer.add_token_list([*BERT_SPECIALS, *fillers])
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    writer.add_token_types([control] * len(BERT_SPECIALS) + [normal] * len(fillers))
    writer.add_bos_token_id(2)  # [CLS], as llama.cpp's converter keeps it
    writer.add_sep_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(1)
    return _finish(writer, bge_base_tensors(), seed, out)


def write_qwen3_embedding(out: Path, seed: int = 0) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(out), "qwen3")
    writer.add_name("qwen3-embedding-0.6b-shape")
    writer.add_context_length(32768)
    writer.add_embedding_length(1024)
    writer.add_feed_forward_length(3072)
    writer.add_block_count(28)
    writer.add_head_count(16)
    writer.add_head_count_kv(8)
    writer.add_key_length(128)
    writer.add_value_length(128)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_pooling_type(gguf.PoolingType.LAST)
    tokens, merges, types = byte_vocabulary(151669)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    return _finish(writer, qwen3_embedding_tensors(), seed, out)


def _finish(writer: Any, tensors: Tensors, seed: int, out: Path) -> Path:
    write_random_tensors(writer, tensors, _values, seed, scale=0.0003)
    return out


WRITERS = {
    "bge-base-shape": write_bge_base,
    "qwen3-embedding-0.6b-shape": write_qwen3_embedding,
}


def embedder_gguf(name: str, folder: Path) -> Path:
    """The shape's file in `folder` (written once: an existing file is kept)."""
    out = folder / f"{name}-q8_0.gguf"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        WRITERS[name](partial)
        partial.rename(out)
    return out


def main() -> None:
    from benchmarks.models import default_dir

    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="*", help=f"default: {sorted(WRITERS)}")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    for name in args.names or sorted(WRITERS):
        if name not in WRITERS:
            raise SystemExit(f"embed_shapes: {name!r} is not one of {sorted(WRITERS)}")
        print(embedder_gguf(name, args.dir or default_dir()))


if __name__ == "__main__":
    main()

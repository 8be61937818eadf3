"""Shape-true GGUFs with random weights, for models no GGUF of which can be fetched here.

    python -m benchmarks.shape_gguf lfm2-1.2b-shape [--dir DIR]

A decode step's cost depends on the shapes and block types of the tensors it reads, not on
their values. Each file here has a real model's geometry (from its config.json), llama.cpp's
architecture, metadata and tensor names (the `gguf` package's tables), and the block types of a
`Q4_K_M` mix: Q4_K for most matrices, Q6_K for the embedding and for attn_v/ffn_down in the
layers llama.cpp gives more bits (the first and last eighth, and every third between). A
quantized tensor is random bytes whose fp16 scales are finite and small (a valid block: both
servers dequantize it to small numbers); norms are 1, DeltaNet's decay rate -1 and its dt bias
0, so activations stay finite through every layer. The vocabulary is GPT-2's 256 byte tokens,
a few merges, then fillers up to the model's size: the benchmarks send token ids, and count
tokens from `usage`.

The shapes and what each stands for are in benchmarks/shapes.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.shapes import MIX, SHAPES, Shape

# The fp16 fields of each block type (byte offsets in a block): scales that must be finite.
FP16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}
# The E8M0 scale bytes of each block type (2^(e - 127), ggml halving it for MXFP4's doubled
# codes): set near the scale asked for, as a real file's are, not random powers up to 2^127.
E8M0_FIELDS: dict[str, tuple[int, ...]] = {"MXFP4": (0,)}


def random_blocks(kind: str, rows: int, cols: int, seed: int, scale: float = 0.01) -> np.ndarray:
    """A [rows, cols] tensor as valid GGUF bytes of type `kind` ([rows, bytes per row] uint8):
    random bytes, every fp16 scale finite (N(0, scale^2)), every E8M0 one a power near scale / 8. The `gguf` package dequantizes every
    such block but quantizes only a few types."""
    import gguf

    rng = np.random.default_rng(seed)
    if kind in ("F32", "F16", "BF16"):
        values = (rng.standard_normal((rows, cols)) * scale * 4).astype(np.float32)
        if kind == "F16":
            return values.astype(np.float16).view(np.uint8)
        if kind == "BF16":
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return values.view(np.uint8)
    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    blocks = rng.integers(0, 256, (rows, cols // block, nbytes), dtype=np.uint8)
    for at in FP16_FIELDS.get(kind, ()):
        halves = (rng.standard_normal(blocks.shape[:2]) * scale).astype(np.float16)
        blocks[..., at : at + 2] = halves[..., None].view(np.uint8)
    for at in E8M0_FIELDS.get(kind, ()):  # values of the order of scale (codes reach 12)
        e = 127 + round(np.log2(scale / 4)) + rng.integers(-2, 3, blocks.shape[:2])
        blocks[..., at] = e.astype(np.uint8)
    return blocks.reshape(rows, -1)


Tensors = dict[str, tuple[tuple[int, ...], str]]  # GGUF name -> (HF-order shape, type)


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M: attn_v and ffn_down get Q6_K in the first and last eighth of the
    layers and every third layer between (its `use_more_bits`)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def gpt_oss_tensors(s: Shape) -> Tensors:
    """gpt-oss as ggml-org's MXFP4 GGUF stores it: the experts MXFP4 (with F32 biases), the
    attention, embedding and output Q8_0, norms, biases, sinks and the router F32."""
    h, q, kv, e = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.metadata
    experts = int(e["expert_count"])  # type: ignore[call-overload]
    out: Tensors = {
        "token_embd.weight": ((s.vocab, h), "Q8_0"),
        "output_norm.weight": ((h,), "F32"),
        "output.weight": ((s.vocab, h), "Q8_0"),
    }
    for i in range(s.layers):
        b = f"blk.{i}."
        out[f"{b}attn_norm.weight"] = ((h,), "F32")
        out[f"{b}post_attention_norm.weight"] = ((h,), "F32")
        for name, rows, cols in (("attn_q", q, h), ("attn_k", kv, h), ("attn_v", kv, h),
                                 ("attn_output", h, q)):  # fmt: skip
            out[f"{b}{name}.weight"] = ((rows, cols), "Q8_0")
            out[f"{b}{name}.bias"] = ((rows,), "F32")
        out[f"{b}attn_sinks.weight"] = ((s.heads,), "F32")
        out[f"{b}ffn_gate_inp.weight"] = ((experts, h), "F32")
        out[f"{b}ffn_gate_inp.bias"] = ((experts,), "F32")
        for name, rows, cols in (("gate", s.ffn, h), ("up", s.ffn, h), ("down", h, s.ffn)):
            out[f"{b}ffn_{name}_exps.weight"] = ((experts, rows, cols), "MXFP4")
            out[f"{b}ffn_{name}_exps.bias"] = ((experts, rows), "F32")
    return out


def tensors_of(shape: Shape) -> Tensors:
    """Every tensor of the file: its GGUF name, its shape [rows, cols] (or [n]) and type."""
    if shape.arch == "gpt-oss":
        return gpt_oss_tensors(shape)
    h, s = shape.hidden, shape
    out: Tensors = {"token_embd.weight": ((s.vocab, h), "Q6_K")}
    out["token_embd_norm.weight" if s.arch == "lfm2" else "output_norm.weight"] = ((h,), "F32")
    if s.arch == "olmoe":  # untied
        out["output.weight"] = ((s.vocab, h), "Q6_K")
    experts = int(s.metadata.get("expert_count", 0))  # type: ignore[call-overload]
    q_rows = s.heads * s.head_dim * (2 if s.arch == "qwen35" else 1)
    out.update(rotary_tensors(s))
    for i in range(s.layers):
        b, wide = f"blk.{i}.", "Q6_K" if more_bits(i, s.layers) else "Q4_K"
        out[f"{b}attn_norm.weight"] = ((h,), "F32")
        out[f"{b}{'post_attention_norm' if s.arch == 'qwen35' else 'ffn_norm'}.weight"] = (
            (h,),
            "F32",
        )
        if experts:  # the router (kept F32 by llama.cpp's quantizer) and the stacked experts
            out[f"{b}ffn_gate_inp.weight"] = ((experts, h), "F32")
            out[f"{b}ffn_gate_exps.weight"] = ((experts, s.ffn, h), "Q4_K")
            out[f"{b}ffn_up_exps.weight"] = ((experts, s.ffn, h), "Q4_K")
            out[f"{b}ffn_down_exps.weight"] = ((experts, h, s.ffn), wide)
        elif s.arch == "phi3":  # gate and up fused
            out[f"{b}ffn_up.weight"] = ((2 * s.ffn, h), "Q4_K")
            out[f"{b}ffn_down.weight"] = ((h, s.ffn), wide)
        else:
            out[f"{b}ffn_gate.weight"] = ((s.ffn, h), "Q4_K")
            out[f"{b}ffn_up.weight"] = ((s.ffn, h), "Q4_K")
            out[f"{b}ffn_down.weight"] = ((h, s.ffn), wide)
        if i in s.attention and s.arch in DENSE_ATTENTION:
            out.update(dense_attention(s, b, wide))
        elif i in s.attention:
            kv = s.kv_heads * s.head_dim
            out[f"{b}attn_q.weight"] = ((q_rows, h), "Q4_K")
            out[f"{b}attn_k.weight"] = ((kv, h), "Q4_K")
            out[f"{b}attn_v.weight"] = ((kv, h), wide)
            out[f"{b}attn_output.weight"] = ((h, s.heads * s.head_dim), "Q4_K")
            whole = s.arch == "olmoe"  # OLMoE norms the whole q and k projections
            out[f"{b}attn_q_norm.weight"] = ((q_rows if whole else s.head_dim,), "F32")
            out[f"{b}attn_k_norm.weight"] = ((kv if whole else s.head_dim,), "F32")
        elif s.arch == "lfm2":
            taps = int(s.metadata["shortconv.l_cache"])  # type: ignore[call-overload]
            out[f"{b}shortconv.in_proj.weight"] = ((3 * h, h), "Q4_K")
            out[f"{b}shortconv.conv.weight"] = ((h, taps), "F32")
            out[f"{b}shortconv.out_proj.weight"] = ((h, h), "Q4_K")
        else:
            m = s.metadata
            v_heads, inner = int(m["ssm.time_step_rank"]), int(m["ssm.inner_size"])  # type: ignore[call-overload]
            keys = int(m["ssm.group_count"]) * int(m["ssm.state_size"])  # type: ignore[call-overload]
            conv = 2 * keys + inner
            out[f"{b}attn_qkv.weight"] = ((conv, h), "Q4_K")
            out[f"{b}attn_gate.weight"] = ((inner, h), "Q4_K")
            out[f"{b}ssm_beta.weight"] = ((v_heads, h), "Q4_K")
            out[f"{b}ssm_alpha.weight"] = ((v_heads, h), "Q4_K")
            out[f"{b}ssm_a"] = ((v_heads,), "F32")
            out[f"{b}ssm_dt.bias"] = ((v_heads,), "F32")
            out[f"{b}ssm_conv1d.weight"] = ((conv, int(m["ssm.conv_kernel"])), "F32")  # type: ignore[call-overload]
            out[f"{b}ssm_norm.weight"] = ((inner // v_heads,), "F32")
            out[f"{b}ssm_out.weight"] = ((h, inner), "Q4_K")
    return out


DENSE_ATTENTION = ("llama", "qwen2", "phi3")  # no q/k norms; qwen2's biases, phi3's fused qkv


def dense_attention(s: Shape, b: str, wide: str) -> Tensors:
    """One attention layer of a dense llama-like file in llama.cpp's Q4_K_M mix."""
    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    out: Tensors = {}
    if s.arch == "phi3":  # llama.cpp's Q4_K_M gives a fused qkv Q5_K
        out[f"{b}attn_qkv.weight"] = ((q + 2 * kv, h), "Q5_K")
    else:
        out[f"{b}attn_q.weight"] = ((q, h), "Q4_K")
        out[f"{b}attn_k.weight"] = ((kv, h), "Q4_K")
        out[f"{b}attn_v.weight"] = ((kv, h), wide)
    if s.arch == "qwen2":
        for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            out[f"{b}{name}.bias"] = ((rows,), "F32")
    out[f"{b}attn_output.weight"] = ((h, q), "Q4_K")
    return out


def rotary_tensors(s: Shape) -> Tensors:
    """The rotary factors llama.cpp's converter stores as tensors: Llama 3's `rope_freqs`,
    Phi-3's longrope `rope_factors_long`/`_short` (one per turning pair)."""
    pairs = int(s.metadata.get("rope.dimension_count", s.head_dim)) // 2  # type: ignore[call-overload]
    if s.arch == "llama":
        return {"rope_freqs.weight": ((pairs,), "F32")}
    if s.arch == "phi3":
        return {f"rope_factors_{kind}.weight": ((pairs,), "F32") for kind in ("long", "short")}
    return {}


def float_values(name: str, size: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """An F32 tensor's values: norms and rotary factors 1, DeltaNet's decay rate -1 and dt bias
    0, taps small."""
    if name.endswith("norm.weight") or name.startswith("rope_"):
        return np.ones(size, dtype=np.float32)
    if name.endswith("ssm_a"):
        return -np.ones(size, dtype=np.float32)
    if name.endswith("ssm_dt.bias") or name.endswith("s.bias"):  # dt; gpt-oss's experts'
        return np.zeros(size, dtype=np.float32)
    return (rng.standard_normal(size) * 0.1).astype(np.float32)


def byte_vocabulary(size: int) -> tuple[list[str], list[str], list[int]]:
    """GPT-2's 256 byte tokens, a few merges (and their tokens), an end-of-text token, then
    fillers up to `size`: tokens, merges, token types."""
    from nanoserve.runtime.text.tokenizer import _bytes_to_unicode

    alphabet = list(_bytes_to_unicode().values())
    space = alphabet[ord(" ")]
    merges = [f"{space} {c}" for c in "taoiswcbpfmhdlnre"]
    tokens = alphabet + [m.replace(" ", "") for m in merges] + ["<|endoftext|>"]
    types = [1] * (len(tokens) - 1) + [3]
    fillers = size - len(tokens)
    return tokens + [f"<fill{i}>" for i in range(fillers)], merges, types + [1] * fillers


def write(shape: Shape, out: Path, seed: int = 0) -> Path:
    """The shape's GGUF at `out` (written once: an existing file is kept)."""
    import gguf

    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), shape.arch)
    writer.add_name(shape.name)
    writer.add_block_count(shape.layers)
    writer.add_context_length(32768)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    if shape.arch == "lfm2":  # no K/V heads on a convolution layer
        kv = [shape.kv_heads if i in shape.attention else 0 for i in range(shape.layers)]
        writer.add_head_count_kv(kv)
    else:
        writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.eps)
    writer.add_vocab_size(shape.vocab)
    for key, value in shape.metadata.items():
        name = f"{shape.arch}.{key}"
        if isinstance(value, list):
            writer.add_array(name, value)
        elif isinstance(value, int):
            writer.add_uint32(name, value)
        elif isinstance(value, float):
            writer.add_float32(name, value)
        elif isinstance(value, str):
            writer.add_string(name, value)
        else:
            raise TypeError(f"{name}={value!r}")
    tokens, merges, types = byte_vocabulary(shape.vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    write_random_tensors(writer, tensors_of(shape), float_values, seed, scale=0.002)
    partial.rename(out)
    return out


def write_random_tensors(
    writer: Any,
    tensors: Tensors,
    floats: Callable[[str, tuple[int, ...], np.random.Generator], np.ndarray],
    seed: int,
    scale: float,
) -> None:
    """Every tensor into `writer` (a gguf.GGUFWriter, header and metadata set), then the file
    written and closed: F32 ones from `floats`, quantized ones as random valid blocks whose
    fp16 scales are N(0, scale²)."""
    import gguf

    rng = np.random.default_rng(seed)
    for i, (name, (size, kind)) in enumerate(tensors.items()):
        if kind == "F32":
            writer.add_tensor(name, floats(name, size, rng))
        else:  # [rows, cols], or stacked experts [experts, rows, cols]
            *stack, rows, cols = size
            count = int(np.prod(stack)) if stack else 1
            blocks = np.concatenate(  # a stack at a time: a 20B's biggest is 0.2 GB of bytes
                [
                    random_blocks(kind, rows, cols, seed=seed + i + 7919 * j, scale=scale)
                    for j in range(count)
                ]
            ).reshape(*stack, rows, -1)
            writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def maker(name: str, folder: Path) -> Callable[[], Path]:
    return lambda: write(SHAPES[name], folder / f"{name}-{MIX.get(name, 'q4_k_m')}.gguf")


def main() -> None:
    from benchmarks.models import default_dir

    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="+", choices=sorted(SHAPES))
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    for name in args.names:
        print(maker(name, args.dir or default_dir())())


if __name__ == "__main__":
    main()

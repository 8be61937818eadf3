"""Every call into nanoserve's C++ kernels (`torch.ops.nanoserve`), typed, in one place.

The library is built and loaded by `cpu_kernels.py` (which also picks the ISA); the model, the
weight forms, the GGUF reader and the sampler call the ops through these functions only, so
what crosses into C++, with which argument order and shapes, reads here. Each op checks its
arguments itself (`op_checks.h`) and raises a RuntimeError naming the bad one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_ops = torch.ops.nanoserve  # resolved per call: the library may load after this import


def pack_weight(
    rows: torch.Tensor, ggml_type: int, width: int, order: torch.Tensor | None = None
) -> torch.Tensor:
    """GGUF blocks [out, bytes] of one type -> the kernel's planes (no float round trip);
    order: the output rows' permutation (llama.cpp's Q/K layout undone), None: as stored."""
    return _ops.pack_weight(rows, ggml_type, width, order)


def linear(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    types: list[int],
    out_features: list[int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [rows, in] float32 @ the packed parts' transpose, parts stacked (+ bias float32) ->
    [rows, sum(out_features)] float32. Each part keeps its own GGML type."""
    return _ops.linear(x, weights, types, out_features, bias)


def dequantize_rows(
    rows: torch.Tensor, ggml_type: int, width: int, ids: torch.Tensor | None = None
) -> torch.Tensor:
    """The float32 values of GGUF block rows ([len(ids) or rows, width]); ids pick rows (an
    embedding lookup reads only those)."""
    return _ops.dequantize_rows(rows, ggml_type, width, ids)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _ops.rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x += delta in place (the residual stream); returns the RMS-normalised x."""
    return _ops.add_rms_norm(x, delta, weight, eps)


def rope_write_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: torch.Tensor,
    slots: torch.Tensor,
    heads: int,
    kv_types: Sequence[int] = (),
) -> None:
    """Rotary on q and k of qkv in place (the first cos.shape[1] dimensions of each head: all,
    or a partial rotary's), and k and v written to the pool at slots. kv_types: () for a float
    pool, else K's and V's block forms (core/kv_cache_dtype.py), rounded as ggml rounds them."""
    _ops.rope_write_kv(qkv, positions, cos, sin, kv, slots, heads, list(kv_types))


def paged_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    rect: torch.Tensor,
    rect_rows: torch.Tensor | None,
    context_lens: torch.Tensor,
    scale: float,
    heads: int,
    window: int = 0,
    kv_types: Sequence[int] = (),
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each token's attention over its first context_lens slots of its rectangle row
    (rect_rows picks the row of a prompt token; None: token i reads row i). window > 0: only
    the last `window` of them, itself included (a sliding-window layer). kv_types: as
    rope_write_kv's. sinks: float32 [heads], a logit per head in the softmax's denominator."""
    return _ops.paged_attention(
        q, kv, rect, rect_rows, context_lens, scale, heads, window, list(kv_types), sinks
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[rows, 2h] -> [rows, h]: silu(gate) * up."""
    return _ops.silu_mul(gate_up)


def gelu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[rows, 2h] -> [rows, h]: gelu_tanh(gate) * up (GeGLU)."""
    return _ops.gelu_mul(gate_up)


def head_rms_norm(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    heads: int,
    kv_heads: int,
    eps: float,
) -> None:
    """In place: each q head and each k head of qkv [tokens, (heads + 2 kv_heads) * head_dim]
    RMS-normalised with its weight [head_dim] (per-head q/k norms); v untouched."""
    _ops.head_rms_norm(qkv, q_weight, k_weight, heads, kv_heads, eps)


def delta_net_step(
    state: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
) -> torch.Tensor:
    """One token of gated DeltaNet per row: each row's state [heads, k_dim, v_dim] updated in
    place in `state` [slots + 1, ...] at its slot (read as zero at position 0; the sink, the
    last slot, never written); returns o [rows, heads, v_dim]. q, k [rows, heads, k_dim], v
    [rows, heads, v_dim], decay = exp(g) and beta [rows, heads], all float32."""
    return _ops.delta_net_step(state, slots, positions, q, k, v, decay, beta)


def conv_step(
    state: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    x: torch.Tensor,
    kernel: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """One token of a causal depthwise convolution per row: y [rows, channels] from each row's
    window in `state` [slots + 1, channels, taps - 1] (empty at position 0) and x [rows,
    channels]; the window updated in place (the sink, the last slot, never written)."""
    return _ops.conv_step(state, slots, positions, x, kernel, bias)


def ssm_step(
    state: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    u: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    decay: torch.Tensor,
) -> torch.Tensor:
    """One token of Mamba2's state space per row: S' = decay S + u b^T in place in `state`
    [slots + 1, heads, head_dim, d_state] (read as zero at position 0; the sink never written),
    returns y = S' c [rows, heads, head_dim]. u = dt x [rows, heads, head_dim], b and c [rows,
    heads, d_state], decay = exp(dt A) [rows, heads]."""
    return _ops.ssm_step(state, slots, positions, u, b, c, decay)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Per row of a contiguous float32 [rows, k], the first maximum's index (torch's NaN rule)."""
    return _ops.argmax(x)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """-inf, in place, where a row's bitmask word has a 0 bit (all-ones words skipped)."""
    _ops.apply_token_bitmask(logits, bitmask, rows)


def read_bytes(buffer: torch.Tensor) -> int:
    """One pass over buffer (contiguous uint8) on the kernels' threads: the 64-bit sum of its
    whole 64-byte lines. The memory roofline times it (benchmarks/roofline.py)."""
    return int(_ops.read_bytes(buffer))

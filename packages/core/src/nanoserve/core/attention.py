"""Paged attention: K/V are read from the pool only through slot ids, masked by context length.

Both functions reduce in `accum_dtype` (float32 by default) and return that dtype. With
float64, a row's result no longer depends on how wide its rectangle was padded or which kernel
shape computed it (summation-order differences vanish when rounded back to float32): that is
the engine's batch-invariant mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nanoserve.core.errors import GeometryError


def _check_heads(num_heads: int, num_kv_heads: int) -> int:
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise GeometryError(f"{num_heads} query heads do not group over {num_kv_heads} K/V heads")
    return num_heads // num_kv_heads


def paged_decode_attention(
    q: torch.Tensor,  # [rows, heads, head_dim]
    k_pool: torch.Tensor,  # [slots + 1, kv_heads, head_dim]
    v_pool: torch.Tensor,  # [slots + 1, kv_heads, head_dim]
    slot_rect: torch.Tensor,  # [rows, width]
    context_lens: torch.Tensor,  # [rows]
    scale: float,
    accum_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # [rows, heads, head_dim]
    """One query per row over that row's first context_lens[row] slots; a row of 0 gives zeros."""
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = _check_heads(num_heads, num_kv_heads)
    width = slot_rect.shape[1]
    if slot_rect.shape[0] != rows or context_lens.shape[0] != rows:
        raise GeometryError(
            f"q has {rows} rows, slot_rect {slot_rect.shape[0]}, context_lens {context_lens.shape[0]}"
        )
    visible = torch.arange(width, device=q.device) < context_lens[:, None]  # [rows, width]
    k = k_pool[slot_rect].to(accum_dtype)  # [rows, width, kv_heads, head_dim]
    # Masked positions may name the sink, which holds anything: zero V so 0 * garbage stays 0.
    v = v_pool[slot_rect].to(accum_dtype).masked_fill(~visible[:, :, None, None], 0.0)
    qg = q.to(accum_dtype).view(rows, num_kv_heads, group, head_dim)
    scores = torch.einsum("rhgd,rwhd->rhgw", qg, k) * scale  # [rows, kv_heads, group, width]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    # A fully masked row (padding) has max -inf; clamp it so exp gives 0 instead of NaN.
    peak = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(accum_dtype).min)
    weights = torch.exp(scores - peak)
    denom = weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(accum_dtype).tiny)
    out = torch.einsum("rhgw,rwhd->rhgd", weights / denom, v)
    return out.reshape(rows, num_heads, head_dim)


def paged_prefill_attention(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    k_pool: torch.Tensor,  # [slots + 1, kv_heads, head_dim]
    v_pool: torch.Tensor,  # [slots + 1, kv_heads, head_dim]
    query_starts: Sequence[int],  # chunks + 1
    context_lens: Sequence[int],  # chunks: cached prefix + this chunk
    slot_rect: torch.Tensor,  # [chunks, width]
    scale: float,
    accum_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # [tokens, heads, head_dim]
    """Causal attention of each chunk's queries over its sequence's prefix and itself."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = _check_heads(num_heads, num_kv_heads)
    if len(query_starts) != len(context_lens) + 1 or query_starts[-1] != num_tokens:
        raise GeometryError(
            f"query_starts {tuple(query_starts)} do not cut {num_tokens} tokens"
            f" into {len(context_lens)} chunks"
        )
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=accum_dtype, device=q.device)
    for chunk, context_len in enumerate(context_lens):
        start, end = query_starts[chunk], query_starts[chunk + 1]
        num_new = end - start
        if not 0 < num_new <= context_len <= slot_rect.shape[1]:
            raise GeometryError(
                f"chunk {chunk}: {num_new} new tokens, context {context_len},"
                f" rectangle width {slot_rect.shape[1]}"
            )
        slots = slot_rect[chunk, :context_len]  # [context]
        k = k_pool[slots].to(accum_dtype)  # [context, kv_heads, head_dim]
        v = v_pool[slots].to(accum_dtype)
        qg = q[start:end].to(accum_dtype).view(num_new, num_kv_heads, group, head_dim)
        scores = torch.einsum("nhgd,chd->hgnc", qg, k) * scale  # [kv_heads, group, new, context]
        query_pos = torch.arange(context_len - num_new, context_len, device=q.device)
        visible = torch.arange(context_len, device=q.device)[None, :] <= query_pos[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        chunk_out = torch.einsum("hgnc,chd->nhgd", weights, v)
        out[start:end] = chunk_out.reshape(num_new, num_heads, head_dim)
    return out

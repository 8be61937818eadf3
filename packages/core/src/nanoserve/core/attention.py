"""Paged attention: K/V are read from the pool only through slot ids, masked by context length.

Both functions run their matmuls in `accum_dtype` (float32 by default; softmax statistics
never below float32) and return that dtype. A row's result then does not depend on how wide
its rectangle was padded or which kernel shape computed it in two cases measured here: float64
(summation-order differences vanish when rounded back to float32), which is the engine's
batch-invariant mode for float32 models, and bfloat16 (oneDNN's kernels are invariant), which
bfloat16 models get for free. Float32 matmuls are not.
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
    window: int | None = None,
    sinks: torch.Tensor | None = None,  # [heads]
) -> torch.Tensor:  # [rows, heads, head_dim]
    """One query per row over that row's first context_lens[row] slots (the last `window` of
    them, with a sliding window); a row of 0 gives zeros. `sinks`: a logit per head in the
    softmax's denominator (`_softmax`)."""
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = _check_heads(num_heads, num_kv_heads)
    width = slot_rect.shape[1]
    if slot_rect.shape[0] != rows or context_lens.shape[0] != rows:
        raise GeometryError(
            f"q has {rows} rows, slot_rect {slot_rect.shape[0]}, context_lens {context_lens.shape[0]}"
        )
    columns = torch.arange(width, device=q.device)
    visible = columns < context_lens[:, None]  # [rows, width]
    if window is not None:
        visible &= columns >= context_lens[:, None] - window
    # Masked positions may name the sink, which holds anything. Read a written slot there
    # instead (position 0's: its weight is exactly 0 and its value finite, so it adds exactly
    # 0); a row with nothing visible is zeroed at the end.
    safe_rect = torch.where(visible, slot_rect, slot_rect[:, :1]).reshape(-1)
    # Batch (row, kv_head): K/V of a row's head are [width, head_dim] contiguous after _gather.
    k = _gather(k_pool, safe_rect, rows, accum_dtype).view(rows * num_kv_heads, width, head_dim)
    v = _gather(v_pool, safe_rect, rows, accum_dtype).view(rows * num_kv_heads, width, head_dim)
    qg = q.to(accum_dtype).reshape(rows * num_kv_heads, group, head_dim)
    scores = torch.bmm(qg, k.transpose(1, 2)).view(rows, num_kv_heads, group, width)
    scores = scores.to(_stats_dtype(accum_dtype)).mul_(scale)
    scores.masked_fill_(~visible[:, None, None, :], float("-inf"))
    # A fully masked row (padding) softmaxes to NaN; it is zeroed below.
    weights = _softmax(scores, sinks, (num_kv_heads, group, 1)).to(accum_dtype)
    out = torch.bmm(weights.view(rows * num_kv_heads, group, width), v)
    out = out.view(rows, num_heads, head_dim)
    # A Python scalar, not a host tensor: on CUDA a 0-dim host operand is a synchronising copy,
    # which a graph capture refuses.
    return out.masked_fill_((context_lens == 0)[:, None, None], 0.0)


def _softmax(
    scores: torch.Tensor, sinks: torch.Tensor | None, sink_shape: tuple[int, ...]
) -> torch.Tensor:
    """Softmax over the last dim of scores; with sinks [heads] (seen as `sink_shape`, which
    broadcasts against scores), each head's sink logit joins the denominator as a column of its
    own that is then dropped (transformers' gpt-oss: the same ops)."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    column = sinks.to(scores.dtype).view(sink_shape)
    combined = torch.cat((scores, column.expand(*scores.shape[:-1], 1)), dim=-1)
    return torch.softmax(combined, dim=-1)[..., :-1]


def _stats_dtype(accum_dtype: torch.dtype) -> torch.dtype:
    """Softmax statistics never below float32: bf16 math keeps its matmuls, not its sums."""
    return accum_dtype if torch.finfo(accum_dtype).bits >= 32 else torch.float32


def _gather(pool: torch.Tensor, slots: torch.Tensor, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """pool[slots] for `rows` rows of slots, as a new contiguous [rows, kv_heads, width,
    head_dim] in dtype. One index_select over the pool seen as [(slots + 1) * kv_heads,
    head_dim], indexed by slot * kv_heads + head, lands directly in the layout bmm reads
    (measured ~4x faster here than gathering slots and transposing after)."""
    num_slots, kv_heads, head_dim = pool.shape
    width = slots.shape[0] // rows
    heads = torch.arange(kv_heads, device=slots.device)
    index = (slots.view(rows, 1, width) * kv_heads + heads.view(1, kv_heads, 1)).reshape(-1)
    flat = pool.view(num_slots * kv_heads, head_dim)  # the pool is contiguous: no copy, ever
    return flat.index_select(0, index).view(rows, kv_heads, width, head_dim).to(dtype)


def paged_prefill_attention(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    k_pool: torch.Tensor,  # [slots + 1, kv_heads, head_dim]
    v_pool: torch.Tensor,  # [slots + 1, kv_heads, head_dim]
    query_starts: Sequence[int],  # chunks + 1
    context_lens: Sequence[int],  # chunks: cached prefix + this chunk
    slot_rect: torch.Tensor,  # [chunks, width]
    scale: float,
    accum_dtype: torch.dtype = torch.float32,
    window: int | None = None,
    sinks: torch.Tensor | None = None,  # [heads]
) -> torch.Tensor:  # [tokens, heads, head_dim]
    """Causal attention of each chunk's queries over its sequence's prefix and itself (the
    last `window` positions of it, with a sliding window; `sinks` as in the decode's)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = _check_heads(num_heads, num_kv_heads)
    if len(query_starts) != len(context_lens) + 1 or query_starts[-1] != num_tokens:
        raise GeometryError(
            f"query_starts {tuple(query_starts)} do not cut {num_tokens} tokens"
            f" into {len(context_lens)} chunks"
        )
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=accum_dtype, device=q.device)
    singles: list[int] = []  # chunks of one token: decode rows, done together below
    for chunk, context_len in enumerate(context_lens):
        start, end = query_starts[chunk], query_starts[chunk + 1]
        num_new = end - start
        if not 0 < num_new <= context_len <= slot_rect.shape[1]:
            raise GeometryError(
                f"chunk {chunk}: {num_new} new tokens, context {context_len},"
                f" rectangle width {slot_rect.shape[1]}"
            )
        if num_new == 1:
            singles.append(chunk)
            continue
        slots = slot_rect[chunk, :context_len]  # [context]
        k = _gather(k_pool, slots, 1, accum_dtype)[0]  # [kv_heads, context, head_dim]
        v = _gather(v_pool, slots, 1, accum_dtype)[0]
        # [new, kv_heads, group, dim] -> [kv_heads, group * new, dim]: one bmm per chunk.
        qg = q[start:end].to(accum_dtype).view(num_new, num_kv_heads, group, head_dim)
        qg = qg.permute(1, 2, 0, 3).reshape(num_kv_heads, group * num_new, head_dim)
        scores = torch.bmm(qg, k.transpose(1, 2))  # [kv_heads, group * new, context]
        scores = scores.to(_stats_dtype(accum_dtype)).mul_(scale)
        scores = scores.view(num_kv_heads, group, num_new, context_len)
        query_pos = torch.arange(context_len - num_new, context_len, device=q.device)
        keys = torch.arange(context_len, device=q.device)[None, :]
        visible = keys <= query_pos[:, None]
        if window is not None:
            visible &= keys > query_pos[:, None] - window
        scores.masked_fill_(~visible, float("-inf"))
        weights = _softmax(scores, sinks, (num_kv_heads, group, 1, 1)).to(accum_dtype)
        weights = weights.view(num_kv_heads, group * num_new, context_len)
        chunk_out = torch.bmm(weights, v).view(num_kv_heads, group, num_new, head_dim)
        chunk_out = chunk_out.permute(2, 0, 1, 3)  # [new, kv_heads, group, dim]
        out[start:end] = chunk_out.reshape(num_new, num_heads, head_dim)
    if singles:
        # A one-token chunk is a decode row: one batched call instead of one loop turn each.
        index = torch.tensor(singles, device=q.device)
        tokens = torch.tensor([query_starts[c] for c in singles], device=q.device)
        lens = torch.tensor([context_lens[c] for c in singles], device=q.device)
        out[tokens] = paged_decode_attention(
            q[tokens], k_pool, v_pool, slot_rect[index], lens, scale, accum_dtype, window, sinks
        )
    return out

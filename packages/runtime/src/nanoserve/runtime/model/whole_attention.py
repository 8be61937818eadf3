"""Attention over whole inputs, both ways: what a model that keeps no K/V runs (a BERT-family
encoder, EmbeddingGemma's bidirectional Gemma 3).

A step's rows are its inputs laid end to end (`starts`: where each begins, and the end); each
input attends over itself only, every query to every key, or within a window on both sides
(`|i - j| < window`: transformers' bidirectional sliding mask, and llama.cpp's symmetric one
of `2 * (window - 1)` tokens). One input's answer does not depend on what else is in the step.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F


def whole_attention(
    q: torch.Tensor,  # [tokens, heads, head_dim]
    k: torch.Tensor,  # [tokens, kv_heads, head_dim]
    v: torch.Tensor,  # [tokens, kv_heads, head_dim]
    starts: tuple[int, ...],
    *,
    scale: float | None = None,  # None: head_dim ** -0.5
    window: int | None = None,
) -> torch.Tensor:
    """Each input's bidirectional attention, in float32: [tokens, heads * head_dim], q's
    dtype. Grouped K/V heads serve `heads // kv_heads` query heads each."""
    heads, head_dim = q.shape[1:]
    group = heads // k.shape[1]
    parts = []
    for a, b in itertools.pairwise(starts):
        qh = q[a:b].float().transpose(0, 1)  # [heads, n, head_dim]
        kh, vh = (_share(t[a:b].float(), group).transpose(0, 1) for t in (k, v))
        mask = None if window is None or window >= b - a else window_mask(b - a, window, q.device)
        # 4-d (a batch of one): torch's CPU flash kernel takes only those (3-d ones run the
        # unfused math path, about twice as slow); one input a call, so it is batch-invariant.
        out = F.scaled_dot_product_attention(
            qh[None], kh[None], vh[None], attn_mask=mask, scale=scale
        )
        parts.append(out[0].transpose(0, 1).reshape(b - a, heads * head_dim))
    return torch.cat(parts).to(q.dtype) if parts else q.new_zeros(0, heads * head_dim)


def _share(kv: torch.Tensor, group: int) -> torch.Tensor:
    """Each K/V head repeated for the `group` query heads it serves (none copied for one)."""
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


def window_mask(tokens: int, window: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[tokens, tokens] bool: True where `|i - j| < window` (the pairs that attend)."""
    at = torch.arange(tokens, device=device)
    return (at[:, None] - at[None, :]).abs() < window

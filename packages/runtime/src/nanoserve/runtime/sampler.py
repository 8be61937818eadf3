"""The sampler: one batched pass from logits to tokens (and logprobs) for every row of a step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nanoserve.runtime.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class SampleRow:
    """What the sampler needs of one sequence."""

    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    generator: torch.Generator | None  # seeded requests carry their own


@dataclass(frozen=True, slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None  # the chosen token's log-probability, per row
    top_logprobs: list[list[tuple[int, float]]] | None  # per row, best first


def sample(
    logits: torch.Tensor, rows: Sequence[SampleRow], generator: torch.Generator | None = None
) -> SampleResult:
    """logits: [rows, vocab] float32 of the raw model; returns one token per row.

    Unseeded rows draw from `generator` (the engine's own), seeded rows from theirs."""
    num_rows = logits.shape[0]
    params = [r.params for r in rows]
    raw = logits
    logits = logits.clone()
    device = logits.device

    if any(p.logit_bias for p in params):
        for i, p in enumerate(params):
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), device=device)
                logits[i, ids] += torch.tensor(list(p.logit_bias.values()), device=device)

    if any(
        p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty for p in params
    ):
        _apply_penalties(logits, rows)

    temperature = torch.tensor([p.temperature for p in params], device=device)
    greedy = temperature == 0.0  # [rows]
    chosen = logits.argmax(dim=-1)  # [rows]
    if not bool(greedy.all()):
        scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
        scaled = _apply_filters(scaled, params)
        probs = torch.softmax(scaled, dim=-1)  # [rows, vocab]
        # The exponential race: argmax(p / E) with E ~ Exp(1) draws from p. Seeded rows draw
        # their noise from their own generator, so a row's draw ignores its batch neighbours.
        noise = torch.empty_like(probs).exponential_(generator=generator)
        for i, r in enumerate(rows):
            if r.generator is not None and not params[i].greedy:
                noise[i].exponential_(generator=r.generator)
        drawn = (probs / noise).argmax(dim=-1)
        chosen = torch.where(greedy, chosen, drawn)

    token_ids = chosen.tolist()
    want = [p.logprobs for p in params]
    if all(w is None for w in want):
        return SampleResult(token_ids, None, None)
    logprobs_all = torch.log_softmax(raw, dim=-1)  # [rows, vocab]
    chosen_lp = logprobs_all.gather(1, chosen[:, None])[:, 0].tolist()
    top_n = max(w or 0 for w in want)
    top: list[list[tuple[int, float]]] = [[] for _ in range(num_rows)]
    if top_n:
        values, ids = logprobs_all.topk(top_n, dim=-1)
        for i, w in enumerate(want):
            if w:
                top[i] = list(zip(ids[i, :w].tolist(), values[i, :w].tolist(), strict=True))
    return SampleResult(token_ids, chosen_lp, top)


def _apply_penalties(logits: torch.Tensor, rows: Sequence[SampleRow]) -> None:
    num_rows, vocab = logits.shape
    device = logits.device
    out_counts = torch.zeros((num_rows, vocab), device=device)
    seen = torch.zeros((num_rows, vocab), dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        if r.output_ids:
            ids = torch.tensor(r.output_ids, device=device)
            out_counts[i].index_add_(0, ids, torch.ones(len(ids), device=device))
        if r.params.repetition_penalty != 1.0 and r.prompt_ids:
            seen[i, torch.tensor(list(r.prompt_ids), device=device)] = True
    seen |= out_counts > 0
    # Repetition (CTRL / Hugging Face): shrink the logit of every token already seen.
    rep = torch.tensor([r.params.repetition_penalty for r in rows], device=device)[:, None]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen, penalised, logits))
    # Presence and frequency (OpenAI): over the generated tokens only.
    presence = torch.tensor([r.params.presence_penalty for r in rows], device=device)[:, None]
    frequency = torch.tensor([r.params.frequency_penalty for r in rows], device=device)[:, None]
    logits -= frequency * out_counts + presence * (out_counts > 0)


def _apply_filters(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    top_k = [p.top_k for p in params]
    top_p = [p.top_p for p in params]
    min_p = [p.min_p for p in params]
    device = logits.device
    if any(top_k) or any(p < 1.0 for p in top_p):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        vocab = logits.shape[1]
        rank = torch.arange(vocab, device=device)[None, :]
        k = torch.tensor([k or vocab for k in top_k], device=device)[:, None]
        drop = rank >= k
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        before = probs.cumsum(dim=-1) - probs
        drop |= before >= torch.tensor(top_p, device=device)[:, None]
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    if any(min_p):
        probs = torch.softmax(logits, dim=-1)
        floor = torch.tensor(min_p, device=device)[:, None] * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits

"""The sampler: one batched pass from logits to tokens (and logprobs) for every row of a step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nanoserve.core.token_bitmask import apply_token_bitmask
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.kernels.cpu_kernels import kernels_loaded
from nanoserve.runtime.structured.token_masks import StepMask


@dataclass(frozen=True, slots=True)
class SampleRow:
    """What the sampler needs of one sequence."""

    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    generator: torch.Generator | None  # seeded requests carry their own
    # Keep the generator's state after this row's draw (a verify row's: a rejected draft
    # rewinds its sequence's generator to the state after the last token it kept).
    keep_state: bool = False


@dataclass(frozen=True, slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None  # the chosen token's log-probability, per row
    top_logprobs: list[list[tuple[int, float]]] | None  # per row, best first
    # Per row: its generator's state after its draw, where the row asked to keep it and drew
    generator_states: list[torch.Tensor | None] | None = None


def sample(
    logits: torch.Tensor,
    rows: Sequence[SampleRow],
    generator: torch.Generator | None = None,
    mask: StepMask | None = None,
) -> SampleResult:
    """logits: [rows, vocab] float32 of the raw model; returns one token per row.

    mask: grammar bitmasks for some rows, applied first and in place (those rows of `logits`
    are left masked): they sample (and report logprobs of) the model's distribution
    renormalised over what their grammar allows; the other rows are untouched, bit for bit.

    Unseeded rows draw from `generator` (the engine's own), seeded rows from theirs. What
    depends on the requests (greedy or not, which features are on) is decided on the host
    from their parameters; each feature's per-row numbers cross to the device in one copy,
    and the results come back in one read (the only device->host transfer of a step)."""
    num_rows = logits.shape[0]
    params = [r.params for r in rows]
    device = logits.device
    if mask is not None:
        # In place: the step's logits are read by nothing after the sampler (a recorded step
        # rewrites its static buffer next step), and a 1.5 MB copy per step is measurable.
        index = torch.tensor(mask.rows, dtype=torch.int64)
        bits = mask.bitmask
        if device.type != "cpu":  # host-filled: one pinned copy each
            index, bits = (
                index.pin_memory().to(device, non_blocking=True),
                bits.to(device, non_blocking=True),
            )
        if (
            device.type == "cpu"
            and kernels_loaded()
            and logits.dtype == torch.float32
            and logits.is_contiguous()
        ):
            kernel_ops.apply_token_bitmask(logits, bits, index)  # skips all-ones words
        else:
            apply_token_bitmask(logits, bits, index)
    raw = logits
    biased = any(p.logit_bias for p in params)
    penalised = any(
        p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty for p in params
    )
    if biased or penalised:
        logits = logits.clone()  # edited in place below; `raw` keeps the model's logprobs
    if biased:
        _apply_logit_bias(logits, params)
    if penalised:
        _apply_penalties(logits, rows)

    chosen = greedy_pick(logits)  # [rows]
    states: list[torch.Tensor | None] | None = None
    if not all(p.greedy for p in params):
        # [5, rows] on the host, one copy: temperature (1 for greedy rows), top_k, top_p,
        # min_p, and 1 where the row samples.
        knobs = _upload(
            [
                [p.temperature if not p.greedy else 1.0 for p in params],
                [float(p.top_k if p.top_k > 0 else logits.shape[1]) for p in params],
                [p.top_p for p in params],
                [p.min_p for p in params],
                [0.0 if p.greedy else 1.0 for p in params],
            ],
            device,
        )
        scaled = logits / knobs[0][:, None]
        scaled = _apply_filters(scaled, params, knobs)
        probs = torch.softmax(scaled, dim=-1)  # [rows, vocab]
        # The exponential race: argmax(p / E) with E ~ Exp(1) draws from p. Seeded rows draw
        # their noise from their own generator, so a row's draw ignores its batch neighbours.
        noise = torch.empty_like(probs).exponential_(generator=generator)
        for i, r in enumerate(rows):
            if r.generator is not None and not params[i].greedy:
                noise[i].exponential_(generator=r.generator)
                if r.keep_state:
                    states = states or [None] * num_rows
                    states[i] = r.generator.get_state()
        drawn = greedy_pick(probs / noise)
        chosen = torch.where(knobs[4] > 0, drawn, chosen)

    want = [p.logprobs for p in params]
    if all(w is None for w in want):
        return SampleResult(chosen.tolist(), None, None, states)
    logprobs_all = torch.log_softmax(raw, dim=-1)  # [rows, vocab]
    top_n = max(w or 0 for w in want)
    # One read: [rows, 2 + 2 * top_n] float64 (ids are exact in float64) — chosen id, its
    # logprob, then the top ids and their logprobs.
    packed = [chosen[:, None].double(), logprobs_all.gather(1, chosen[:, None]).double()]
    if top_n:
        values, ids = logprobs_all.topk(top_n, dim=-1)
        packed += [ids.double(), values.double()]
    table = torch.cat(packed, dim=1).tolist()
    token_ids = [int(line[0]) for line in table]
    top: list[list[tuple[int, float]]] = [[] for _ in range(num_rows)]
    for i, w in enumerate(want):
        if w:
            line = table[i]
            pairs = [(int(line[2 + j]), line[2 + top_n + j]) for j in range(w)]
            # A grammar may allow fewer than w tokens: the forbidden ones are not candidates.
            top[i] = [(t, v) for t, v in pairs if v != float("-inf")]
    return SampleResult(token_ids, [line[1] for line in table], top, states)


def greedy_pick(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum. On a CPU with nanoserve's kernels loaded, their argmax (torch's
    reads a wide step's logits far below the memory's bandwidth); elsewhere max(dim)'s indices,
    the same first maximum and faster than argmax there."""
    if logits.device.type == "cpu" and kernels_loaded() and logits.dtype == torch.float32:
        return kernel_ops.argmax(logits.contiguous())
    return logits.max(dim=-1).indices


def _upload(values: list[list[float]], device: torch.device) -> torch.Tensor:
    """Host lists -> one [len(values), rows] float32 tensor on device, in one copy."""
    host = torch.tensor(values, dtype=torch.float32)
    if device.type == "cpu":
        return host
    # Pinned, so the copy is truly asynchronous (from pageable memory CUDA waits for the
    # stream first); the caching host allocator keeps it alive until the copy lands.
    return host.pin_memory().to(device, non_blocking=True)


def _apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    pairs = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias.items()]
    packed = _upload(
        [[float(i) for i, _, _ in pairs], [float(t) for _, t, _ in pairs]], logits.device
    )
    biases = _upload([[b for _, _, b in pairs]], logits.device)[0]
    logits.index_put_((packed[0].long(), packed[1].long()), biases, accumulate=True)


def _apply_penalties(logits: torch.Tensor, rows: Sequence[SampleRow]) -> None:
    num_rows, vocab = logits.shape
    device = logits.device
    out_counts = torch.zeros((num_rows, vocab), device=device)
    seen = torch.zeros((num_rows, vocab), dtype=torch.bool, device=device)
    # Every row's generated ids and (where repetition applies) prompt ids, flattened with their
    # row index: [2, n] in one copy each (float32 holds ids below 2^24 exactly).
    out_pairs = [(i, t) for i, r in enumerate(rows) for t in r.output_ids]
    prompt_pairs = [
        (i, t)
        for i, r in enumerate(rows)
        if r.params.repetition_penalty != 1.0
        for t in r.prompt_ids
    ]
    if out_pairs:
        ids = _upload([[float(i) for i, _ in out_pairs], [float(t) for _, t in out_pairs]], device)
        out_counts.index_put_(
            (ids[0].long(), ids[1].long()), torch.ones(len(out_pairs), device=device), True
        )
    if prompt_pairs:
        ids = _upload(
            [[float(i) for i, _ in prompt_pairs], [float(t) for _, t in prompt_pairs]], device
        )
        seen[ids[0].long(), ids[1].long()] = True
    seen |= out_counts > 0
    knobs = _upload(
        [
            [r.params.repetition_penalty for r in rows],
            [r.params.presence_penalty for r in rows],
            [r.params.frequency_penalty for r in rows],
        ],
        device,
    )[:, :, None]  # [3, rows, 1]
    # Repetition (CTRL / Hugging Face): shrink the logit of every token already seen.
    penalised = torch.where(logits > 0, logits / knobs[0], logits * knobs[0])
    logits.copy_(torch.where(seen, penalised, logits))
    # Presence and frequency (OpenAI): over the generated tokens only.
    logits -= knobs[2] * out_counts + knobs[1] * (out_counts > 0)


def _apply_filters(
    logits: torch.Tensor, params: Sequence[SamplingParams], knobs: torch.Tensor
) -> torch.Tensor:
    """top_k / top_p / min_p; knobs[1:] are their per-row values on the device."""
    device = logits.device
    if any(p.top_k > 0 for p in params) or any(p.top_p < 1.0 for p in params):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        vocab = logits.shape[1]
        rank = torch.arange(vocab, device=device)[None, :]
        drop = rank >= knobs[1][:, None]
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        before = probs.cumsum(dim=-1) - probs
        drop |= before >= knobs[2][:, None]
        drop.select(1, 0).fill_(False)  # a scalar fill: no host tensor
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    if any(p.min_p for p in params):
        probs = torch.softmax(logits, dim=-1)
        floor = knobs[3][:, None] * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits

"""step_timings: the boot's timing of decode steps and a prompt chunk, which price the budget.

Three forwards over padding, each the fastest of its runs (a shared machine's stolen time only
ever adds; the boot waits on every run): a decode step of one row, twice after a first run that
pays for the first allocations and page faults, then one of `max_batch` rows and a prompt chunk,
whose first runs were measured no slower than their next ones (a 1.5B model: 241/236 ms,
219/201 ms), so they have no discarded first run; with nothing remembered each runs twice.
Every token of them writes the sink slot and reads only it, on a scratch pool of one block, so
the measurement touches nothing a request will read. Decode rows see no context
here, so the decode step is priced a little low, and the budget errs towards shorter chunks.

Where the timings are remembered (timing_cache.py), a boot runs the two wide shapes once, and the
file keeps the faster of two boots' runs; once two boots of the same file on the same machine
have timed all three, a later boot times the 1-row step only, and where it agrees with the one
remembered takes the other two as remembered: ~0.1 s of a 1.5B's boot instead of ~1.1 s (the
first two boots: ~0.65 s).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import torch

import nanoserve.core
import nanoserve.runtime
from nanoserve.core import DecodePlan, KVPoolPlan, PrefillBudget, PrefillPlan, pad_decode
from nanoserve.runtime.engine.timing_cache import StepTimings, TimingCache, file_identity
from nanoserve.runtime.engine_config import ResolvedConfig
from nanoserve.runtime.kernels.cpu_features import cpu_features
from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.weight_forms import KERNEL_FORMS

REPEATS = 2


def step_timings(model: LlamaModel, config: ResolvedConfig) -> StepTimings | None:
    """What an "auto" prefill budget is priced from: remembered or timed here; None where no
    budget is measured."""
    if config.prefill_budget != "auto":
        return None
    if model.device.type != "cpu":
        # Timed here on a CPU's terms (a prompt token's cost against a decode row's, the host
        # clock around each forward): on a GPU a chunk costs about one decode step and the
        # clock would time launches, so prompts take the step's token budget there.
        return None
    return time_steps(
        model,
        max_batch=config.max_batch,
        max_tokens=config.max_num_batched_tokens,
        block_size=config.block_size,
        max_positions=config.max_model_len,
        cache=TimingCache.from_env(),
    )


def time_steps(
    model: LlamaModel,
    *,
    max_batch: int,
    max_tokens: int,
    block_size: int,
    max_positions: int,
    cache: TimingCache | None,
    timer: Callable[..., float] | None = None,
) -> StepTimings:
    """The three timings, remembered where `cache` vouches for them; `timer` (a test's
    clock) stands in for `fastest`."""
    clock = timer or fastest
    cfg = model.config
    plan = KVPoolPlan(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, model.kv_dtype, block_size, 1)
    pool = KVPool(plan, model.device)
    sink = pool.plan.sink_slot
    rows = max(2, max_batch)
    # A chunk of the size the budget gives out (tens of tokens): a longer one spreads the
    # weights' reads over more tokens and would price a budget's chunk too cheap.
    chunk = max(1, min(32, max_tokens, max_positions))

    def forward(plan: DecodePlan | PrefillPlan) -> Callable[[], object]:
        return lambda: model.forward(plan, pool.empty_rows())

    one_row_s = clock(forward(padding_decode(1, sink, model.device)))
    key = timing_key(model, rows, chunk) if cache is not None else None
    remembered = cache.load(key) if cache is not None and key is not None else None
    if remembered is not None and not remembered.agrees(one_row_s):
        remembered = None  # the machine is not as it was: start over
    if remembered is not None and remembered.trusted:
        return remembered
    # Remembered, the wide shapes run once a boot: the file keeps the faster of two boots' runs.
    runs = 1 if key is not None else REPEATS
    timings = StepTimings(
        one_row_s=one_row_s,
        rows=rows,
        rows_s=clock(forward(padding_decode(rows, sink, model.device)), warm=False, runs=runs),
        tokens=chunk,
        tokens_s=clock(forward(padding_prefill(chunk, sink, model.device)), warm=False, runs=runs),
    )
    if remembered is not None:
        timings = timings.fastest_with(remembered)
    if cache is not None and key is not None:
        cache.store(key, timings)
    return timings


def timing_key(model: LlamaModel, rows: int, chunk: int) -> dict[str, object] | None:
    """Everything a step's time depends on that a later boot can see; None: weights with no
    file (a model built in memory) or a file that cannot be read are never remembered."""
    if model.weights_path is None or (weights := file_identity(model.weights_path)) is None:
        return None
    features = cpu_features()
    flags = hashlib.sha256(" ".join(sorted(features.flags)).encode()).hexdigest()[:16]
    kernels = load_cpu_kernels() if model.quantize in KERNEL_FORMS else None
    return {
        "weights": weights,
        "forms": [str(model.dtype), model.quantize, str(model.kv_dtype), model.batch_invariant],
        "cpu": [features.model, features.capability, flags],
        "kernels": [kernels.isa, kernels.library.parent.name] if kernels else None,
        "code": code_digest(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "shapes": [rows, chunk],
    }


@functools.cache
def code_digest() -> str:
    """A digest of nanoserve's core and runtime sources: a change to the forward (or anything
    it calls) is another key, as a change to the kernels' sources is another build."""
    digest = hashlib.sha256()
    for package in (nanoserve.core, nanoserve.runtime):
        root = Path(package.__file__ or "").parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def fastest(run: Callable[[], object], *, warm: bool = True, runs: int = REPEATS) -> float:
    best = float("inf")
    with torch.inference_mode():
        if warm:
            run()  # the first call pays for allocations and page faults
        for _ in range(runs):
            started = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - started)
    return best


def padding_decode(rows: int, sink: int, device: torch.device) -> DecodePlan:
    """`rows` padded rows: length 0, each writing the sink."""
    empty = DecodePlan(
        seq_ids=(),
        pad_rows=0,
        input_ids=torch.empty(0, dtype=torch.int64, device=device),
        positions=torch.empty(0, dtype=torch.int64, device=device),
        write_slots=torch.empty(0, dtype=torch.int64, device=device),
        context_lens=torch.empty(0, dtype=torch.int64, device=device),
        slot_rect=torch.empty((0, 0), dtype=torch.int64, device=device),
        sink_slot=sink,
    )
    return pad_decode(empty, rows, 1)


def padding_prefill(tokens: int, sink: int, device: torch.device) -> PrefillPlan:
    """One chunk of `tokens` tokens at positions 0.., every one writing and reading the sink:
    a prompt's arithmetic (attention over its own positions included) on no real slot."""
    positions = torch.arange(tokens, dtype=torch.int64, device=device)
    return PrefillPlan(
        seq_ids=(),
        input_ids=torch.zeros(tokens, dtype=torch.int64, device=device),
        positions=positions,
        write_slots=torch.full((tokens,), sink, dtype=torch.int64, device=device),
        query_starts=(0, tokens),
        context_lens=torch.tensor([tokens], dtype=torch.int64, device=device),
        slot_rect=torch.full((1, tokens), sink, dtype=torch.int64, device=device),
        last_token_idx=torch.tensor([tokens - 1], dtype=torch.int64, device=device),
        token_rows=torch.zeros(tokens, dtype=torch.int64, device=device),
        token_context_lens=positions + 1,
        sink_slot=sink,
    )


def resolve_prefill_budget(
    config: ResolvedConfig, timings: StepTimings | None
) -> PrefillBudget | None:
    """The config's prefill budget as the scheduler takes it: for "auto", priced from the
    boot's step timings (none: a GPU, where prompts take the step's token budget)."""
    budget = config.prefill_budget
    if budget is None or isinstance(budget, PrefillBudget):
        return budget
    if budget == "auto":
        if timings is None:
            return None
        timed = PrefillBudget.from_timings(
            max_tokens=config.max_num_batched_tokens,
            one_row_s=timings.one_row_s,
            rows=timings.rows,
            rows_s=timings.rows_s,
            tokens=timings.tokens,
            tokens_s=timings.tokens_s,
            min_tokens=config.block_size,
        )
        return dataclasses.replace(timed, max_rows=config.max_batch)  # rows was at least 2
    return PrefillBudget.fixed(int(budget), config.max_num_batched_tokens)

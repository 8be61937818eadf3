"""step_timings: the boot's timing of decode steps and a prompt chunk, which price the budget.

Three forwards over padding, each the fastest of its runs (measure.py): a decode step of one
row, twice after a first run that pays for the first allocations and page faults, then one of
`max_batch` rows and a prompt chunk, whose first runs were measured no slower than their next
ones (RESULTS.md), so they have no discarded first run; with nothing remembered each runs
twice. Decode rows see no context here, so the decode step is priced a little low, and the
budget errs towards shorter chunks.

Where the timings are remembered (timing_cache.py), a boot runs the two wide shapes once, and
the file keeps the faster of two boots' runs; once two boots of the same file on the same
machine have timed all three, a later boot times the 1-row step only, and where it agrees with
the one remembered takes the other two as remembered: a boot then spends one short forward on
its budget instead of three long ones.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

import torch

import nanoserve.core
from nanoserve.core import (
    DecodePlan,
    PrefillBudget,
    PrefillPlan,
    padding_decode,
    padding_prefill,
)
from nanoserve.runtime.engine.config.engine_config import ResolvedConfig
from nanoserve.runtime.engine.timing.measure import REPEATS, fastest, scratch_pool
from nanoserve.runtime.engine.timing.timing_cache import StepTimings, TimingCache, file_identity
from nanoserve.runtime.kernels.cpu_features import cpu_features
from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.weight_forms import KERNEL_FORMS


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
    pool = scratch_pool(model, block_size)
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
        "forms": [
            str(model.dtype),
            model.quantize,
            str(model.kv_cache_dtype),
            model.batch_invariant,
        ],
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
    runtime = Path(__file__).resolve().parents[2]  # nanoserve/runtime, this file's package root
    for root in (Path(nanoserve.core.__file__ or "").parent, runtime):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


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

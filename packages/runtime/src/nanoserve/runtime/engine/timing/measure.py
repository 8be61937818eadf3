"""The boot's stopwatch: how a timing is measured, shared by every timing of a step's cost.

A timing is the fastest of several runs of a forward over padding (a shared machine's stolen
time only ever adds), after a first run that pays for allocations and page faults. The
forwards run on a scratch pool of one block: every token writes and reads the sink slot, so a
timing touches nothing a request will read.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from nanoserve.core import KVPoolPlan
from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.state_pool import StatePool

REPEATS = 2  # runs of one forward, the fastest kept (`fastest`)
ROUNDS = 5  # rounds of forwards taken in turn (`fastest_interleaved`)


def scratch_pool(model: LlamaModel, block_size: int = 1) -> KVPool:
    """A K/V pool of one block for model's geometry, and a state pool of only the sink: what a
    timed forward writes."""
    cfg = model.config
    layers, shapes = len(cfg.kv_layers), cfg.kv_layer_shapes
    kv = model.kv_cache_dtype
    plan = KVPoolPlan(
        layers, cfg.num_kv_heads, cfg.head_dim, kv.torch_dtype, block_size, 1, kv, shapes
    )
    return KVPool(plan, model.device, StatePool(StatePoolPlan(0, cfg.state_shapes), model.device))


def fastest(run: Callable[[], object], *, warm: bool = True, runs: int = REPEATS) -> float:
    """run's fastest of `runs` runs, in seconds (after one unmeasured run, if `warm`)."""
    best = float("inf")
    with torch.inference_mode():
        if warm:
            run()  # the first call pays for allocations and page faults
        for _ in range(runs):
            started = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - started)
    return best


def fastest_interleaved(runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Each run's fastest of ROUNDS, the runs taken in turn: a burst of another process's work
    slows one round of each, not every round of one (which would misprice it)."""
    best = dict.fromkeys(runs, float("inf"))
    with torch.inference_mode():
        for run in runs.values():
            run()  # the first call pays for allocations and page faults
        for _ in range(ROUNDS):
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - started)
    return best

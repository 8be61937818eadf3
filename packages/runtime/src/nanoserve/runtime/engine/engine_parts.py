"""EngineParts: what an engine is built of, assembled in the order each needs the last.

The memory plan splits `--kv-budget` between a hybrid's recurrent state (its running rows, its
prefix cache's checkpoints, the sink) and the K/V blocks; the pools are reserved from it; the
block manager and the state slots address them; the step timings (measured at boot or
remembered) give the prefill budget, and with it the speculator's draft budget; the scheduler
plans steps over all of these, and the runner executes them. `Engine.__init__` takes them as
one frozen set, so the engine's own module reads as the step, not as its assembly.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve.core import KVPoolPlan, PrefillBudget
from nanoserve.core.state_checkpoints import StateCheckpoints
from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.core.state_slots import StateSlots
from nanoserve.runtime.decode.recordings import Backend
from nanoserve.runtime.engine.config.engine_config import ResolvedConfig
from nanoserve.runtime.engine.config.memory_plan import MemoryPlan, plan_memory
from nanoserve.runtime.engine.speculation.speculator import Speculator, build_speculator
from nanoserve.runtime.engine.step.block_manager import BlockManager
from nanoserve.runtime.engine.step.runner import ModelRunner
from nanoserve.runtime.engine.step.scheduler import Scheduler
from nanoserve.runtime.engine.timing.step_timing import resolve_prefill_budget, step_timings
from nanoserve.runtime.engine.timing.timing_cache import StepTimings
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.memory import keep_freed_memory
from nanoserve.runtime.model.served_model import ServedModel
from nanoserve.runtime.model.state_pool import StatePool


@dataclass(frozen=True, slots=True)
class EngineParts:
    memory: MemoryPlan
    pool: KVPool
    blocks: BlockManager
    step_timings: StepTimings | None
    prefill_budget: PrefillBudget | None
    speculator: Speculator | None
    scheduler: Scheduler
    runner: ModelRunner

    @property
    def state_plan(self) -> StatePoolPlan:
        return self.memory.state

    @property
    def pool_plan(self) -> KVPoolPlan:
        return self.memory.kv


def build_parts(
    model: ServedModel,
    config: ResolvedConfig,
    backend: Backend | None = None,
    draft: LlamaModel | None = None,
) -> EngineParts:
    # A hybrid's recurrent state (a slot per running sequence, its prefix cache's
    # checkpoints, the sink) comes out of the K/V budget first.
    if config.kv_cache_dtype is not None:
        model.use_kv_cache_dtype(config.kv_cache_dtype)
    memory = plan_memory(model.config, config, model.kv_cache_dtype)
    if model.device.type == "cpu":
        keep_freed_memory()
    pool = KVPool(memory.kv, model.device, StatePool(memory.state, model.device))
    state_slots = StateSlots(memory.state.num_slots)
    rule = memory.checkpoints
    blocks = BlockManager(
        memory.kv.num_blocks,
        config.block_size,
        enable_prefix_cache=memory.prefix_caching,
        checkpoints=StateCheckpoints(state_slots, memory.state.checkpoint_slots, rule)
        if rule is not None
        else None,
    )
    # A model that reads whole inputs neither decodes nor drafts: its steps are whole inputs
    # under the token budget
    decoder = model if isinstance(model, LlamaModel) else None
    timings = step_timings(decoder, config) if decoder else None  # "auto": timed or remembered
    budget = resolve_prefill_budget(config, timings)
    speculator = build_speculator(decoder, config, budget, memory.kv, draft) if decoder else None
    scheduler = Scheduler(
        blocks,
        max_batch=config.max_batch,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_waiting=config.max_waiting,
        prefill_budget=budget,
        drafter=speculator.drafts if speculator is not None else None,
        state_slots=state_slots,
        whole_prompts=model.config.whole_inputs,
    )
    runner = ModelRunner(model, pool, config, backend)
    return EngineParts(memory, pool, blocks, timings, budget, speculator, scheduler, runner)

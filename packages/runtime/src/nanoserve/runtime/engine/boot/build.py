"""build_engine: one frozen config to a ready engine — load, plan the pool, warm, one real step.

A cancel event (a shutdown while booting) is checked between phases and, inside the warm-up,
between recordings; a set one raises WarmupCancelled, which a server treats as a clean stop.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from nanoserve.core import Shape
from nanoserve.core.draft_budget import DraftCost
from nanoserve.runtime.decode.warmup import WarmEstimate, WarmPlan, WarmupReport, check_cancelled
from nanoserve.runtime.engine.config.engine_config import (
    EngineConfig,
    available_cpus,
    resolve_threads,
)
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.pooling_params import PoolingParams
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.speculation.draft_model import (
    DraftModel,
    draft_path,
    load_draft_model,
)
from nanoserve.runtime.engine.timing.timing_cache import TOLERANCE
from nanoserve.runtime.errors import ChatTemplateError
from nanoserve.runtime.kernels.cpu_features import cpu_features
from nanoserve.runtime.kernels.cpu_kernels import kernels_available
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.loading.embedded import embedded_model_path
from nanoserve.runtime.loading.pooler_config import resolve_task
from nanoserve.runtime.model.pooler import build_pooler
from nanoserve.runtime.model.served_model import load_model
from nanoserve.runtime.model.weight_forms import AUTO, auto_quantize
from nanoserve.runtime.text.chat_template import ChatTemplate

log = logging.getLogger("nanoserve")


def resolve_model_path(model: str | None) -> Path:
    """The checkpoint to load: a directory, a GGUF file (read in place, never converted), or
    the embedded model."""
    return Path(model) if model else embedded_model_path()


def choose_weight_forms(
    config: EngineConfig, checkpoint: Checkpoint, say: Callable[[str], None]
) -> str | None:
    """What quantize "auto" serves: the checkpoint's own block form on nanoserve's CPU
    kernels, or the model dtype where there is none or the kernels cannot be built here (said,
    not raised)."""
    if config.quantize != AUTO:
        return None
    form = auto_quantize(checkpoint.linear_types(), config.device)
    if form is not None and not kernels_available():
        say(f"quantize auto: the CPU kernels cannot be built here, so {form} is served dequantized")
        form = None
    return form


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off while a boot allocates: a GGUF's vocabulary and merges are
    hundreds of thousands of objects made at once, none of them garbage, and each automatic
    collection would rescan them (about half of a large vocabulary's tokenizer build)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def build_engine(
    config: EngineConfig,
    *,
    say: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
    engine_type: Callable[..., Engine] = Engine,
) -> Engine:
    """engine_type: what to build over the loaded model (a test's engine that fails on cue)."""
    with gc_paused():
        return _build_engine(config, say or log.info, cancel, engine_type)


def _build_engine(
    config: EngineConfig,
    say: Callable[[str], None],
    cancel: threading.Event | None,
    engine_type: Callable[..., Engine],
) -> Engine:
    started = time.perf_counter()
    use_threads(config, say)
    # A GGUF is opened in place (its header; the weights are a memory map): its tensor types
    # decide what "auto" serves.
    path = resolve_model_path(config.model)
    say(f"loading {path}")
    checkpoint = load_checkpoint(path)
    if skipped := checkpoint.skipped:
        parts = ", ".join(f"the {part} ({count} tensors)" for part, count in skipped.items())
        say(f"not loaded: {parts}; the language model alone is served")
    resolved = config.resolve(
        model_max_len=checkpoint.config.max_position_embeddings,
        auto_quantize=choose_weight_forms(config, checkpoint, say),
    )
    model = load_model(
        checkpoint,
        dtype=resolved.torch_dtype,
        device=resolved.device,
        batch_invariant=resolved.batch_invariant,
        max_positions=resolved.max_model_len,
        quantize=resolved.quantize,
    )
    try:
        chat_template: ChatTemplate | None = ChatTemplate.from_checkpoint(checkpoint)
    except ChatTemplateError:
        chat_template = None
    if fallbacks := model.weight_fallbacks:
        say(f"weights without a kernel of their own: {fallbacks}")
    check_cancelled(cancel, "after loading the weights")
    draft = None
    if (spec := resolved.speculative) is not None and spec.model is not None:
        say(f"loading the draft model {draft_path(spec.model)}")
        draft = load_draft_model(spec.model, resolved, checkpoint.tokenizer)
    pooler = build_pooler(
        resolve_task(checkpoint.pooler, config.task, whole_inputs=checkpoint.config.whole_inputs),
        model.logits,
        checkpoint.head_tensor,
        lambda text: checkpoint.tokenizer.encode(text, add_special_tokens=False),
    )
    if pooler.task != "generate":
        say(f"serving {pooler.describe()}")
    name = config.served_model_name or (
        Path(config.model).name if config.model else "SmolLM2-135M-Instruct"
    )
    engine = engine_type(
        model,
        checkpoint.tokenizer,
        resolved,
        chat_template=chat_template,
        name=name,
        boot_started=started,
        draft=draft,
        pooler=pooler,
    )
    if (budget := engine.prefill_budget) is not None and budget.per_token_s:
        say(
            f"prefill budget: a decode step of r rows measured at {budget.base_s * 1e3:.1f} ms"
            f" + {budget.per_row_s * 1e3:.2f} ms/row, a prompt token at"
            f" {budget.per_token_s * 1e3:.2f} ms; while sequences decode a step carries"
            f" {budget.tokens(1)} prompt tokens at 1 row, {budget.tokens(resolved.max_batch)} at"
            f" {resolved.max_batch} (within {budget.ratio}x of the decode step), and a backlog up"
            f" to {budget.burst_tokens(1, resolved.max_batch)} (steps within {budget.burst}x the"
            " decode step to come)"
        )
    if (timings := engine.step_timings) is not None and timings.remembered is not None:
        say(
            f"prefill budget: the fastest of {timings.boots} boots' step timings, kept in"
            f" {timings.remembered} (this boot's 1-row step agreed within {TOLERANCE}x)"
        )
    if engine.speculator is not None:
        say(f"speculation by {engine.speculator.proposer.describe()}")
        say(spec_line(engine.speculator.cost, resolved.max_batch))
    if not engine.pool_plan.num_layers:
        say(
            f"no K/V kept (whole inputs, both ways): {resolved.max_batch} inputs of up to"
            f" {min(resolved.max_model_len, resolved.max_num_batched_tokens)} tokens in flight,"
            f" each whole in one step of at most {resolved.max_num_batched_tokens} tokens"
        )
    else:
        say(
            f"planned K/V pool: {engine.pool_plan.num_blocks} blocks of {resolved.block_size}"
            f" ({engine.pool_plan.total_bytes / 2**20:.0f} MiB, {engine.pool_plan.kv_cache_dtype}"
            f" K/V) for {resolved.max_model_len}-token contexts"
        )
    if (state := engine.state_plan).tensors:
        running = state.num_slots - state.checkpoint_slots
        say(
            f"recurrent state: {running} slots + {state.checkpoint_slots} checkpoints + the"
            f" sink of {state.bytes_per_slot / 2**10:.1f} KiB each"
            f" ({state.total_bytes / 2**20:.1f} MiB, float32,"
            f" {len(model.config.recurrent_layers)} layers)"
        )
        if (rule := engine.memory.checkpoints) is not None:
            say(
                f"prefix cache: a state checkpoint every {rule.interval_blocks} blocks"
                f" ({rule.interval_tokens} tokens) and where a longer prompt ends; a hit"
                f" restores the deepest, {state.bytes_per_slot / 2**10:.1f} KiB copied"
            )
        elif resolved.enable_prefix_cache:
            say("prefix cache: off for this model (no state checkpoints: a hit must restore one)")
    if engine.config.decode_mode.recorded and engine.config.warm:
        check_cancelled(cancel, "before the warm-up")
        warm_engine(engine, say, cancel)
    check_cancelled(cancel, "before the first forward")
    say("running one real forward")
    first_forward(engine)
    say(boot_line(engine, engine.mark_ready() or 0.0))
    return engine


def use_threads(config: EngineConfig, say: Callable[[str], None]) -> None:
    """Set the compute threads before anything runs (packing the weights is threaded too): the
    kernels split their work over torch's intra-op threads, so one count sets both. More than
    the CPUs available is allowed (a user may know better), and said."""
    if config.threads is None:
        return
    threads = resolve_threads(config.threads)
    torch.set_num_threads(threads)
    if threads > (cpus := available_cpus()):
        say(
            f"warning: {threads} threads on {cpus} available CPUs: threads will wait for each"
            " other (a step's work is split evenly between them)"
        )


def warm_engine(
    engine: Engine,
    say: Callable[[str], None] = log.info,
    cancel: threading.Event | None = None,
) -> WarmupReport:
    """Plan the memory-trimmed list, say what is priced, then the estimate, then record it."""
    plan = engine.plan_warm()
    if plan.shapes:
        probes = " and ".join(dict.fromkeys(_shape(s) for s in (plan.shapes[0], plan.shapes[-1])))
        say(f"pricing {len(plan.shapes)} decode shapes: timing one recording at {probes}")
    return engine.warm(
        plan, cancel=cancel, announce=lambda plan, estimate: say(warm_line(plan, estimate))
    )


def warm_line(plan: WarmPlan, estimate: WarmEstimate) -> str:
    """The estimate, said before the work (and so /health's phase while it is done)."""
    num_shapes = len(estimate.shapes)
    per_shape = estimate.seconds / num_shapes if num_shapes else 0.0
    measured = " and ".join(f"{_shape(s)}" for s, _ in reversed(estimate.probes)) or "nothing"
    dropped = [f"{_shape(s)} ({t:.1f} s)" for s, t in estimate.probes if s not in estimate.shapes]
    # A probe the trim dropped was paid for all the same: it is in the estimate, and named.
    budget = "none" if estimate.budget_seconds is None else f"{estimate.budget_seconds:g} s"
    line = (
        f"warming {num_shapes} decode shapes (rows <= {plan.max_rows},"
        f" width <= {_time_trimmed(plan.max_width, estimate.time_ceiling)}):"
        f" estimated {estimate.seconds:.1f} s ({per_shape:.2f} s/shape measured at {measured});"
        f" time budget {budget}, memory ceiling {plan.width_ceiling} tokens,"
        f" {len(plan.skipped) + len(estimate.skipped)} skipped"
    )
    if dropped:
        line += f"; probe {', '.join(dropped)} spent, then trimmed"
    return line


def _time_trimmed(max_width: int, time_ceiling: int | None) -> int:
    return max_width if time_ceiling is None else min(max_width, time_ceiling)


def _shape(shape: Shape) -> str:
    return f"{shape.rows}x{shape.width}"


def first_forward(engine: Engine) -> None:
    """One real request end to end before the door opens; it leaves no trace in the numbers."""
    task = engine.pooler.task
    params = (
        SamplingParams(max_tokens=1, temperature=0.0)
        if task == "generate"
        else PoolingParams("score" if task == "rerank" else "embed")
    )
    engine.add_request("__boot__", [0], params)
    engine.run_until_done()
    engine.check_blocks()
    engine.reset_counters()


def spec_line(cost: DraftCost, max_batch: int) -> str:
    """What a draft token costs, and the acceptance from which one pays, alone and at load."""

    def pays_from(rows: int) -> str:
        rate = rows * (cost.switch_s + cost.token_s) / cost.decode_s(rows)
        return f"{rate:.2f}" if rate < 1 else "never"

    proposing = f" (+{cost.propose_s * 1e3:.2f} ms to propose)" if cost.propose_s else ""
    return (
        f"speculation: a draft token measured at {cost.per_draft_s * 1e3:.2f} ms{proposing},"
        " a verify step"
        f" +{cost.switch_s * 1e3:.2f} ms over a decode step of {cost.decode_s(1) * 1e3:.1f} ms;"
        f" one draft token pays from acceptance {pays_from(1)} at 1 row,"
        f" {pays_from(max_batch)} at {max_batch}"
    )


def boot_line(engine: Engine, seconds: float) -> str:
    plan = engine.pool_plan
    parts = [
        f"nanoserve ready: model={engine.name}",
        f"dtype={engine.config.dtype}"
        + (f"+{engine.config.quantize}" if engine.config.quantize else ""),
        f"device={engine.config.device}",
        f"cpu={cpu_features().capability}",
        f"threads={engine.config.threads}",
        f"kernels={engine.runner.model.kernels}",
        *([f"weights=[{types}]"] if (types := engine.runner.model.weight_types) else []),
        f"kv_blocks={plan.num_blocks}x{plan.block_size}",
    ]
    if (usage := engine.runner.model.expert_usage) is not None:
        experts = usage.experts
        parts.insert(
            -1,
            f"experts={experts.num_experts}x{len(usage.sizes)} top{experts.experts_per_token}"
            + (
                "" if usage.arena is None else " mapped" if usage.arena.reused else " packed+mapped"
            ),
        )
    if (state := engine.state_plan).tensors:
        parts.append(
            f"state_slots={state.num_slots - state.checkpoint_slots}"
            f"+{state.checkpoint_slots}x{state.bytes_per_slot}B"
        )
    if (speculator := engine.speculator) is not None:
        parts.append(f"speculative={speculator.config.label}")
        if isinstance(draft := speculator.proposer, DraftModel):
            pool = draft.pool.plan
            parts.append(f"draft={draft.name} draft_kv_blocks={pool.num_blocks}x{pool.block_size}")
    if engine.warm_report is not None:
        report = engine.warm_report
        estimated = report.estimate.seconds
        over_time = report.num_over_time
        parts.append(
            f"recordings={report.num_recorded} ({report.backend}, est {estimated:.2f}s,"
            f" took {report.total_seconds:.2f}s; skipped {len(report.skipped) - over_time}"
            f" by memory, {over_time} by time)"
        )
    elif engine.config.decode_mode.recorded:
        parts.append("recordings=lazy (recorded in front of clients)")
    parts.append(f"ready in {seconds:.1f}s")
    return " ".join(parts)

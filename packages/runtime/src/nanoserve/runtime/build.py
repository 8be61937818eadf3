"""build_engine: one frozen config to a ready engine — load, plan the pool, warm, one real step."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nanoserve.core import warm_shapes, width_ceiling
from nanoserve.runtime.chat_template import ChatTemplate
from nanoserve.runtime.checkpoint import load_checkpoint
from nanoserve.runtime.embedded import embedded_model_path
from nanoserve.runtime.engine import Engine
from nanoserve.runtime.engine_config import EngineConfig
from nanoserve.runtime.errors import ChatTemplateError
from nanoserve.runtime.memory import free_bytes
from nanoserve.runtime.model import LlamaModel
from nanoserve.runtime.sampling_params import SamplingParams

log = logging.getLogger("nanoserve")


@dataclass(frozen=True, slots=True)
class WarmPlan:
    """What the warm-up will record, and why the list is as long as it is."""

    max_rows: int
    max_width: int  # min(deployment's context limit, budget's width ceiling)
    budget_bytes: int
    width_ceiling: int
    num_shapes: int
    num_skipped: int  # shapes of the rows-trimmed list the budget's ceiling removed


def resolve_model_path(model: str | None) -> Path:
    """The checkpoint to load: a directory, a GGUF file (converted once, cached), or embedded."""
    path = Path(model) if model else embedded_model_path()
    if path.suffix == ".gguf" and path.is_file():
        from nanoserve.runtime.convert import cached_conversion

        return cached_conversion(path)
    return path


def build_engine(config: EngineConfig, *, say: Callable[[str], None] | None = None) -> Engine:
    say = say or log.info
    started = time.perf_counter()
    path = resolve_model_path(config.model)
    say(f"loading {path}")
    checkpoint = load_checkpoint(path)
    config = config.resolved(checkpoint.config.max_position_embeddings)
    model = LlamaModel.from_tensors(
        checkpoint.config,
        checkpoint.tensors(),
        dtype=config.torch_dtype,
        device=config.device,
        batch_invariant=config.batch_invariant,
        max_positions=config.max_model_len,
        quantize=config.quantize,
    )
    try:
        chat_template: ChatTemplate | None = ChatTemplate.from_checkpoint(checkpoint)
    except ChatTemplateError:
        chat_template = None
    name = config.served_model_name or (
        Path(config.model).name if config.model else "SmolLM2-135M-Instruct"
    )
    engine = Engine(model, checkpoint.tokenizer, config, chat_template=chat_template, name=name)
    say(
        f"planned K/V pool: {engine.pool_plan.num_blocks} blocks of {config.block_size}"
        f" ({engine.pool_plan.total_bytes / 2**20:.0f} MiB) for {config.max_model_len}-token contexts"
    )
    if config.capture_decode and config.warm:
        warm(engine, say)
    say("running one real forward")
    first_forward(engine)
    seconds = time.perf_counter() - started
    engine.ready_seconds = seconds
    say(boot_line(engine, seconds))
    return engine


def plan_warm(engine: Engine) -> tuple[WarmPlan, tuple, tuple]:
    config = engine.config
    buckets = engine.runner.buckets
    assert buckets is not None and config.warm_max_rows and config.warm_max_width
    heads = engine.model.config.num_heads
    max_rows = min(config.warm_max_rows, config.max_batch)
    if config.warm_budget_bytes is not None:
        budget = config.warm_budget_bytes
    else:  # the pool is not resident yet: what is free now, less what it will take
        budget = max(0, free_bytes(engine.pool.device) - engine.pool_plan.total_bytes)
    ceiling = width_ceiling(budget, max_rows, heads)
    max_width = min(config.warm_max_width, ceiling)
    by_rows = warm_shapes(buckets, max_rows=max_rows, max_width=config.warm_max_width)
    shapes = warm_shapes(buckets, max_rows=max_rows, max_width=max_width)
    skipped = tuple(
        (s, f"wider than the budget's width ceiling of {ceiling} tokens")
        for s in by_rows
        if s not in set(shapes)
    )
    plan = WarmPlan(max_rows, max_width, budget, ceiling, len(shapes), len(skipped))
    return plan, shapes, skipped


def warm(engine: Engine, say: Callable[[str], None] = log.info) -> None:
    plan, shapes, skipped = plan_warm(engine)
    say(
        f"warming {len(shapes)} decode shapes (rows <= {plan.max_rows}, width <= {plan.max_width};"
        f" budget ceiling {plan.width_ceiling} tokens, {len(skipped)} skipped)"
    )
    report = engine.warm_decode(shapes, skipped=skipped)
    engine.warm_plan = plan
    engine.warm_report = report


def first_forward(engine: Engine) -> None:
    """One real request end to end before the door opens; it leaves no trace in the numbers."""
    engine.add_request("__boot__", [0], SamplingParams(max_tokens=1, temperature=0.0))
    engine.run_until_done()
    engine.check_blocks()
    engine.reset_counters()


def boot_line(engine: Engine, seconds: float) -> str:
    plan = engine.pool_plan
    parts = [
        f"nanoserve ready: model={engine.name}",
        f"dtype={engine.config.dtype}"
        + (f"+{engine.config.quantize}" if engine.config.quantize else ""),
        f"device={engine.config.device}",
        f"kv_blocks={plan.num_blocks}x{plan.block_size}",
    ]
    if engine.warm_report is not None:
        report = engine.warm_report
        parts.append(
            f"graphs={report.num_recorded} ({report.backend}, {report.total_seconds:.2f}s,"
            f" skipped {len(report.skipped)} by budget)"
        )
    elif engine.config.capture_decode:
        parts.append("graphs=lazy (recorded in front of clients)")
    parts.append(f"ready in {seconds:.1f}s")
    return " ".join(parts)

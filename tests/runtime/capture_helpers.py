"""Shared by the capture and warm-up tests: a tiny engine in each decode mode, and a workload
whose requests join and leave mid-run so the row set and the widths change under recordings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from nanoserve.core import BucketSet, Shape
from nanoserve.runtime.decode.recordings import DecodeRecordings
from nanoserve.runtime.decode.warmup import WarmupReport
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.speculation.speculator import Speculator
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel


def recordings_of(engine: Engine) -> DecodeRecordings:
    """The engine's recordings, for a test of decode_mode "recorded"."""
    recordings = engine.runner.recordings
    assert recordings is not None, "the engine records nothing: decode_mode is not 'recorded'"
    return recordings


def buckets_of(engine: Engine) -> BucketSet:
    """The engine's shape buckets, for a test of a padded decode mode."""
    buckets = engine.runner.buckets
    assert buckets is not None, "the engine pads nothing: decode_mode is 'eager'"
    return buckets


def speculator_of(engine: Engine) -> Speculator:
    """The engine's speculator, for a test of an engine that speculates."""
    assert engine.speculator is not None, "the engine does not speculate"
    return engine.speculator


def warm(
    engine: Engine,
    shapes: Iterable[Shape] | None = None,
    *,
    skipped: tuple[tuple[Shape, str], ...] = (),
    **kwargs: Any,
) -> WarmupReport:
    """Warm the engine's own plan, or the same plan listing `shapes` (and `skipped`) instead."""
    plan = engine.plan_warm()
    if shapes is not None:
        plan = replace(plan, shapes=tuple(shapes), skipped=skipped)
    return engine.warm(plan, **kwargs)


def tiny_engine(model_dir: Path, **config: Any) -> Engine:
    """The tiny model in float32 on config's device (default cpu), small pool and buckets."""
    checkpoint = load_checkpoint(model_dir)
    model = LlamaModel.from_tensors(
        checkpoint.config,
        checkpoint.tensors(),
        dtype=torch.float32,
        device=str(config.get("device", "cpu")),
        max_positions=256,
    )
    defaults: dict[str, object] = {
        "max_model_len": 256,
        "max_batch": 8,
        "width_multiple": 8,
        "block_size": 4,
        "kv_budget_bytes": 1 << 22,
    }
    return Engine.from_config(model, checkpoint.tokenizer, EngineConfig(**{**defaults, **config}))


PROMPTS = (
    [5, 17, 3, 99, 250, 31, 7],
    [120, 64, 8, 200],
    [11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53],
    [7, 7, 7],
    [300, 1, 2, 3, 4, 5, 6, 7, 8, 9],
)


def run_joining_workload(engine: Engine) -> dict[str, list[int]]:
    """Three requests start; two more join at step 3; lengths differ so rows leave early."""
    tokens: dict[str, list[int]] = {}
    for i in range(3):
        engine.add_request(
            f"r{i}",
            PROMPTS[i],
            SamplingParams(max_tokens=6 + 9 * i, temperature=0, ignore_eos=True),
        )
    step = 0
    while engine.has_unfinished:
        if step == 3:
            for i in (3, 4):
                engine.add_request(
                    f"r{i}",
                    PROMPTS[i],
                    SamplingParams(max_tokens=20, temperature=0, ignore_eos=True),
                )
        for delta in engine.step():
            tokens.setdefault(delta.request_id, []).extend(delta.token_ids)
        step += 1
    engine.check_blocks()
    return tokens

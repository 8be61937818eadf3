"""nanoserve.runtime: the model, the K/V pool, capture and warm-up, the engine.

This module is the runtime's one public face: everything the server (nanoserve.api) uses is
here, and the api imports nothing deeper (tests/test_layout.py checks). `from nanoserve.runtime
import LLM, SamplingParams`, as with vLLM. The names load lazily, so importing one submodule
does not import the whole runtime; no runtime module imports this one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanoserve.runtime.decode.recordings import RecordingStats
    from nanoserve.runtime.decode.warmup import WarmupCancelled
    from nanoserve.runtime.engine.boot.boot_heap import freeze_boot_heap, thaw_boot_heap
    from nanoserve.runtime.engine.boot.build import build_engine
    from nanoserve.runtime.engine.config.engine_config import (
        SERVER_DEFAULTS,
        TASKS,
        EngineConfig,
        EngineConfigError,
    )
    from nanoserve.runtime.engine.config.speculative_config import (
        SpeculativeConfig,
        SpeculativeConfigError,
    )
    from nanoserve.runtime.engine.engine import Engine
    from nanoserve.runtime.engine.engine_status import EngineStatus
    from nanoserve.runtime.engine.requests.pooling_params import PoolingParams
    from nanoserve.runtime.engine.requests.request_check import RequestError
    from nanoserve.runtime.engine.requests.request_times import RequestTimes
    from nanoserve.runtime.engine.requests.sampling_params import (
        MAX_N,
        MAX_TOP_LOGPROBS,
        SEED_END,
        SEED_MIN,
        SamplingParams,
    )
    from nanoserve.runtime.engine.serving.async_engine import (
        AsyncEngine,
        EngineClosedError,
        EngineDeadError,
        StreamBehindError,
    )
    from nanoserve.runtime.engine.serving.llm import LLM
    from nanoserve.runtime.engine.speculation.speculator import SpecCounts
    from nanoserve.runtime.engine.step.kv_events import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVEvent,
        KVEventBatch,
        KVEventQueue,
    )
    from nanoserve.runtime.engine.step.scheduler import QueueFullError
    from nanoserve.runtime.engine.step.sequence import Delta
    from nanoserve.runtime.errors import ChatTemplateError, CheckpointError, EmbeddedModelMissing
    from nanoserve.runtime.loading.convert import convert_gguf
    from nanoserve.runtime.loading.embedded import embedded_model_path
    from nanoserve.runtime.structured.grammar_spec import JSON_OPTIONS, GrammarSpec
    from nanoserve.runtime.structured.number_bounds import bounded_schema
    from nanoserve.runtime.text.rerank_prompt import rerank_prompt, score_pairs

# Each public name, and the module (under nanoserve.runtime) that defines it.
_WHERE = {
    "LLM": "engine.serving.llm",
    "AsyncEngine": "engine.serving.async_engine",
    "Engine": "engine.engine",
    "build_engine": "engine.boot.build",
    "freeze_boot_heap": "engine.boot.boot_heap",
    "thaw_boot_heap": "engine.boot.boot_heap",
    "EngineConfig": "engine.config.engine_config",
    "SERVER_DEFAULTS": "engine.config.engine_config",
    "TASKS": "engine.config.engine_config",
    "PoolingParams": "engine.requests.pooling_params",
    "SpeculativeConfig": "engine.config.speculative_config",
    "SamplingParams": "engine.requests.sampling_params",
    "MAX_N": "engine.requests.sampling_params",
    "MAX_TOP_LOGPROBS": "engine.requests.sampling_params",
    "SEED_MIN": "engine.requests.sampling_params",
    "SEED_END": "engine.requests.sampling_params",
    "GrammarSpec": "structured.grammar_spec",
    "rerank_prompt": "text.rerank_prompt",
    "score_pairs": "text.rerank_prompt",
    "JSON_OPTIONS": "structured.grammar_spec",
    "bounded_schema": "structured.number_bounds",
    "Delta": "engine.step.sequence",
    "RequestTimes": "engine.requests.request_times",
    "EngineStatus": "engine.engine_status",
    "RecordingStats": "decode.recordings",
    "SpecCounts": "engine.speculation.speculator",
    "AllBlocksCleared": "engine.step.kv_events",
    "BlockRemoved": "engine.step.kv_events",
    "BlockStored": "engine.step.kv_events",
    "KVEvent": "engine.step.kv_events",
    "KVEventBatch": "engine.step.kv_events",
    "KVEventQueue": "engine.step.kv_events",
    "convert_gguf": "loading.convert",
    "embedded_model_path": "loading.embedded",
    "EngineConfigError": "engine.config.engine_config",
    "SpeculativeConfigError": "engine.config.speculative_config",
    "RequestError": "engine.requests.request_check",
    "QueueFullError": "engine.step.scheduler",
    "EngineClosedError": "engine.serving.async_engine",
    "EngineDeadError": "engine.serving.async_engine",
    "StreamBehindError": "engine.serving.async_engine",
    "WarmupCancelled": "decode.warmup",
    "ChatTemplateError": "errors",
    "CheckpointError": "errors",
    "EmbeddedModelMissing": "errors",
}
__all__ = [
    "JSON_OPTIONS",
    "LLM",
    "MAX_N",
    "MAX_TOP_LOGPROBS",
    "SEED_END",
    "SEED_MIN",
    "SERVER_DEFAULTS",
    "TASKS",
    "AllBlocksCleared",
    "AsyncEngine",
    "BlockRemoved",
    "BlockStored",
    "ChatTemplateError",
    "CheckpointError",
    "Delta",
    "EmbeddedModelMissing",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineConfigError",
    "EngineDeadError",
    "EngineStatus",
    "GrammarSpec",
    "KVEvent",
    "KVEventBatch",
    "KVEventQueue",
    "PoolingParams",
    "QueueFullError",
    "RecordingStats",
    "RequestError",
    "RequestTimes",
    "SamplingParams",
    "SpecCounts",
    "SpeculativeConfig",
    "SpeculativeConfigError",
    "StreamBehindError",
    "WarmupCancelled",
    "bounded_schema",
    "build_engine",
    "convert_gguf",
    "embedded_model_path",
    "freeze_boot_heap",
    "rerank_prompt",
    "score_pairs",
    "thaw_boot_heap",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'nanoserve.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"nanoserve.runtime.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

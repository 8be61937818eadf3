"""nanoserve.runtime: the model, the K/V pool, capture and warm-up, the engine.

`from nanoserve.runtime import LLM, SamplingParams`, as with vLLM. The names load lazily, so
importing one submodule does not import the whole runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanoserve.runtime.decode.recordings import RecordingStats
    from nanoserve.runtime.decode.warmup import WarmupCancelled
    from nanoserve.runtime.engine.async_engine import AsyncEngine
    from nanoserve.runtime.engine.build import build_engine
    from nanoserve.runtime.engine.engine import Engine
    from nanoserve.runtime.engine.llm import LLM
    from nanoserve.runtime.engine.sampling_params import SamplingParams
    from nanoserve.runtime.engine_config import EngineConfig

_WHERE = {
    "LLM": "engine.llm",
    "SamplingParams": "engine.sampling_params",
    "Engine": "engine.engine",
    "EngineConfig": "engine_config",
    "AsyncEngine": "engine.async_engine",
    "build_engine": "engine.build",
    "RecordingStats": "decode.recordings",
    "WarmupCancelled": "decode.warmup",
}
__all__ = [
    "LLM",
    "AsyncEngine",
    "Engine",
    "EngineConfig",
    "RecordingStats",
    "SamplingParams",
    "WarmupCancelled",
    "build_engine",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'nanoserve.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"nanoserve.runtime.{_WHERE[name]}"), name)

"""EngineStatus: one frozen, typed snapshot of an engine — what /health and /metrics read.

`Engine.status()` takes it, between steps or during one (the step thread mutates the counters
it copies): each number is read once, so a snapshot is consistent field by field, not across
fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nanoserve.core import KVPoolPlan, PrefillBudget
from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.runtime.decode.recordings import RecordingStats
from nanoserve.runtime.decode.warmup import WarmupReport
from nanoserve.runtime.engine.speculation.speculator import SpecCounts


@dataclass(frozen=True, slots=True)
class PrefixCacheCounts:
    queried_tokens: int  # prompt tokens looked up, once per admitted sequence
    hit_tokens: int  # of which found in the cache

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


@dataclass(frozen=True, slots=True)
class EngineStatus:
    model: str
    dtype: str
    quantize: str | None
    device: str
    cpu: str  # the host CPU's dispatch level and deciding flags: "AVX512 (avx2 fma ...)"
    threads: int  # the kernels' and torch's intra-op threads
    kernels: str  # what runs the linears: "gguf nanoserve/avx2", "float32 torch/mkl", ...
    weights: str | None  # the GGUF types served, per tensor: "q5_0×133 q8_0×13 ..."; None: floats
    weight_fallbacks: str | None  # stored types served re-quantized: "f16×1 as q8_0 (...)"
    decode_mode: str
    # How many prompt tokens a step carries while sequences decode (None: no bound)
    prefill_budget: PrefillBudget | None
    max_model_len: int
    ready_seconds: float | None  # the boot, load to first forward; None if built another way
    pool: KVPoolPlan
    state: StatePoolPlan  # a hybrid's recurrent state (a plan of no tensors: none)
    state_slots_in_use: int
    blocks_in_use: int
    kv_cache_usage: float  # blocks held by sequences / blocks, 0..1
    warm: WarmupReport | None  # None: no warm-up ran (eager, or lazily recorded)
    recordings: RecordingStats | None  # None: the decode mode records nothing
    running: int  # sequences scheduled
    waiting: int  # sequences waiting (a request of n samples counts n)
    waiting_requests: int
    prefix_cache: PrefixCacheCounts
    prompt_tokens: int
    generation_tokens: int
    finished: Mapping[str, int]  # finished sequences by finish reason
    steps: int
    speculation: SpecCounts | None = None  # None: speculation is off
    task: str = "generate"  # generate, embed or rerank (the engine's pooler)
    pooler: str | None = None  # how it pools ("embed: last pooling, normalized (...)"); None
    pooling_requests: int = 0  # pooling requests answered
    pooling_tokens: int = 0  # their prompt tokens
    # A mixture of experts: counts, types served, bytes, and the share of them run since boot
    experts: Mapping[str, object] | None = None

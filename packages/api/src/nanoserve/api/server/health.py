"""/health's two bodies, as msgspec Structs: a ready engine, and one that is not (yet).

A ready engine reports what it serves and its plans: the K/V pool's, the warm-up's and the
recordings' (each the runtime's own `as_dict()`); before that, the boot's phase or why it
failed. The fields and their names are the published /health document.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct

from nanoserve.runtime import EngineStatus


class HealthNotReady(Struct, kw_only=True):
    """503: still booting ("starting"), or failed (the boot, or the engine since)."""

    status: str  # "starting" | "failed"
    phase: str | None  # the boot's console line; "failed" once the engine died
    error: str | None


class Health(Struct, kw_only=True):
    """200: a ready engine."""

    status: str  # "ok"
    model: str
    dtype: str
    quantize: str | None
    device: str
    cpu: str
    threads: int  # the kernels' and torch's intra-op threads (--threads)
    kernels: str
    weights: str | None
    weight_fallbacks: str | None
    decode_mode: str
    prefill_budget: dict[str, Any] | None
    ready_seconds: float | None
    kv_pool: dict[str, Any]  # the pool plan, and the blocks held now
    kv_cache_dtype: str  # how K and V are stored: float16, q8_0, k=q8_0,v=q4_0 (--kv-cache-dtype)
    # A hybrid's recurrent state: slots, bytes, and the slots held now (None: it keeps none)
    state_pool: dict[str, Any] | None
    warm: dict[str, Any] | None  # the warm-up's report; None: none ran
    capture: dict[str, Any] | None  # the recordings' counters; None: nothing is recorded
    speculation: dict[str, Any] | None = None  # its counters and measured costs; None: off
    task: str = "generate"  # what the model serves: generate, embed or rerank (--task)
    pooler: str | None = None  # how an embedder or a reranker pools; None: it generates
    # A mixture of experts: experts, per_token, routed_layers, types, bytes, touched_share (the
    # share of the experts' bytes run since boot), mapped_from (the file they are mapped from,
    # None: packed into memory) and reused (that file was packed by an earlier boot); None: no
    # experts
    experts: dict[str, Any] | None = None

    @classmethod
    def of(cls, status: EngineStatus) -> Health:
        return cls(
            status="ok",
            model=status.model,
            dtype=status.dtype,
            quantize=status.quantize,
            device=status.device,
            cpu=status.cpu,
            threads=status.threads,
            kernels=status.kernels,
            weights=status.weights,
            weight_fallbacks=status.weight_fallbacks,
            decode_mode=status.decode_mode,
            prefill_budget=status.prefill_budget.as_dict() if status.prefill_budget else None,
            ready_seconds=status.ready_seconds,
            kv_pool={**status.pool.as_dict(), "blocks_in_use": status.blocks_in_use},
            kv_cache_dtype=str(status.pool.kv_cache_dtype),
            state_pool={
                **status.state.as_dict(),
                "tensors": len(status.state.tensors),
                "state_slots_in_use": status.state_slots_in_use,
            }
            if status.state.tensors
            else None,
            warm=status.warm.as_dict() if status.warm is not None else None,
            capture=status.recordings.as_dict() if status.recordings is not None else None,
            speculation=status.speculation.as_dict() if status.speculation is not None else None,
            task=status.task,
            pooler=status.pooler,
            experts=dict(status.experts) if status.experts is not None else None,
        )

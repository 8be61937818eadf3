"""KVPool: each layer's K and V for every slot plus the sink, allocated on first write."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoserve.core import (
    DecodePlan,
    KVPoolPlan,
    PrefillPlan,
    paged_decode_attention,
    paged_prefill_attention,
)
from nanoserve.core.errors import GeometryError
from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.runtime.model.device import resolve_device
from nanoserve.runtime.model.lazy_pages import zeroed
from nanoserve.runtime.model.state_pool import StatePool


class KVPool:
    """Layer l's K/V live in one tensor [2, num_slots + 1, kv_heads, head_dim] (the layer's
    own heads and head_dim where the plan's layers differ).

    K and V share a tensor so a layer's write is one indexed copy; slots come first so a
    gather copies whole [kv_heads, head_dim] rows. The last entry is the sink slot:
    padded rows write there and no block table names it. A layer's storage appears on its
    first write (`_ensure_pool`); on a CPU its pages are the OS's zeroed ones, resident as slots
    are written, so a pool costs memory as it is used, unless the warm-up touches it all
    (`touch`) to have nothing paged in front of a client.
    """

    def __init__(
        self,
        plan: KVPoolPlan,
        device: torch.device | str = "cpu",
        states: StatePool | None = None,
    ) -> None:
        self.plan = plan
        self.device = resolve_device(device)
        self._layers: list[torch.Tensor | None] = [None] * plan.num_layers
        # A hybrid model's recurrent state, addressed by the plans' state slots (a model that
        # keeps none has a pool of no tensors). It travels with the K/V: a step uses both.
        self.states = states or StatePool(StatePoolPlan(0, ()), self.device)

    @property
    def sink_state_slot(self) -> int:
        """The state slot padded rows read and write."""
        return self.states.plan.sink

    @property
    def blocks(self) -> bool:
        """The pool keeps GGUF blocks (`--kv-cache-dtype q8_0|q4_0`): only the kernels read it."""
        return self.plan.kv_cache_dtype.blocks

    @property
    def kernel_types(self) -> tuple[int, ...]:
        """The kernels' `kv_types` for this pool: () for float values."""
        return self.plan.kv_cache_dtype.kernel_types

    def _check_floats(self, what: str) -> None:
        if self.blocks:
            raise GeometryError(
                f"{what} reads float K/V; this pool keeps {self.plan.kv_cache_dtype} blocks,"
                " which only nanoserve's CPU kernels read"
            )

    @property
    def resident(self) -> bool:
        return all(layer is not None for layer in self._layers)

    @property
    def resident_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._layers if t is not None)

    def _ensure_pool(self, layer: int) -> torch.Tensor:
        pool = self._layers[layer]
        if pool is None:
            plan = self.plan
            heads, head_dim = plan.layer_shape(layer)
            shape = (
                (plan.num_slots + 1, heads, plan.layer_row_bytes(layer))
                if self.blocks
                else (2, plan.num_slots + 1, heads, head_dim)
            )
            pool = zeroed(shape, plan.dtype, self.device)
            self._layers[layer] = pool
        return pool

    def write(
        self,
        layer: int,
        slots: torch.Tensor,  # [tokens]
        k: torch.Tensor,  # [tokens, kv_heads, head_dim]
        v: torch.Tensor,  # [tokens, kv_heads, head_dim]
    ) -> None:
        self._check_floats("a K/V write in torch")
        pool = self._ensure_pool(layer)
        pool.index_copy_(1, slots, torch.stack((k, v)).to(pool.dtype))

    def touch(self) -> None:
        """Every layer's storage allocated and each of its pages written (resident), values
        unchanged (x * 1 is x, signed zeros included), as the warm-up wants them before the
        first request: the OS hands an anonymous map's pages out on first touch, so otherwise
        only slots ever written become resident."""
        with torch.inference_mode():  # the pool may already be an inference tensor
            for layer in range(self.plan.num_layers):
                self._ensure_pool(layer).mul_(1)

    def storage(self, layer: int) -> torch.Tensor:
        """A layer's whole K/V tensor, [2, num_slots + 1, kv_heads, head_dim] (or, of blocks,
        uint8 [num_slots + 1, kv_heads, row bytes]): what a kernel that writes and reads the
        pool in place takes, with `kernel_types`."""
        return self._ensure_pool(layer)

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k_pool, v_pool) of a layer, each [num_slots + 1, kv_heads, head_dim]."""
        self._check_floats("torch's paged attention")
        pool = self._ensure_pool(layer)
        return pool[0], pool[1]

    def pools(self) -> list[torch.Tensor]:
        """Every resident layer's K and V, each [num_slots + 1, kv_heads, head_dim] (a pool of
        blocks: each layer's bytes, whole)."""
        if self.blocks:
            return [t for t in self._layers if t is not None]
        return [kv for t in self._layers if t is not None for kv in (t[0], t[1])]

    def snapshot(self) -> list[torch.Tensor]:
        """Copies of pools(), for the warm-up's before/after comparison."""
        return [t.clone() for t in self.pools()]

    def view(self, seq_ids: tuple[int, ...]) -> CacheRows:
        """The cache as a scheduled step sees it. A scheduled view over no rows is a forward
        with nothing in it, so it is refused; the warm-up says what it means with `empty_rows()`."""
        if not seq_ids:
            raise EmptySelectionError("a scheduled cache view needs at least one row")
        return CacheRows(self, seq_ids)

    def empty_rows(self) -> CacheRows:
        """The empty selection: "the rows this plan addresses", which on a warm plan is none."""
        return CacheRows(self, ())


class EmptySelectionError(GeometryError):
    """A scheduled view over no rows."""


class CacheRowsError(GeometryError):
    """A bound cache view was used with a plan over other rows."""


@dataclass(frozen=True, slots=True)
class CacheRows:
    """The pool seen through one row selection. A non-empty selection must be the plan's rows;
    an empty one reads every row of the plan, padded rows included (masked, writing the sink)."""

    pool: KVPool
    seq_ids: tuple[int, ...]

    def _check(self, plan_seq_ids: tuple[int, ...]) -> None:
        if self.seq_ids and self.seq_ids != plan_seq_ids:
            raise CacheRowsError(
                f"a view bound to sequences {self.seq_ids} used for sequences {plan_seq_ids}"
            )

    def write(
        self, layer: int, plan: DecodePlan | PrefillPlan, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        self._check(plan.seq_ids)
        self.pool.write(layer, plan.write_slots, k, v)

    @property
    def kernel_types(self) -> tuple[int, ...]:
        return self.pool.kernel_types

    def storage(self, layer: int, plan: DecodePlan | PrefillPlan) -> torch.Tensor:
        """The layer's K/V tensor for a kernel that reads and writes it in place for `plan`."""
        self._check(plan.seq_ids)
        return self.pool.storage(layer)

    def state(self, index: int, plan: DecodePlan | PrefillPlan) -> torch.Tensor:
        """State tensor `index` (a recurrent layer's, in layer order), [state slots + 1, ...]:
        `plan.state_slots` names the rows it reads and writes in place."""
        self._check(plan.seq_ids)
        return self.pool.states.tensor(index)

    def paged_attention(
        self,
        layer: int,
        q: torch.Tensor,  # [tokens, heads, head_dim]
        plan: DecodePlan | PrefillPlan,
        scale: float,
        accum_dtype: torch.dtype,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._check(plan.seq_ids)
        k_pool, v_pool = self.pool.layer(layer)
        if isinstance(plan, DecodePlan):
            return paged_decode_attention(
                q,
                k_pool,
                v_pool,
                plan.slot_rect,
                plan.context_lens,
                scale,
                accum_dtype,
                window,
                sinks,
            )
        return paged_prefill_attention(
            q,
            k_pool,
            v_pool,
            plan.query_starts,
            plan.context_lens.tolist(),
            plan.slot_rect,
            scale,
            accum_dtype,
            window,
            sinks,
        )

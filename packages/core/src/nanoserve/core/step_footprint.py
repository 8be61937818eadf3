"""StepFootprint: the memory one decode step of a shape needs at its peak, priced before it runs.

The build log's `warm_budget_bytes` counts the attention scores alone (rows x heads x width x 4),
but scores are the small part: a decode step gathers every row's K and V over its whole width
into the attention dtype, which is head_dim / group times the scores' bytes (24-85x at the
models served here). A recording's pool, and the warm-up's memory budget, must hold the real
peak. One layer's attention is live at a time, so the peak is the larger of

- attention: the gathered K and V in the accumulation dtype, one of them also in the pool's
  dtype while it converts, the gather's int64 index, the slot rectangle and its mask, and the
  scores three times over (scores, softmax, weights);
- the output projection: rows x vocab float32 logits, twice (the matmul's output and its
  float32 copy; the shared logits buffer is allocated once and not counted per shape).

A kernel that reads K/V in place (`gathers=False`: nanoserve's CPU kernels) holds only one
float32 score per head and position of the rows it works on, and its output.

Checked against the allocator's measured peak on a CPU in tests/core/test_step_footprint.py's
runtime twin (tests/runtime/model/test_step_footprint.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve.core.errors import require_positive

INDEX_BYTES = 8  # int64 slot ids and gather indices
MASK_BYTES = 1  # bool


@dataclass(frozen=True, slots=True)
class StepFootprint:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    pool_bytes: int  # bytes per element of the K/V pool (the model's dtype)
    accum_bytes: int  # bytes per element of attention's matmuls (float64 in fp32-invariant)
    gathers: bool = True  # attention copies K/V out of the pool (torch's) or reads it in place

    def __post_init__(self) -> None:
        require_positive(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            pool_bytes=self.pool_bytes,
            accum_bytes=self.accum_bytes,
        )

    @property
    def stats_bytes(self) -> int:
        """Softmax statistics never below float32."""
        return max(self.accum_bytes, 4)

    def attention_bytes(self, rows: int, width: int) -> int:
        if not self.gathers:
            scores = rows * self.num_heads * (width + 16) * 4  # the kernel's scratch, at most
            return scores + rows * self.num_heads * self.head_dim * 4
        kv = rows * self.num_kv_heads * width * self.head_dim
        converting = kv * self.pool_bytes if self.pool_bytes != self.accum_bytes else 0
        gathered = 2 * kv * self.accum_bytes + converting
        index = rows * self.num_kv_heads * width * INDEX_BYTES
        rect = rows * width * (INDEX_BYTES + MASK_BYTES)
        scores = 3 * rows * self.num_heads * width * self.stats_bytes
        return gathered + index + rect + scores

    def logits_bytes(self, rows: int) -> int:
        return 2 * rows * self.vocab_size * 4

    def peak_bytes(self, rows: int, width: int) -> int:
        """Bytes a (rows, width) decode step holds at once, beyond weights, pool and inputs."""
        return max(self.attention_bytes(rows, width), self.logits_bytes(rows))

    def width_ceiling(self, budget_bytes: int, rows: int) -> int:
        """The widest width whose step fits budget_bytes at rows (0 if none does)."""
        require_positive(rows=rows)
        if self.logits_bytes(rows) > budget_bytes:
            return 0
        per_position = self.attention_bytes(rows, 1)  # attention is linear in width
        return max(0, budget_bytes) // per_position

"""nanoserve.core: paged K/V addressing as pure, device-agnostic tensor logic.

Never imports torch.cuda, nanoserve.runtime or nanoserve.api (tests/test_layout.py checks).
"""

from nanoserve.core.attention import paged_decode_attention, paged_prefill_attention
from nanoserve.core.blocks import (
    BlockAllocator,
    BlockTable,
    ConservationError,
    OutOfBlocksError,
    check_conservation,
)
from nanoserve.core.buckets import BucketSet, Shape, bucket_decode
from nanoserve.core.decode_buffers import DecodeBuffers
from nanoserve.core.decode_plan import (
    DecodePlan,
    DecodeSeq,
    pad_decode,
    padding_decode,
    padding_plan,
    plan_decode,
)
from nanoserve.core.errors import GateError, GeometryError, NanoserveError
from nanoserve.core.kv_pool_plan import KVPoolPlan, PoolBudgetError, plan_kv_pool
from nanoserve.core.prefill_budget import PrefillBudget, PrefillBudgetError
from nanoserve.core.prefill_plan import (
    PrefillChunk,
    PrefillPlan,
    last_tokens,
    padding_prefill,
    plan_prefill,
)
from nanoserve.core.slot_table import SlotTable
from nanoserve.core.step_footprint import StepFootprint
from nanoserve.core.warm_list import (
    lazy_captures,
    stall_seconds,
    warm_budget_bytes,
    warm_shapes,
    warmup_seconds,
    width_ceiling,
)

__all__ = [
    "BlockAllocator",
    "BlockTable",
    "BucketSet",
    "ConservationError",
    "DecodeBuffers",
    "DecodePlan",
    "DecodeSeq",
    "GateError",
    "GeometryError",
    "KVPoolPlan",
    "NanoserveError",
    "OutOfBlocksError",
    "PoolBudgetError",
    "PrefillBudget",
    "PrefillBudgetError",
    "PrefillChunk",
    "PrefillPlan",
    "Shape",
    "SlotTable",
    "StepFootprint",
    "bucket_decode",
    "check_conservation",
    "last_tokens",
    "lazy_captures",
    "pad_decode",
    "padding_decode",
    "padding_plan",
    "padding_prefill",
    "paged_decode_attention",
    "paged_prefill_attention",
    "plan_decode",
    "plan_kv_pool",
    "plan_prefill",
    "stall_seconds",
    "warm_budget_bytes",
    "warm_shapes",
    "warmup_seconds",
    "width_ceiling",
]

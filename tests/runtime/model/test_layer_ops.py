"""CpuKernelOps against TorchOps: the same pieces of a layer, within float32 rounding (and
rotary bit for bit), over the same pool, slot rectangle and plans."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nanoserve.core import (
    BlockTable,
    PrefillChunk,
    PrefillPlan,
    plan_decode,
    plan_kv_pool,
    plan_prefill,
)
from nanoserve.core.decode_plan import DecodeSeq
from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.layer_ops import CpuKernelOps, TorchOps
from tests.tiny_models import tiny_model_config

CONFIG = tiny_model_config(
    vocab_size=64, intermediate_size=64, num_layers=1, head_dim=32, max_position_embeddings=64
)
BLOCK = 4


def tables() -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, 32, 2).float() / 32))
    freqs = torch.outer(torch.arange(64).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


@pytest.fixture(scope="module")
def both() -> tuple[TorchOps, CpuKernelOps]:
    load_cpu_kernels()
    cos, sin = tables()
    return TorchOps(CONFIG, [(cos, sin)], torch.float32), CpuKernelOps(CONFIG, [(cos, sin)])


def pool(dtype: torch.dtype = torch.float32) -> KVPool:
    plan = plan_kv_pool(
        num_layers=1,
        num_kv_heads=2,
        head_dim=32,
        dtype=dtype,
        block_size=BLOCK,
        budget_bytes=1 << 20,
        max_blocks=16,
    )
    return KVPool(plan)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


def test_norms(both: tuple[TorchOps, CpuKernelOps]) -> None:
    ref, ours = both
    g = torch.Generator().manual_seed(0)
    x, delta, w = (
        torch.randn(3, 64, generator=g),
        torch.randn(3, 64, generator=g),
        torch.randn(64, generator=g),
    )
    assert close(ours.rms_norm(x, w), ref.rms_norm(x, w))
    x1, x2 = x.clone(), x.clone()
    assert close(ours.add_rms_norm(x1, delta, w), ref.add_rms_norm(x2, delta, w))
    assert torch.equal(x1, x + delta) and torch.equal(x2, x + delta)  # the residual, in place


def test_silu_mul(both: tuple[TorchOps, CpuKernelOps]) -> None:
    ref, ours = both
    gate_up = torch.randn(3, 128, generator=torch.Generator().manual_seed(1)) * 5
    gate_up[0, 0], gate_up[0, 1] = 100.0, -100.0  # exp's clamps: silu(100) = 100, silu(-100) ~ 0
    assert close(ours.gated_act(gate_up), ref.gated_act(gate_up), 1e-6)


def test_gelu_mul() -> None:
    config = dataclasses.replace(CONFIG, hidden_act="gelu_tanh")
    cos, sin = tables()
    ref, ours = TorchOps(config, [(cos, sin)], torch.float32), CpuKernelOps(config, [(cos, sin)])
    gate_up = torch.randn(3, 128, generator=torch.Generator().manual_seed(4)) * 5
    expected = torch.nn.functional.gelu(gate_up[:, :64], approximate="tanh") * gate_up[:, 64:]
    assert close(ref.gated_act(gate_up), expected, 0)
    assert close(ours.gated_act(gate_up), expected, 1e-6)


def test_head_norms_and_no_rotary_layers_agree() -> None:
    """Per-head q/k norms before rotary, and a layer without rotary (the kernel's identity
    table): the same q and pool on both sets, bit for bit where rotary is, within rounding for
    the norm."""
    config = dataclasses.replace(CONFIG, no_rope_layers=(0,))
    cos, sin = tables()
    ref, ours = TorchOps(config, [(cos, sin)], torch.float32), CpuKernelOps(config, [(cos, sin)])
    g = torch.Generator().manual_seed(5)
    norms = (torch.randn(32, generator=g), torch.randn(32, generator=g))
    for rotary_ref, rotary_ours in ((None, None), (ref.rotary, ours.rotary)):
        ref_pool, our_pool = pool(), pool()
        _, plan = prompt_plan(ref_pool, (5, 3))
        qkv = torch.randn(8, (4 + 4) * 32, generator=g)
        table_ref = rotary_ref(plan)[0] if rotary_ref else None
        table_ours = rotary_ours(plan)[0] if rotary_ours else None
        q_ref = ref.rotate_and_cache(qkv.clone(), table_ref, plan, ref_pool.view((0, 1)), 0, norms)
        q_ours = ours.rotate_and_cache(
            qkv.clone(), table_ours, plan, our_pool.view((0, 1)), 0, norms
        )
        assert close(q_ours, q_ref)
        assert close(our_pool.storage(0), ref_pool.storage(0))
    # Without rotary and norms, q and k pass unchanged: the identity table turns nothing.
    kv = pool()
    _, plan = prompt_plan(kv, (5, 3))
    qkv = torch.randn(8, (4 + 4) * 32, generator=g)
    q = ours.rotate_and_cache(qkv.clone(), None, plan, kv.view((0, 1)), 0)
    assert torch.equal(q, qkv[:, :128])


def prompt_plan(kv: KVPool, lengths: tuple[int, ...]) -> tuple[list[BlockTable], PrefillPlan]:
    """Two sequences prefilled in one plan; blocks handed out backwards (slot != position)."""
    free = list(reversed(range(kv.plan.num_blocks)))
    tables_ = [BlockTable(BLOCK, [free.pop() for _ in range(-(-n // BLOCK) + 1)]) for n in lengths]
    chunks = [
        PrefillChunk(i, tuple(range(3, 3 + n)), 0, t)
        for i, (n, t) in enumerate(zip(lengths, tables_, strict=True))
    ]
    return tables_, plan_prefill(chunks, sink_slot=kv.plan.sink_slot)


def test_rotary_is_bit_for_bit_and_kv_lands_in_its_slots(
    both: tuple[TorchOps, CpuKernelOps],
) -> None:
    ref, ours = both
    ref_pool, our_pool = pool(), pool()
    _, plan = prompt_plan(ref_pool, (5, 3))
    qkv = torch.randn(8, (4 + 4) * 32, generator=torch.Generator().manual_seed(2))
    q_ref = ref.rotate_and_cache(qkv.clone(), ref.rotary(plan)[0], plan, ref_pool.view((0, 1)), 0)
    ours_qkv = qkv.clone()
    q_ours = ours.rotate_and_cache(ours_qkv, ours.rotary(plan)[0], plan, our_pool.view((0, 1)), 0)
    assert torch.equal(q_ours, q_ref)
    assert torch.equal(our_pool.storage(0), ref_pool.storage(0))


@pytest.mark.parametrize("window", [None, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_and_decode_attention(
    both: tuple[TorchOps, CpuKernelOps], dtype: torch.dtype, window: int | None
) -> None:
    ref, ours = both
    kv = pool(dtype)
    kv.storage(0)[:, -1] = float("nan")  # the sink: never read
    tables_, plan = prompt_plan(kv, (6, 3))
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(9, (4 + 4) * 32, generator=g)
    q = ours.rotate_and_cache(qkv, ours.rotary(plan)[0], plan, kv.view((0, 1)), 0)
    q = q.contiguous()
    assert close(
        ours.attention(q, plan, kv.view((0, 1)), 0, window),
        ref.attention(q, plan, kv.view((0, 1)), 0, window),
    )
    # The same two sequences decoding one token each; a padded row sees nothing and gives zeros.
    seqs = [DecodeSeq(i, 7, n, t) for i, (n, t) in enumerate(zip((6, 3), tables_, strict=True))]
    step = plan_decode(seqs, sink_slot=kv.plan.sink_slot)
    q = torch.randn(2, 4 * 32, generator=g)
    out = ours.attention(q, step, kv.view((0, 1)), 0, window)
    assert close(out, ref.attention(q, step, kv.view((0, 1)), 0, window))
    # A row alone gives the bits it gives in the batch.
    last = ours.attention(
        q[:1], plan_decode(seqs[:1], sink_slot=kv.plan.sink_slot), kv.view((0,)), 0, window
    )
    assert torch.equal(last, out[:1])


def test_a_partial_rotary_turns_the_first_dims_bit_for_bit() -> None:
    """Phi-4-mini's rotary over part of each head (here 16 of 32 dims): the kernel turns the
    first 16 as their own two halves, as torch does, and leaves the rest."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    freqs = torch.outer(torch.arange(64).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    tables = [(emb.cos(), emb.sin())]  # [64, 16] each
    config = dataclasses.replace(CONFIG, rotary_dim=16)
    ref, ours = TorchOps(config, tables, torch.float32), CpuKernelOps(config, tables)
    ref_pool, our_pool = pool(), pool()
    _, plan = prompt_plan(ref_pool, (5, 3))
    qkv = torch.randn(8, (4 + 4) * 32, generator=torch.Generator().manual_seed(6))
    q_ref = ref.rotate_and_cache(qkv.clone(), ref.rotary(plan)[0], plan, ref_pool.view((0, 1)), 0)
    q_ours = ours.rotate_and_cache(
        qkv.clone(), ours.rotary(plan)[0], plan, our_pool.view((0, 1)), 0
    )
    assert torch.equal(q_ours, q_ref)
    assert torch.equal(our_pool.storage(0), ref_pool.storage(0))
    heads = qkv[:, :128].view(8, 4, 32)
    assert torch.equal(q_ours.reshape(8, 4, 32)[..., 16:], heads[..., 16:])  # untouched
    assert not torch.equal(q_ours.reshape(8, 4, 32)[1:, :, :16], heads[1:, :, :16])

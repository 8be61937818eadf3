"""nanoserve's CPU kernels: built here, every ISA path this CPU runs gives the same bits, and a
machine that cannot build them gets a clear error.

This is the per-ISA invariance check: it runs on whatever CPU CI has and compares each path it
can run (portable C++, AVX2, AVX-512 VNNI) against the portable one, op by op.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nanoserve.core.token_bitmask import apply_token_bitmask
from nanoserve.runtime.errors import KernelBuildError
from nanoserve.runtime.kernels import cpu_kernels
from nanoserve.runtime.kernels.cpu_kernels import CpuKernels, load_cpu_kernels
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.gguf_types import BY_NAME, KERNEL_TYPES
from nanoserve.runtime.model.quant_weight import QuantLinear, QuantWeight
from tests.runtime.isa_paths import assert_same_bits, on_every_isa

ops = torch.ops.nanoserve


def test_the_path_is_chosen_from_the_cpu(runnable_isas: list[str]) -> None:
    assert runnable_isas[0] == "portable"
    assert str(ops.kernel_isa()) == runnable_isas[-1]
    with pytest.raises(RuntimeError, match="unknown kernel ISA 'sse9'"):
        CpuKernels.force_isa("sse9")
    if runnable_isas[-1] != "avx512-vnni":
        with pytest.raises(RuntimeError, match="this CPU cannot run avx512-vnni"):
            CpuKernels.force_isa("avx512-vnni")


@pytest.mark.parametrize("rows", [1, 3, 8, 13])
def test_linears_agree_on_every_isa(
    runnable_isas: list[str], rows: int, random_blocks: Callable[..., object]
) -> None:
    """Every weight type's dot kernel, as parts of one linear (each its own type), with a bias:
    the same bits on every path."""
    kinds = sorted(KERNEL_TYPES, key=lambda k: BY_NAME[k].number)
    parts = []
    for i, kind in enumerate(kinds):
        raw = torch.from_numpy(random_blocks(kind, 24 + i, 512, seed=rows * 100 + i))
        parts.append(QuantWeight.pack(GgufBlocks(kind, raw, (24 + i, 512))))
    linear = QuantLinear(tuple(parts))
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 512, generator=g) * 3
    bias = torch.randn(linear.shape[0], generator=g)
    assert_same_bits(
        on_every_isa(runnable_isas, lambda: (linear.matmul(x, bias), linear.matmul(x)))
    )


# Where each type's fp16 scales sit in its block (the other bytes are levels or, for the K
# types, 6- and 8-bit sub-block scales): every level byte at its maximum, every scale finite.
HALF_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "MXFP4": (),
}  # fmt: skip
E8M0_FIELDS = {"MXFP4": (0,)}  # a power of two: 2^(e - 128) with ggml's halving


def extreme_blocks(kind: str, rows: int, width: int, level: int) -> GgufBlocks:
    """Blocks whose every byte but the scales is `level` (0xFF: the largest levels and
    sub-block scales; 0x7F: q8_0's and q6_k's largest signed values; 0x77: mxfp4's largest
    code, 12 read as level 24), scales 1/64."""
    t = BY_NAME[kind]
    blocks = torch.full((rows, width // t.block, t.block_bytes), level, dtype=torch.uint8)
    for at in HALF_FIELDS[kind]:
        blocks[..., at], blocks[..., at + 1] = 0x00, 0x24  # fp16 1/64, little-endian
    for at in E8M0_FIELDS.get(kind, ()):
        blocks[..., at] = 122  # 1/64
    return GgufBlocks(kind, blocks.reshape(rows, -1), (rows, width))


@pytest.mark.parametrize("level", [0xFF, 0x7F, 0x80, 0x77])
def test_linears_agree_at_the_bounds_of_their_sums(runnable_isas: list[str], level: int) -> None:
    """Every level at its largest against inputs at +-127, all of one sign: the sums AVX2 keeps
    in int16 (4 chunks of 4-bit levels, 2 of 5-bit ones or of mxfp4's levels to 24, a chunk of
    6-bit ones) at their bounds,
    where one overflow would show as a difference from the portable path."""
    kinds = sorted(KERNEL_TYPES, key=lambda k: BY_NAME[k].number)
    linear = QuantLinear(tuple(QuantWeight.pack(extreme_blocks(k, 16, 512, level)) for k in kinds))
    x = torch.ones(4, 512)
    x[1] = -1.0
    x[2, ::2] = -1.0  # signs alternating in every pair
    x[3, 256:] = -1.0
    results = on_every_isa(runnable_isas, lambda: linear.matmul(x))
    assert_same_bits(results)
    assert torch.isfinite(results["portable"]).all()


def pool_and_rect(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, 41, 2, 32, generator=g).to(dtype)  # 40 slots and the sink
    kv[:, 40] = float("nan")  # the sink holds anything; nothing may read it
    rect = torch.randperm(40, generator=g)[:24].reshape(3, 8)
    return kv, rect


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_attention_agrees_on_every_isa(runnable_isas: list[str], dtype: torch.dtype) -> None:
    kv, rect = pool_and_rect(dtype, seed=7)
    q = torch.randn(3, 4 * 32, generator=torch.Generator().manual_seed(8))
    lens = torch.tensor([8, 0, 5])
    results = on_every_isa(
        runnable_isas, lambda: ops.paged_attention(q, kv, rect, None, lens, 0.2, 4)
    )
    assert_same_bits(results)
    assert torch.equal(results["portable"][1], torch.zeros(4 * 32))


@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_norms_rotary_and_silu_agree_on_every_isa(
    runnable_isas: list[str], pool_dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(9)
    x, delta, w = (
        torch.randn(5, 64, generator=g),
        torch.randn(5, 64, generator=g),
        torch.randn(64, generator=g),
    )
    gate_up = torch.randn(5, 96, generator=g) * 4
    qkv = torch.randn(5, (4 + 2 * 2) * 32, generator=g)
    cos, sin = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
    positions, slots = torch.tensor([0, 3, 15, 7, 7]), torch.tensor([1, 2, 40, 4, 0])

    def run() -> tuple[torch.Tensor, ...]:
        kv = torch.zeros(2, 41, 2, 32, dtype=pool_dtype)
        rotated, residual = qkv.clone(), x.clone()
        ops.rope_write_kv(rotated, positions, cos, sin, kv, slots, 4)
        normed = ops.add_rms_norm(residual, delta, w, 1e-5)
        return (
            ops.rms_norm(x, w, 1e-5),
            normed,
            residual,
            ops.silu_mul(gate_up),
            rotated,
            kv.float(),
        )

    assert_same_bits(on_every_isa(runnable_isas, run))


@pytest.mark.parametrize("pool_dtype", [torch.float16, torch.bfloat16])
def test_the_pool_rounds_as_torch_does_on_every_isa(
    runnable_isas: list[str], pool_dtype: torch.dtype
) -> None:
    """K and V stored by the kernels are torch's own rounding of them (nearest even), on every
    path: normal values, ties, subnormal halves, past the half's range, signed zeros."""
    g = torch.Generator().manual_seed(11)
    values = torch.cat(
        (
            torch.randn(2000, generator=g) * torch.logspace(-9, 5, 2000),
            torch.tensor([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6, 6.1e-5, 5.96e-8]),
            torch.tensor([2.98e-8, 2.9802322e-08, 1.0009765625, 1.00146484375, 1 + 2**-11]),
        )
    )
    tokens = -(-values.numel() // (2 * 2 * 32))  # K and V of 2 heads of 32 per token
    padded = torch.zeros(tokens * 128)
    padded[: values.numel()] = values
    qkv = torch.cat((torch.zeros(tokens, 4 * 32), padded.view(tokens, 128)), dim=1)
    cos, sin = torch.ones(1, 32), torch.zeros(1, 32)  # no rotation: K as given

    def run() -> torch.Tensor:
        kv = torch.zeros(2, tokens + 1, 2, 32, dtype=pool_dtype)
        ops.rope_write_kv(qkv.clone(), torch.zeros(tokens, dtype=torch.int64), cos, sin, kv,
                          torch.arange(tokens), 4)  # fmt: skip
        return kv[:, :tokens].permute(1, 0, 2, 3).reshape(-1)

    for isa, stored in on_every_isa(runnable_isas, run).items():
        expected = padded.to(pool_dtype)
        assert torch.equal(stored.view(torch.int16), expected.view(torch.int16)), isa


def test_a_bad_slot_is_refused_not_read() -> None:
    kv, rect = pool_and_rect(torch.float32, seed=1)
    rect = rect.clone()
    rect[0, 2] = 41  # one past the sink
    q = torch.zeros(3, 4 * 32)
    with pytest.raises(RuntimeError, match="outside the K/V pool of 41 slots"):
        ops.paged_attention(q, kv, rect, None, torch.tensor([8, 1, 1]), 0.2, 4)
    qkv = torch.zeros(1, 8 * 32)
    with pytest.raises(RuntimeError, match="write slot is outside the K/V pool"):
        ops.rope_write_kv(
            qkv, torch.tensor([0]), torch.ones(4, 32), torch.ones(4, 32), kv, torch.tensor([-1]), 4
        )


def test_a_machine_without_a_compiler_gets_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOSERVE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(KernelBuildError, match=r"need a C\+\+ compiler; .*no-such-compiler"):
        cpu_kernels.build()


def test_a_compile_error_names_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "cxx"
    broken.write_text("#!/bin/sh\necho 'x.cpp:1:1: error: no such thing' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("NANOSERVE_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(broken))
    with pytest.raises(KernelBuildError, match=r"failed: x\.cpp:1:1: error: no such thing"):
        cpu_kernels.build()
    assert not list((tmp_path / "cache").rglob("*.so"))  # nothing half-built is left to load


@pytest.mark.parametrize("width", [1, 5, 16, 17, 4099])
def test_argmax_is_torchs_first_maximum_on_every_isa(runnable_isas: list[str], width: int) -> None:
    g = torch.Generator().manual_seed(width)
    x = torch.randn(7, width, generator=g)
    x[1] = 2.0  # ties everywhere: the first wins
    x[2, width // 2] = 1e30
    x[3, -1] = float("inf")
    x[4, width // 3] = float("nan")  # torch: the first NaN
    x[4, -1] = float("nan")
    x[5, -1] = float("-inf")
    x[6, : width - 1] = float("-inf")  # a row a grammar masked: one token left
    results = on_every_isa(runnable_isas, lambda: ops.argmax(x))
    for isa, picked in results.items():
        assert torch.equal(picked, x.argmax(-1)), isa


@pytest.mark.parametrize("vocab", [1, 31, 32, 70, 49152])
def test_bitmask_kernel_is_cores_masking(vocab: int) -> None:
    """Every word kind: all ones (skipped), all zeros (filled), mixed; and tokens past the mask."""
    load_cpu_kernels()
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=g)
    words = max(1, (vocab - 1) // 32)  # one word short where it can be: the tail is forbidden
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, words), dtype=torch.int32, generator=g)
    bitmask[0, ::2] = -1
    bitmask[1, ::3] = 0
    rows = torch.tensor([4, 0, 2])
    expected = logits.clone()
    apply_token_bitmask(expected, bitmask, rows)
    ops.apply_token_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, expected)


def windowed_reference(
    q: torch.Tensor,
    kv: torch.Tensor,
    rect: torch.Tensor,
    lens: torch.Tensor,
    window: int,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Float64 attention of each token over the last `window` of its context's slots (with
    `sinks`, each head's logit a column of the softmax that takes no value)."""
    heads, dim = 4, kv.shape[-1]
    out = torch.zeros(q.shape[0], heads * dim, dtype=torch.float64)
    for t, n in enumerate(lens.tolist()):
        slots = rect[t, max(0, n - window) : n]
        if not len(slots):
            continue
        k, v = kv[0, slots].double(), kv[1, slots].double()  # [n, kv_heads, dim]
        for h in range(heads):
            qh = q[t, h * dim : (h + 1) * dim].double()
            scores = (k[:, h // 2] @ qh) * 0.2
            if sinks is not None:
                scores = torch.cat((scores, sinks[h : h + 1].double()))
            weights = torch.softmax(scores, dim=0)[: len(slots)]
            out[t, h * dim : (h + 1) * dim] = weights @ v[:, h // 2]
    return out


def check_window(
    isas: list[str],
    q: torch.Tensor,
    kv: torch.Tensor,
    rect: torch.Tensor,
    lens: torch.Tensor,
    window: int,
) -> None:
    """The windowed kernel: the same bits on every ISA, and the float64 reference's values."""
    results = on_every_isa(
        isas, lambda: ops.paged_attention(q, kv, rect, None, lens, 0.2, 4, window)
    )
    assert_same_bits(results)
    got = results["portable"]
    assert isinstance(got, torch.Tensor)
    want = windowed_reference(q, kv, rect, lens, window)
    assert torch.allclose(got.double(), want, rtol=0, atol=2e-6), (got.double() - want).abs().max()


@pytest.mark.parametrize("window", [1, 3, 5, 8])
def test_a_sliding_window_sees_only_its_last_positions(
    runnable_isas: list[str], window: int
) -> None:
    """Gemma 3's local layers: a token attends to its last `window` positions, itself
    included; the same bits on every ISA, and a window as long as the context is no window."""
    kv, rect = pool_and_rect(torch.float32, seed=11)
    q = torch.randn(3, 4 * 32, generator=torch.Generator().manual_seed(12))
    lens = torch.tensor([8, 2, 6])
    check_window(runnable_isas, q, kv, rect, lens, window)
    unbounded = ops.paged_attention(q, kv, rect, None, lens, 0.2, 4)
    assert torch.equal(ops.paged_attention(q, kv, rect, None, lens, 0.2, 4, 8), unbounded)


def test_attention_sinks_weigh_in_the_denominator_and_take_no_value(
    runnable_isas: list[str],
) -> None:
    """gpt-oss's sinks, with and without a window: the same bits on every ISA, the float64
    reference's values, core's torch attention's too; a sink of -inf is no sink."""
    from nanoserve.core.attention import paged_decode_attention

    kv, rect = pool_and_rect(torch.float32, seed=21)
    q = torch.randn(3, 4 * 32, generator=torch.Generator().manual_seed(22))
    lens = torch.tensor([8, 2, 6])
    sinks = torch.tensor([0.5, -2.0, 3.0, 0.0])  # one far above the scores: most weight to none
    for window in (0, 3):

        def attend(w: int = window) -> torch.Tensor:
            return ops.paged_attention(q, kv, rect, None, lens, 0.2, 4, w, [], sinks)

        results = on_every_isa(runnable_isas, attend)
        assert_same_bits(results)
        got = results["portable"]
        assert isinstance(got, torch.Tensor)
        want = windowed_reference(q, kv, rect, lens, window or 8, sinks)
        assert torch.allclose(got.double(), want, rtol=0, atol=2e-6)
        k_pool, v_pool = kv[0], kv[1]
        core = paged_decode_attention(
            q.view(3, 4, 32), k_pool, v_pool, rect, lens, 0.2, torch.float32, window or None, sinks
        )
        assert torch.allclose(core.reshape(3, -1).double(), want, rtol=0, atol=2e-6)
    none = torch.full((4,), float("-inf"))
    plain = ops.paged_attention(q, kv, rect, None, lens, 0.2, 4)
    assert torch.equal(ops.paged_attention(q, kv, rect, None, lens, 0.2, 4, 0, [], none), plain)
    with pytest.raises(RuntimeError, match=r"sinks must be float32 \[4\]"):
        ops.paged_attention(q, kv, rect, None, lens, 0.2, 4, 0, [], sinks[:2])


def test_geglu_and_head_norms_agree_with_torch_on_every_isa(runnable_isas: list[str]) -> None:
    g = torch.Generator().manual_seed(13)
    gate_up = torch.randn(5, 96, generator=g) * 3
    qkv = torch.randn(5, (4 + 2 * 2) * 32, generator=g)
    q_weight, k_weight = torch.randn(32, generator=g), torch.randn(32, generator=g)

    def run() -> tuple[torch.Tensor, ...]:
        normed = qkv.clone()
        ops.head_rms_norm(normed, q_weight, k_weight, 4, 2, 1e-6)
        return ops.gelu_mul(gate_up), normed

    results = on_every_isa(runnable_isas, run)
    assert_same_bits(results)
    geglu, normed = results["portable"]
    gate, up = gate_up.double().chunk(2, dim=1)
    want = torch.nn.functional.gelu(gate, approximate="tanh") * up
    assert torch.allclose(geglu.double(), want, rtol=1e-6, atol=1e-6)
    heads = qkv.double().view(5, 8, 32)
    rms = heads.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt()
    weights = torch.stack([q_weight] * 4 + [k_weight] * 2).double()  # [6, 32]
    want_qk = (heads[:, :6] * rms[:, :6] * weights).reshape(5, -1)
    assert torch.allclose(normed[:, : 6 * 32].double(), want_qk, rtol=1e-5, atol=1e-5)
    assert torch.equal(normed[:, 6 * 32 :], qkv[:, 6 * 32 :])  # v is untouched


@pytest.mark.parametrize(("length", "window"), [(37, 20), (37, 16), (37, 3), (33, 17), (40, 39)])
def test_a_window_past_the_first_block_of_sixteen(
    runnable_isas: list[str], length: int, window: int
) -> None:
    """A window that starts past position 16 skips whole blocks of scores and zeroes part of
    the first block it reads."""
    g = torch.Generator().manual_seed(14)
    kv = torch.randn(2, 41, 2, 32, generator=g)
    kv[:, 40] = float("nan")
    rect = torch.randperm(40, generator=g)[None, :]  # [1, 40]
    q = torch.randn(1, 4 * 32, generator=g)
    lens = torch.tensor([length])
    check_window(runnable_isas, q, kv, rect, lens, window)

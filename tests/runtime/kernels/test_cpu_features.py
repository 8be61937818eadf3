"""CpuFeatures: what the CPU is read as, and what `--dtype auto` makes of it."""

from __future__ import annotations

import pytest

from nanoserve.runtime.kernels.cpu_features import (
    CpuFeatures,
    auto_dtype,
    cpu_features,
    parse_cpuinfo,
)

ZEN3 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2"
ZEN4 = ZEN3 + " avx512f avx512bw avx512vl avx512_vnni avx512_bf16"
SAPPHIRE_RAPIDS = ZEN4 + " amx_bf16 amx_tile amx_int8 avx512_fp16"

CPUINFO = f"""processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: {ZEN3}

processor\t: 1
model name\t: something else
flags\t\t: sse
"""


def test_parse_cpuinfo_reads_the_first_processor() -> None:
    model, flags = parse_cpuinfo(CPUINFO)
    assert model == "AMD EPYC 7B13 64-Core Processor"
    assert flags == frozenset(ZEN3.split())


def test_parse_cpuinfo_of_nothing() -> None:
    assert parse_cpuinfo("") == ("", frozenset())


@pytest.mark.parametrize(
    ("flags", "native", "dtype", "described"),
    [
        (ZEN3, False, "float32", "AVX2 (avx2 fma f16c)"),
        (ZEN4, True, "bfloat16", "AVX512 (avx2 fma f16c avx512f avx512_vnni avx512_bf16)"),
        (
            SAPPHIRE_RAPIDS,
            True,
            "bfloat16",
            "AVX512 (avx2 fma f16c avx512f avx512_vnni avx512_bf16 amx_bf16)",
        ),
        ("sse sse2", False, "float32", "DEFAULT"),
    ],
    ids=["zen3", "zen4", "sapphire-rapids", "baseline"],
)
def test_auto_dtype_is_bf16_only_where_native(
    flags: str, native: bool, dtype: str, described: str
) -> None:
    capability = described.split()[0]
    cpu = CpuFeatures("test", capability, frozenset(flags.split()))
    assert cpu.native_bf16 is native
    assert cpu.auto_dtype() == dtype
    assert cpu.describe() == described


def test_this_cpu_is_read_once() -> None:
    assert cpu_features() is cpu_features()
    assert auto_dtype("cpu") == cpu_features().auto_dtype()
    assert auto_dtype("cuda:0") == "bfloat16"

"""CpuFeatures: what this CPU can run, read once at start; the dtype `auto` resolves to.

Machines of one class differ: a Zen 4 has AVX-512 with native bf16 and VNNI, a Zen 3 only
AVX2. bf16 without hardware support is emulated and measured slower than fp32 at every batch
size (see FACTS), so `auto` picks bf16 only where the CPU has it natively (avx512_bf16 or
AMX), and fp32 elsewhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

# The flags that decide a kernel or a dtype, in the order they are reported.
_REPORTED = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    model: str  # "AMD EPYC ..." as /proc/cpuinfo names it; "" where unknown
    capability: str  # torch's dispatch level: "AVX512", "AVX2", "DEFAULT", ...
    flags: frozenset[str]

    @property
    def native_bf16(self) -> bool:
        return "avx512_bf16" in self.flags or "amx_bf16" in self.flags

    def auto_dtype(self) -> str:
        return "bfloat16" if self.native_bf16 else "float32"

    def describe(self) -> str:
        """One line for the boot line and /health: "AVX512 (avx2 fma ... avx512_bf16)"."""
        shown = " ".join(flag for flag in _REPORTED if flag in self.flags)
        return f"{self.capability} ({shown})" if shown else self.capability


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """The model name and flags of the first processor in a /proc/cpuinfo text."""
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return model, flags


@functools.cache
def cpu_features() -> CpuFeatures:
    try:
        model, flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text(encoding="utf-8"))
    except OSError:  # not Linux: torch's capability alone
        model, flags = "", frozenset()
    return CpuFeatures(model, torch.backends.cpu.get_cpu_capability(), flags)


def auto_dtype(device: str, kernel_form: bool = False) -> str:
    """What `--dtype auto` means on `device`: bf16 on a GPU; on a CPU, bf16 only where native —
    except under nanoserve's own kernels (q4, q8), which compute in float32 and only store
    bf16 (the K/V pool, the embedding table), a cheap shift on any ISA: bf16 there always."""
    if device.split(":")[0] == "cuda" or kernel_form:
        return "bfloat16"
    return cpu_features().auto_dtype()

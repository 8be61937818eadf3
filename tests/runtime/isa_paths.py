"""Running one computation on every kernel ISA path this CPU has (portable C++, AVX2, AVX-512
VNNI), and comparing the results bit for bit with the portable path's (shared by the kernel
tests; the `runnable_isas` fixture is conftest.py's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from nanoserve.runtime.kernels.cpu_kernels import ISAS, CpuKernels, load_cpu_kernels

T = TypeVar("T")


def runnable_isas() -> Iterator[list[str]]:
    """The paths this CPU runs, worst first; the best is restored after."""
    kernels = load_cpu_kernels()
    best = CpuKernels.best_isa()
    assert kernels.isa == best
    yield list(ISAS[: ISAS.index(best) + 1])
    CpuKernels.force_isa("auto")


def on_every_isa(isas: list[str], run: Callable[[], T]) -> dict[str, T]:
    results: dict[str, T] = {}
    for isa in isas:
        assert CpuKernels.force_isa(isa) == isa
        results[isa] = run()
    CpuKernels.force_isa("auto")
    return results


def assert_same_bits(results: Mapping[str, Any]) -> None:
    reference = results["portable"]
    for isa, result in results.items():
        pairs = (
            zip(reference, result, strict=True)
            if isinstance(result, tuple)
            else [(reference, result)]
        )
        for want, got in pairs:
            assert torch.equal(want, got), f"{isa} differs from portable"

"""Shared by the benchmarks: timing, medians, a printed table and a CSV per run."""

from __future__ import annotations

import csv
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def pin_threads(threads: int | None = None) -> int:
    """Benchmarks pin torch's thread count: two busy pools on two cores make timings jump."""
    import torch

    threads = threads or int(os.environ.get("NANOSERVE_BENCH_THREADS", "2"))
    torch.set_num_threads(threads)
    return threads


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def table(rows: Sequence[dict[str, object]], title: str) -> str:
    if not rows:
        return title
    columns = list(rows[0])
    cells = [[_fmt(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = [title, "  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def write_csv(name: str, rows: Sequence[dict[str, object]]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def nan_last(value: float) -> float:
    """A rate as a sort key: a level with no valid round (NaN) ranks below every measured one."""
    return -1.0 if value != value else value


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if 0 < abs(value) < 0.01:
            return f"{value:.3g}"
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def cpu_line() -> str:
    """The machine a figure was measured on: CPU model, torch's ISA level, the deciding flags,
    cores, and this moment's copy bandwidth (a 256 MiB copy, best of 3)."""
    import torch

    from nanoserve.runtime.kernels.cpu_features import cpu_features

    cpu = cpu_features()
    source = torch.ones(1 << 26)  # 256 MiB
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    gbs = 2 * source.numel() * 4 / best / 1e9
    return f"cpu: {cpu.model or '?'}; {cpu.describe()}; {os.cpu_count()} cores; copy {gbs:.1f} GB/s"

"""The GPU check's dry run: scripts/gpu_check.py on the CPU, at a reduced size, so its code path
does not rot between the rare runs on a lent GPU machine (README "Developing / the GPU check")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(tmp_path)}
    # --skip-tests: no pytest inside pytest; the smallest sizes that still stagger the arrivals.
    argv = ["--device", "cpu", "--skip-tests", "--layers", "1", "--requests", "4"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["failures"] == [], output
    assert report["environment"]["device"] == "cpu"

    tokens = report["correctness"]
    assert tokens["tokens"] > 0
    assert tokens["eager_equals_recorded"] and tokens["persistent_equals_recorded"]
    assert tokens["recordings_after_warmup"] == tokens["cold_recordings"] == 0
    assert tokens["replays"] > 0

    assert [row["rows"] for row in report["forward"]] == [1, 2, 4]
    assert all(row["eager_ms"] > 0 and row["replay_ms"] > 0 for row in report["forward"])
    assert [row["rows"] for row in report["step"]] == [1, 2, 4]
    assert report["default_warm"]["recorded"] > 0

    # Each CUDA-only part is skipped with one line that says so.
    skip_lines = [line for line in output.splitlines() if line.startswith("SKIP (no CUDA): ")]
    assert len(skip_lines) == len(report["skipped"]) == 5, skip_lines
    table = (tmp_path / "gpu-check.txt").read_text()
    assert "eager vs replay" in table and "RESULT: PASS" in table

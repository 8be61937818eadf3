"""The servers a benchmark starts on loopback, and what it reads off them afterwards.

nanoserve is started as `python -m nanoserve.api.cli serve`; llama.cpp's server by
`benchmarks.peer.start_llama_server`. Both log to a file (nobody reads a pipe while the load
runs, and a full one blocks), are polled on /health until ready, and are stopped by SIGTERM.
A benchmark passes both the same thread count (`bench_threads`), and prints what each holds
reserved beside its RSS: llama-server zero-fills its whole K/V cache at start, while
nanoserve's pool is a reservation paged in as sequences use it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True, slots=True)
class Server:
    """One running server: its process, address, time to ready and log."""

    who: str  # "nanoserve", "llama.cpp split", "llama.cpp unified", ...
    process: subprocess.Popen
    url: str
    ready_s: float
    log: Path

    def rss_mib(self) -> float:
        return rss_mib(self.process)

    def stop(self) -> None:
        stop(self.process)


def bench_threads() -> int:
    """The threads every server of a benchmark gets: $NANOSERVE_BENCH_THREADS, else the CPUs
    this process may run on (nanoserve's own default)."""
    from nanoserve.runtime.engine.config.engine_config import available_cpus

    return int(os.environ.get("NANOSERVE_BENCH_THREADS", 0)) or available_cpus()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(process: subprocess.Popen, url: str, what: str, timeout_s: float = 300) -> float:
    """Seconds from now until /health answers 200 (the caller started the process just before)."""
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    # One client for every poll: httpx.get builds a client (and its TLS context) per call, ~37 ms
    # of CPU each here, so polling every 50 ms took ~40% of a core from the booting server.
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(url + "/health").status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                raise SystemExit(f"{what} exited with {process.returncode}; see its log")
            time.sleep(0.05)
    process.kill()
    raise SystemExit(f"{what} did not become ready in {timeout_s:.0f} s")


def launch(who: str, command: list[str], url: str, env: dict[str, str] | None = None) -> Server:
    """Start `command`, logging to a file, and wait until `url`/health answers."""
    prefix = who.split()[0].replace(".", "") + "-"
    log = tempfile.NamedTemporaryFile("w+", prefix=prefix, suffix=".log", delete=False)  # noqa: SIM115 (the server holds it)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    print(f"{who} log: {log.name}", flush=True)
    return Server(who, process, url, wait_ready(process, url, who), Path(log.name))


def start_nanoserve(flags: list[str], threads: int) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "nanoserve.api.cli", "serve", "--port", str(port)]
    command += ["--threads", str(threads), *flags]
    return launch("nanoserve", command, f"http://127.0.0.1:{port}")


def nanoserve_reserved_mib(url: str) -> float:
    """What nanoserve's K/V pool reserves (its plan's bytes), and a hybrid's state pool: pages
    are resident only once sequences have written them, so RSS counts the part a workload
    touched."""
    health = httpx.get(url + "/health", timeout=10).json()
    state = health.get("state_pool") or {}
    return (health["kv_pool"]["total_bytes"] + state.get("state_total_bytes", 0)) / 2**20


def rss_mib(process: subprocess.Popen) -> float:
    """The process's resident set now (file pages it maps included, as for llama.cpp's mmap)."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(process: subprocess.Popen) -> float:
    """User + system CPU time of the process, all its threads, so far."""
    fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()

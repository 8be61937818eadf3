"""llama.cpp, the CPU peer, found and run beside nanoserve in the same benchmark run.

The prebuilt portable llama.cpp (`../shared/peers/llama.cpp`, or $NANOSERVE_LLAMACPP) loads the
best CPU backend the machine supports (`libggml-cpu-<variant>.so`). If that backend dies on
this machine (seen: the `sapphirerapids` AMX build raises SIGILL at its first `tilezero` on an
Intel Xeon with AMX under KVM), the peer is rerun from a copy of its folder without that
variant, so it loads its next best, and the variant it ran is reported either way. A missing
peer is one line and no result, never a failure: tests never need it.

The peer at its best: llama-server has two K/V cache modes for N slots, and which is faster
depends on the workload, so every side-by-side benchmark runs both (`CACHE_MODES`) and takes
each level's ratio against the better one:

- "split", its default with an explicit `-np N`: each slot owns `-c / N` tokens of the cache;
- "unified", `-np N -kvu`: one buffer of `-c` tokens that every slot's sequences share (its
  default only when `-np` is left to auto), whose attention masks over all of it.

Both are zero-filled at start, so what llama-server holds reserved (its K/V and compute buffers,
read off its log) is resident from the first second; `reserved_mib` reports it.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.servers import Server, free_port, launch

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO.parent / "shared" / "peers" / "llama.cpp"
_BACKEND = re.compile(r"loaded CPU backend from \S*libggml-cpu-([\w-]+)\.so")
CACHE_MODES = ("split", "unified")
# what llama-server allocates at start: K/V, compute, recurrent state, and its repacked weights
_BUFFER = re.compile(r"(KV|compute|RS|CPU_REPACK model) buffer size =\s*([\d.]+) MiB")


@dataclass(frozen=True, slots=True)
class Peer:
    folder: Path  # where the binaries it runs live (a trimmed copy, after a crashing backend)
    backend: str  # the CPU variant it loaded: "zen4", "haswell", ...
    note: str  # why a variant was skipped, or ""

    def binary(self, name: str) -> str:
        return str(self.folder / name)


def peer_folder() -> Path | None:
    folder = Path(os.environ.get("NANOSERVE_LLAMACPP", DEFAULT_DIR))
    return folder if (folder / "llama-bench").is_file() else None


def find_peer(gguf: Path) -> Peer | None:
    """The peer, probed on `gguf` with a tiny llama-bench run; None (and one line) if absent.

    $NANOSERVE_PEER_BACKEND (haswell, zen4, ...) keeps only that CPU backend, as nanoserve's
    NANOSERVE_KERNEL_ISA pins its path: an AVX2 machine's pair, measured here."""
    folder = peer_folder()
    if folder is None:
        print(
            f"llama.cpp peer not found (looked in {DEFAULT_DIR}; set NANOSERVE_LLAMACPP): skipped"
        )
        return None
    if pinned := os.environ.get("NANOSERVE_PEER_BACKEND"):
        others = [
            p.name.removeprefix("libggml-cpu-").removesuffix(".so")
            for p in folder.glob("libggml-cpu-*.so")
        ]
        folder = _without_variants(folder, [v for v in others if v != pinned])
    skipped: list[str] = []
    while True:
        probe = subprocess.run(
            [
                str(folder / "llama-bench"),
                "-m",
                str(gguf),
                "-t",
                "1",
                "-p",
                "8",
                "-n",
                "4",
                "-r",
                "1",
            ],
            capture_output=True,
            text=True,
        )
        match = _BACKEND.search(probe.stderr + probe.stdout)
        backend = match.group(1) if match else "?"
        if probe.returncode == 0:
            note = f"skipped {', '.join(skipped)} (SIGILL here)" if skipped else ""
            return Peer(folder, backend, note)
        if probe.returncode != -signal.SIGILL or backend == "?" or backend in skipped:
            print(f"llama.cpp peer failed (exit {probe.returncode}): {probe.stderr.strip()[-200:]}")
            return None
        skipped.append(backend)
        folder = _without_variants(folder, skipped)


def _without_variants(folder: Path, variants: list[str]) -> Path:
    """A copy of the peer's folder without the named backends (its libraries load from $ORIGIN,
    so the copy must be whole, not links)."""
    copy = Path(tempfile.mkdtemp(prefix="llamacpp-"))
    excluded = {f"libggml-cpu-{v}.so" for v in variants}
    for item in folder.iterdir():
        if item.name not in excluded and item.is_file():
            shutil.copy2(item, copy / item.name)
    return copy


def llama_bench(peer: Peer, gguf: Path, threads: int, repeats: int) -> dict[str, float]:
    """llama-bench's pp512 (prefill) and tg128 (single-stream decode) tok/s, averaged over
    `repeats` runs as llama-bench reports them."""
    out = subprocess.run(
        [
            peer.binary("llama-bench"),
            "-m",
            str(gguf),
            "-t",
            str(threads),
            "-p",
            "512",
            "-n",
            "128",
            "-r",
            str(repeats),
            "-o",
            "csv",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rates: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO(out)):
        rates["pp512" if row["n_prompt"] == "512" else "tg128"] = float(row["avg_ts"])
    return rates


def teacher_forced_top1(peer: Peer, gguf: Path, ids: list[int], threads: int) -> list[int]:
    """llama.cpp's greedy next token after every prefix of `ids` ([len(ids) - 1] token ids: entry
    i follows ids[: i + 1]), from its server with the prompt cached between requests, so each
    request computes one new position: its top-1 on the positions nanoserve is measured on."""
    import socket
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        peer.binary("llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-t", str(threads), "-tb", str(threads), "-c", str(len(ids) + 64), "-np", "1",
        "--no-webui",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("llama-server did not start for the accuracy run")
            time.sleep(0.2)
        picked = []
        with httpx.Client(base_url=url, timeout=120) as client:
            for end in range(1, len(ids)):
                body = {
                    "prompt": ids[:end],
                    "n_predict": 1,
                    "temperature": 0,
                    "cache_prompt": True,
                    "return_tokens": True,
                }
                reply = client.post("/completion", json=body).json()
                picked.append(int(reply["tokens"][0]))
        return picked
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def llama_server_command(
    peer: Peer,
    gguf: Path,
    threads: int,
    port: int,
    *,
    cache_mode: str,
    context: int,
    parallel: int = 32,
    extra: tuple[str, ...] = (),
) -> list[str]:
    if cache_mode not in CACHE_MODES:
        raise ValueError(f"cache_mode must be one of {CACHE_MODES}, got {cache_mode!r}")
    return [
        peer.binary("llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-t", str(threads), "-tb", str(threads), "-c", str(context), "-np", str(parallel),
        "--no-webui", "--metrics",
        *(["-kvu"] if cache_mode == "unified" else []),
        *extra,
    ]  # fmt: skip


def start_llama_server(
    peer: Peer,
    gguf: Path,
    threads: int,
    *,
    cache_mode: str,
    context: int,
    parallel: int = 32,
    extra: tuple[str, ...] = (),
) -> Server:
    """llama-server with `parallel` slots over a `context`-token cache in `cache_mode` ("split":
    `context / parallel` tokens a slot; "unified": `-kvu`, one buffer all slots share), the same
    thread count for prompts and decode, and its Prometheus counters on."""
    port = free_port()
    command = llama_server_command(
        peer, gguf, threads, port, cache_mode=cache_mode, context=context, parallel=parallel,
        extra=extra,
    )  # fmt: skip
    return launch(f"llama.cpp {cache_mode}", command, f"http://127.0.0.1:{port}")


def reserved_mib(
    peer: Peer,
    gguf: Path,
    threads: int,
    *,
    cache_mode: str,
    context: int,
    parallel: int = 32,
    extra: tuple[str, ...] = (),
) -> dict[str, float]:
    """What llama-server allocates at start in this configuration, by buffer ("KV", "compute",
    "RS"), in MiB, from its own log lines. Those lines are below its default verbosity, so a
    separate boot with `-lv 4` reads them (the measured servers keep the default verbosity)."""
    server = start_llama_server(
        peer, gguf, threads, cache_mode=cache_mode, context=context, parallel=parallel,
        extra=("-lv", "4", *extra),
    )  # fmt: skip
    server.stop()
    sums: dict[str, float] = {}
    for kind, mib in _BUFFER.findall(server.log.read_text(errors="replace")):
        sums[kind] = sums.get(kind, 0.0) + float(mib)
    return sums


def spec_counters(url: str) -> tuple[float, float]:
    """llama-server's draft tokens and accepted tokens so far (its /metrics, `--metrics`)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    values = []
    for name in ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens"):
        match = re.search(rf"^llamacpp:{name}_total (\S+)$", text, re.MULTILINE)
        values.append(float(match.group(1)) if match else 0.0)
    return values[0], values[1]

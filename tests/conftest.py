"""Shared pytest wiring. Only torch and pytest here: tests/core runs without runtime or api."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import torch

GPU_MACHINE_PACKAGES_FILE = Path(__file__).with_name("gpu_machine_packages.txt")


def gpu_machine_packages() -> frozenset[str]:
    """The import names of what the lent GPU machine has (tests/gpu_machine_packages.txt)."""
    lines = GPU_MACHINE_PACKAGES_FILE.read_text().splitlines()
    names = (line.split("#")[0].strip() for line in lines)
    return frozenset(n.lower().replace("-", "_") for n in names if n and not n.startswith("!"))


# A test module that cannot import for want of a package the GPU machine does not have is
# reported as skipped there, naming the package, rather than stopping the collection of
# `pytest -m gpu tests` (that machine has no package index). A package it has, nanoserve itself
# and tests/ still fail when missing: that is a broken install or a broken import. Where every
# test dependency is installed (`make test` sets NANOSERVE_TEST_DEPS=all), nothing is skipped
# for a missing package: a test silently skipped in CI is a test lost.
ALWAYS_THERE = gpu_machine_packages() | {"nanoserve", "tests"}
ALL_TEST_DEPS = os.environ.get("NANOSERVE_TEST_DEPS") == "all"


_FIGURES = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def figures(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """`figures(line)`: a measured figure (the soak's, the fuzzer's), printed in pytest's closing
    summary, so that CI's log shows it without `-s`."""
    lines = request.config.stash.setdefault(_FIGURES, [])
    return lines.append


def pytest_configure(config: pytest.Config) -> None:
    # Boots in this process time their steps afresh: a timing remembered by an earlier run (or
    # by the developer's own server) must not decide what a test sees, nor a test leave a file
    # in the developer's cache (servers in subprocesses: tests/api/conftest.py's clean_env).
    # tests/runtime/engine/timing/test_timing_cache.py covers the cache with folders of its own.
    os.environ["NANOSERVE_TIMING_CACHE"] = "off"
    # The same for the experts' packed files (tests/runtime/model/test_expert_arena.py gives
    # them folders of its own).
    os.environ["NANOSERVE_EXPERT_CACHE"] = "off"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(_FIGURES, [])
    if lines:
        terminalreporter.section("figures")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class _ModuleWithOptionalImports(pytest.Module):
    """A test module whose import may need a package this machine does not have."""

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        try:
            self.obj  # noqa: B018 - imports the module, as Module.collect would
        except pytest.Collector.CollectError as error:
            missing = error.__cause__
            if isinstance(missing, ModuleNotFoundError) and not ALL_TEST_DEPS:
                package = (missing.name or "").partition(".")[0]
                third_party = package not in sys.stdlib_module_names
                if package and third_party and package not in ALWAYS_THERE:
                    reason = f"{self.path.name} needs {package}, not installed here"
                    pytest.skip(reason, allow_module_level=True)
            raise
        return super().collect()


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module:
    return _ModuleWithOptionalImports.from_parent(parent, path=module_path)

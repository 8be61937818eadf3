"""Shared pytest wiring. Only torch and pytest here: tests/core runs without runtime or api."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import torch

# Packages the GPU machine lacks (it has no package index: FACTS.md, "The GPU machine"). A test
# module that cannot import for want of one of these is reported as skipped, naming the package,
# rather than failing the whole collection of `pytest -m gpu tests` there. Any other import
# error, and any of these missing from a module that imports them lazily, still fails.
OPTIONAL_PACKAGES = frozenset(
    {"gguf", "litestar", "msgspec", "uvicorn", "openai", "llguidance", "jsonschema"}
)


_FIGURES = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def figures(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """`figures(line)`: a measured figure (the soak's, the fuzzer's), printed in pytest's closing
    summary, so that CI's log shows it without `-s`."""
    lines = request.config.stash.setdefault(_FIGURES, [])
    return lines.append


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
            if isinstance(missing, ModuleNotFoundError):
                package = (missing.name or "").partition(".")[0]
                if package in OPTIONAL_PACKAGES:
                    reason = f"{self.path.name} needs {package}, not installed here"
                    pytest.skip(reason, allow_module_level=True)
            raise
        return super().collect()


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module:
    return _ModuleWithOptionalImports.from_parent(parent, path=module_path)

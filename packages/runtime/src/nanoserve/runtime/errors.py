"""Named errors for loading a model: each says which file and what is wrong with it.

Loaders raise these before anything is half-built, so a caller either gets a whole checkpoint or one
of these, never a model with some tensors missing. They all derive from `CheckpointError` (a
`NanoserveError` and a `ValueError`), so a server can turn any of them into one "cannot load this
model" answer.
"""

from __future__ import annotations

import os

from nanoserve.core.errors import NanoserveError


class CheckpointError(NanoserveError, ValueError):
    """A file (or directory) that cannot be used as a model, and why: `"{source}: {problem}"`."""

    def __init__(self, source: str | os.PathLike[str], problem: str) -> None:
        self.source = os.fspath(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")

    def __reduce__(self) -> tuple[type[CheckpointError], tuple[str, str]]:
        # Exceptions pickle as `cls(*self.args)`; our args are the formatted message, so say how to
        # rebuild from the two fields instead (errors cross process boundaries in a server).
        return (type(self), (self.source, self.problem))


class WeightsError(CheckpointError):
    """A weights file that is missing, truncated, or holds tensors the config does not imply."""


class ConfigError(CheckpointError):
    """A model config with a missing field, or a value that cannot describe a model."""


class UnsupportedModelError(CheckpointError):
    """A well-formed model of an architecture (or variant) that nanoserve does not run."""


class UnsupportedQuantError(CheckpointError):
    """A GGUF tensor stored in a quantization type nanoserve cannot dequantize."""


class TokenizerError(CheckpointError):
    """A tokenizer that cannot be built from the files or metadata given."""


class ChatTemplateError(CheckpointError):
    """A chat template that is missing, malformed, unsafe, or that refused the messages."""


class UnknownQuantizationError(NanoserveError, ValueError):
    """A quantize option that names no supported weight form."""


class KernelBuildError(NanoserveError, RuntimeError):
    """nanoserve's C++ CPU kernels could not be built or loaded on this machine."""


class QuantizationError(NanoserveError, ValueError):
    """A weight that cannot take the asked-for quantized form (its shape, or its device)."""


class EmbeddedModelMissing(NanoserveError, RuntimeError):
    """The package that ships the embedded model is not installed; the message says how to fix it."""

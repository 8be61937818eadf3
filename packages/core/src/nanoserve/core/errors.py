"""The base errors of nanoserve. Every error a user can meet is named and quotes its numbers."""

from __future__ import annotations


class NanoserveError(Exception):
    """Base of every error nanoserve raises on purpose."""


class GeometryError(NanoserveError, ValueError):
    """An impossible size, count or index: the message names the value and its limit."""


class FieldError(NanoserveError, ValueError):
    """A request field that cannot be served as sent: `field` names it (the API's `param`),
    the message is `"{field}: {problem}"`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class GateError(NanoserveError):
    """An invariant a gate checks did not hold. Each gate has its own subclass."""


def require_positive(**values: int) -> None:
    """Raise GeometryError naming the first value that is not a positive integer."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise GeometryError(f"{name} must be a positive integer, got {value!r}")

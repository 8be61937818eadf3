"""SpeculativeConfig: whether and how decoding rows propose tokens for the target to verify."""

from __future__ import annotations

import json
from dataclasses import dataclass

from nanoserve.core.errors import NanoserveError

METHODS = ("ngram",)


class SpeculativeConfigError(NanoserveError, ValueError):
    """A speculation setting is impossible; the message names it."""


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's names: `method` "ngram" is prompt lookup; a verify step checks at most
    `num_speculative_tokens` proposed tokens per row, each proposal the continuation of the
    row's last `prompt_lookup_max` .. `prompt_lookup_min` tokens where they occurred before."""

    method: str = "ngram"
    num_speculative_tokens: int = 8
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpeculativeConfigError(
                f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpeculativeConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise SpeculativeConfigError(
                f"prompt_lookup_min {self.prompt_lookup_min} exceeds"
                f" prompt_lookup_max {self.prompt_lookup_max}"
            )

    @classmethod
    def parse(cls, text: str) -> SpeculativeConfig | None:
        """'ngram', 'off', or vLLM's JSON: '{"method": "ngram", "num_speculative_tokens": 8,
        "prompt_lookup_max": 4, "prompt_lookup_min": 2}'."""
        stripped = str(text).strip()
        if stripped.lower() in ("", "off", "none"):
            return None
        if not stripped.startswith("{"):
            return cls(method=stripped.lower())
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise SpeculativeConfigError(f"speculative config is not JSON: {error}") from None
        if not isinstance(values, dict):
            raise SpeculativeConfigError("speculative config must be a JSON object")
        known = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SpeculativeConfigError(
                f"speculative config: unknown key(s) {', '.join(unknown)};"
                f" known: {', '.join(sorted(known))}"
            )
        return cls(**values)

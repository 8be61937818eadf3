"""SpeculativeConfig: whether and how decoding rows propose tokens for the target to verify."""

from __future__ import annotations

import json
from dataclasses import dataclass

from nanoserve.core.errors import NanoserveError

METHODS = ("ngram", "draft_model")
# A draft model's proposals cost a forward per token, so it proposes fewer than prompt lookup
DEFAULT_TOKENS = {"ngram": 8, "draft_model": 5}
KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


class SpeculativeConfigError(NanoserveError, ValueError):
    """A speculation setting is impossible; the message names it."""


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's names. `method` "ngram" is prompt lookup: each proposal is the continuation of
    the row's last `prompt_lookup_max` .. `prompt_lookup_min` tokens where they occurred before.
    "draft_model" proposes with `model` (a directory, a GGUF file or "embedded"), a smaller
    model with the target's tokenizer, greedily. A verify step checks at most
    `num_speculative_tokens` proposed tokens per row (default 8 by lookup, 5 by a draft)."""

    method: str = "ngram"
    num_speculative_tokens: int = DEFAULT_TOKENS["ngram"]
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    model: str | None = None

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
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            raise SpeculativeConfigError(
                'speculative method draft_model needs "model": a path to the draft'
            )
        if self.method == "ngram" and self.model is not None:
            raise SpeculativeConfigError(
                f"speculative method ngram takes no model (got {self.model!r});"
                ' use "method": "draft_model"'
            )

    @property
    def label(self) -> str:
        """As the boot line says it: ngram(k<=8), draft_model(k<=5)."""
        return f"{self.method}(k<={self.num_speculative_tokens})"

    @classmethod
    def parse(cls, text: str) -> SpeculativeConfig | None:
        """'ngram', 'off', or vLLM's JSON: '{"method": "ngram", "num_speculative_tokens": 8,
        "prompt_lookup_max": 4, "prompt_lookup_min": 2}' or '{"method": "draft_model",
        "model": "path/to/draft.gguf", "num_speculative_tokens": 5}' (a model alone implies
        draft_model, as in vLLM)."""
        stripped = str(text).strip()
        if stripped.lower() in ("", "off", "none"):
            return None
        if not stripped.startswith("{"):
            method = stripped.lower()
            return cls(method=method, num_speculative_tokens=DEFAULT_TOKENS.get(method, 1))
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise SpeculativeConfigError(f"speculative config is not JSON: {error}") from None
        if not isinstance(values, dict):
            raise SpeculativeConfigError("speculative config must be a JSON object")
        unknown = sorted(set(values) - set(KEYS))
        if unknown:
            raise SpeculativeConfigError(
                f"speculative config: unknown key(s) {', '.join(unknown)};"
                f" known: {', '.join(sorted(KEYS))}"
            )
        if "method" not in values and values.get("model") is not None:
            values["method"] = "draft_model"
        method = values.get("method", "ngram")
        values.setdefault("num_speculative_tokens", DEFAULT_TOKENS.get(method, 1))
        return cls(**values)

    @classmethod
    def draft(cls, model: str) -> SpeculativeConfig:
        """--draft-model's config: speculation by `model`, at the method's default k."""
        return cls(
            method="draft_model",
            model=model,
            num_speculative_tokens=DEFAULT_TOKENS["draft_model"],
        )

    def with_draft_model(self, path: str) -> SpeculativeConfig:
        """This config given --draft-model's path too: the same draft, or a contradiction."""
        if self.method != "draft_model" or self.model != path:
            raise SpeculativeConfigError(
                f"--draft-model {path} contradicts --speculative-config's"
                f" {self.method}{'' if self.model is None else ' ' + self.model}"
            )
        return self

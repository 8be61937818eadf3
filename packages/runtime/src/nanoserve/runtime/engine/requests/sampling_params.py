"""SamplingParams: what a request asks of the sampler, validated once at the door."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nanoserve.core.errors import FieldError
from nanoserve.runtime.structured.grammar_spec import GrammarSpec

MAX_TOP_LOGPROBS = 20
MAX_N = 64  # samples per request (and best_of, the API's)
MAX_LOGIT_BIAS = 300  # entries, as OpenAI bounds it: the sampler scatters them every step
# A request's n samples seed their generators with seed + index (index < 64), and torch's
# generators take 64 bits: seeds in [SEED_MIN, SEED_END).
SEED_MIN, SEED_END = -(2**63), 2**63 - 64


class SamplingParamsError(FieldError):
    """A sampling field is out of range; `field` names it (the API maps it to `param`)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 is greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: Sequence[str] = ()  # a list or tuple of strings, never one bare string
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    # decode the answer without its special tokens (False: a format whose marks are special
    # tokens, gpt-oss's harmony and Gemma 4's channels, is read from the text)
    skip_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    logprobs: int | None = None  # None: none; 0: the chosen token's; k: and the top k
    n: int = 1
    grammar: GrammarSpec | None = None  # constrain the output (structured outputs, tool calls)

    def __post_init__(self) -> None:
        self.validate()  # and nothing else: the fields are what the caller gave

    def validate(self) -> None:
        def bad(name: str, message: str) -> SamplingParamsError:
            return SamplingParamsError(name, f"{message}, got {getattr(self, name)!r}")

        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise bad("max_tokens", "must be an integer >= 1")
        if not _in_range(self.temperature, 0.0, 2.0):
            raise bad("temperature", "must be in [0, 2]")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise bad("top_k", "must be -1, 0 (off) or a positive integer")
        if not _in_range(self.min_p, 0.0, 1.0):
            raise bad("min_p", "must be in [0, 1]")
        if self.seed is not None and (
            not _is_int(self.seed) or not SEED_MIN <= self.seed < SEED_END
        ):
            raise bad("seed", "must be an integer that fits in 64 bits")
        if not _in_range(self.presence_penalty, -2.0, 2.0):
            raise bad("presence_penalty", "must be in [-2, 2]")
        if not _in_range(self.frequency_penalty, -2.0, 2.0):
            raise bad("frequency_penalty", "must be in [-2, 2]")
        if not _is_number(self.repetition_penalty) or not 0.0 < self.repetition_penalty <= 2.0:
            raise bad("repetition_penalty", "must be in (0, 2]")
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            raise bad("logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}]")
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise bad("n", f"must be an integer in [1, {MAX_N}]")
        if isinstance(self.stop, str) or not isinstance(self.stop, list | tuple):
            raise bad("stop", "must be a list of strings (one string: a list of one)")
        if not isinstance(self.stop_token_ids, list | tuple):
            raise bad("stop_token_ids", "must be a list of token ids")
        if any(not isinstance(s, str) or not s for s in self.stop) or len(self.stop) > 16:
            raise bad("stop", "must be up to 16 non-empty strings")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be non-negative integers")
        if self.grammar is not None and not isinstance(self.grammar, GrammarSpec):
            raise bad("grammar", "must be a GrammarSpec")
        if not isinstance(self.logit_bias, Mapping):
            raise bad("logit_bias", "must map token ids to biases")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise SamplingParamsError(
                "logit_bias",
                f"at most {MAX_LOGIT_BIAS} entries, got {len(self.logit_bias)}",
            )
        for token, bias in self.logit_bias.items():
            if not _is_int(token) or token < 0 or not _in_range(bias, -100.0, 100.0):
                raise SamplingParamsError(
                    "logit_bias", f"token {token!r} bias {bias!r}: tokens >= 0, bias in [-100, 100]"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids named by the request must exist in the model's vocabulary."""
        for token in (*self.logit_bias, *self.stop_token_ids):
            if token >= vocab_size:
                raise SamplingParamsError(
                    "logit_bias" if token in self.logit_bias else "stop_token_ids",
                    f"token {token} is outside the vocabulary of {vocab_size}",
                )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _in_range(value: object, low: float, high: float) -> bool:
    """A real number in [low, high]; NaN, strings and None are not."""
    return _is_number(value) and low <= value <= high  # type: ignore[operator]

"""PrefillBudget: how many prompt tokens a step may carry while sequences decode.

A prompt chunk shares its step with the decoding rows, so every decoding sequence waits for it:
on a CPU a 512-token chunk of a 0.5B model takes ~0.6 s against a ~60 ms decode step, and each
stream's next token comes ten steps late. The budget keeps a mixed step within `ratio` of the
decode step alone. With a decode step of `rows` rows costing `base + per_row * rows` seconds and
one prompt token `per_token`, a step may carry

    tokens(rows) = floor((ratio - 1) * (base + per_row * rows) / per_token)

prompt tokens, clamped to [min_tokens, max_tokens - rows] (min_tokens so that prompts advance
however short the decode step). With no sequence decoding, nothing waits: the whole step budget.
The three costs are measured at boot (runtime's engine/prefill_timing.py), or the budget is a
fixed count (`fixed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve.core.errors import NanoserveError


class PrefillBudgetError(NanoserveError, ValueError):
    """Costs or bounds that cannot make a budget."""


@dataclass(frozen=True, slots=True)
class PrefillBudget:
    max_tokens: int  # a step's whole token budget (decode rows and prompt tokens)
    base_s: float = 0.0  # a decode step's cost at zero rows (the weights streamed once)
    per_row_s: float = 0.0  # and per row
    per_token_s: float = 0.0  # one prompt token in a chunk; 0: a fixed count, `min_tokens`
    ratio: float = 1.5  # a mixed step's bound, as a multiple of the decode step alone
    min_tokens: int = 16

    def __post_init__(self) -> None:
        check_prefill_budget(self)

    @classmethod
    def fixed(cls, tokens: int, max_tokens: int) -> PrefillBudget:
        """At most `tokens` prompt tokens per step while sequences decode, whatever the costs."""
        return cls(max_tokens=max_tokens, min_tokens=tokens)

    @classmethod
    def from_timings(
        cls,
        *,
        max_tokens: int,
        one_row_s: float,
        rows: int,
        rows_s: float,
        tokens: int,
        tokens_s: float,
        ratio: float = 1.5,
        min_tokens: int = 16,
    ) -> PrefillBudget:
        """From a decode step of 1 row, one of `rows` rows, and a chunk of `tokens` tokens."""
        per_row = max(0.0, (rows_s - one_row_s) / (rows - 1)) if rows > 1 else 0.0
        return cls(
            max_tokens=max_tokens,
            base_s=max(0.0, one_row_s - per_row),
            per_row_s=per_row,
            per_token_s=tokens_s / tokens,
            ratio=ratio,
            min_tokens=min_tokens,
        )

    def decode_step_s(self, rows: int) -> float:
        return self.base_s + self.per_row_s * rows

    def tokens(self, decode_rows: int) -> int:
        """Prompt tokens a step with `decode_rows` decoding rows may carry."""
        room = self.max_tokens - decode_rows
        if decode_rows == 0:
            return room
        if self.per_token_s == 0.0:
            return max(0, min(room, self.min_tokens))
        allowed = int((self.ratio - 1) * self.decode_step_s(decode_rows) / self.per_token_s)
        return max(0, min(room, max(self.min_tokens, allowed)))

    def as_dict(self) -> dict[str, float | int]:
        return {
            "max_tokens": self.max_tokens,
            "decode_base_ms": round(self.base_s * 1e3, 3),
            "decode_per_row_ms": round(self.per_row_s * 1e3, 3),
            "prompt_token_ms": round(self.per_token_s * 1e3, 4),
            "ratio": self.ratio,
            "min_tokens": self.min_tokens,
            "tokens_at_1_row": self.tokens(1),
        }


def check_prefill_budget(budget: PrefillBudget) -> None:
    costs = (budget.base_s, budget.per_row_s, budget.per_token_s)
    if budget.max_tokens < 1 or budget.min_tokens < 1:
        raise PrefillBudgetError(
            f"a prefill budget needs max_tokens >= 1 and min_tokens >= 1,"
            f" got {budget.max_tokens} and {budget.min_tokens}"
        )
    if any(c < 0 or c != c for c in costs) or budget.ratio < 1:
        raise PrefillBudgetError(
            f"costs must be >= 0 and the ratio >= 1, got base {budget.base_s} s, per row"
            f" {budget.per_row_s} s, per token {budget.per_token_s} s, ratio {budget.ratio}"
        )

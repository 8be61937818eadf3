"""PrefillBudget: how many prompt tokens a step may carry while sequences decode.

A prompt chunk shares its step with the decoding rows, so every decoding sequence waits for it:
on a CPU a 512-token chunk of a 0.5B model takes ~0.6 s against a ~50 ms decode step, and each
stream's next token comes ten steps late. With a decode step of `rows` rows costing
`base + per_row * rows` seconds and one prompt token adding `per_token` to a step, two rules
bound a step:

- steady: the step stays within `ratio` of the decode step alone,
      ratio_tokens(rows) = (ratio - 1) * decode(rows) / per_token;
- backlog: prompts waiting (`waiting` tokens of `joining` sequences, a burst of arrivals) are
  worked off within `horizon` steps, but a step's prompts take no more than `burst - 1` decode
  steps of every sequence then running (at most `max_rows`), however many of them decode now,
      burst_tokens(rows) = (burst - 1) * decode(min(rows + joining, max_rows)) / per_token,
  so no step grows past `burst` times that decode step.

A step carries max(ratio_tokens, min(waiting / horizon, burst_tokens)) prompt tokens, at least
`min_tokens` (prompts always advance), at most what the step's token budget leaves. The steady
rule alone cannot keep up with a burst: it gives prompts a third of the machine at ratio 1.5,
and 32 arrivals at once would wait for tens of seconds. With no sequence decoding, a step takes
every waiting prompt if they fit the step budget (none of them is then held up by the rest
later), or one prompt alone as far as the step budget goes, and else is bounded by the burst
rule: its prompts start decoding the sooner (32 prompts in chunks of ~3 reach their first
tokens ~1.4 s sooner on average than in chunks of 8), and their sequences then finish, and
their clients' next requests arrive, spread out rather than all at once.

The backlog's share does not grow as fewer rows decode. A burst from idle is then admitted at
the rate the machine keeps once those sequences decode: their clients' next requests come back
as fast as the first ones were admitted, and an idle machine that took prompts into the room
its few decoding rows left would send them back faster than a full one can take them (32
streams of a 0.5B, two requests each: the second requests' TTFT p50 0.95-1.0 s with the share
that grew, 0.67 s with this one; a step's length, so ITL p99, bounded as before).

The costs are measured at boot (runtime's engine/timing/step_timing.py), or the budget is a fixed
count (`fixed`).
"""

from __future__ import annotations

import math
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
    ratio: float = 1.5  # steady: a mixed step within this multiple of the decode step alone
    min_tokens: int = 16
    max_rows: int = 1  # the widest decode step (the scheduler's row limit)
    burst: float = 3.0  # backlog: no step past this multiple of the decode step to come
    horizon: int = 1  # backlog: steps to work a burst off in

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
        **rules: float,
    ) -> PrefillBudget:
        """From a decode step of 1 row, one of `rows` rows (the row limit), and a chunk of
        `tokens` tokens; `rules` set ratio, min_tokens, burst and horizon."""
        per_row = max(0.0, (rows_s - one_row_s) / (rows - 1)) if rows > 1 else 0.0
        # A prompt token's price is what it adds to a step: the chunk's cost less what one
        # row's step costs too (the weights' reads, the output projection of its last token),
        # which a mixed step pays once for its decoding rows. The chunk's mean (tokens_s /
        # tokens) priced a 0.5B's token at 2.18 ms against the 1.57 ms it adds to a 32-row
        # step. Half the mean at least: a noisy one-row timing cannot make prompts free.
        mean = tokens_s / tokens
        per_token = (tokens_s - one_row_s) / (tokens - 1) if tokens > 1 else mean
        return cls(
            max_tokens=max_tokens,
            base_s=max(0.0, one_row_s - per_row),
            per_row_s=per_row,
            per_token_s=max(per_token, mean / 2),
            max_rows=rows,
            **rules,  # type: ignore[arg-type]
        )

    def decode_step_s(self, rows: int) -> float:
        return self.base_s + self.per_row_s * rows

    def ratio_tokens(self, rows: int) -> int:
        return _whole((self.ratio - 1) * self.decode_step_s(rows) / self.per_token_s)

    def burst_tokens(self, rows: int, joining: int = 0) -> int:
        """A backlog's prompt tokens in a step of `rows` decoding rows: `burst - 1` decode steps
        of every sequence then running (`joining` more, at most `max_rows`)."""
        after = min(self.max_rows, max(rows + joining, 1))
        return _whole((self.burst - 1) * self.decode_step_s(after) / self.per_token_s)

    def tokens(self, decode_rows: int, waiting: int = 0, joining: int = 0) -> int:
        """Prompt tokens a step with `decode_rows` decoding rows may carry, with `waiting`
        prompt tokens not yet computed, of `joining` sequences (queued, or chunked prompts)."""
        room = self.max_tokens - decode_rows
        if self.per_token_s == 0.0:  # a fixed count
            return room if decode_rows == 0 else max(0, min(room, self.min_tokens))
        cap = self.burst_tokens(decode_rows, joining)
        if decode_rows == 0:
            # Nothing waits on this step. If every waiting prompt fits, all of them at once
            # (no decoding stream is held up by this burst later), as for one prompt alone
            # (nobody else is there). Else the burst rule.
            if waiting <= room or joining <= 1:
                return room
            return max(0, min(room, max(self.min_tokens, cap)))
        allowed = max(self.min_tokens, self.ratio_tokens(decode_rows))
        allowed = max(allowed, min(math.ceil(waiting / self.horizon), cap))
        return max(0, min(room, allowed))

    def as_dict(self) -> dict[str, float | int]:
        return {
            "max_tokens": self.max_tokens,
            "decode_base_ms": round(self.base_s * 1e3, 3),
            "decode_per_row_ms": round(self.per_row_s * 1e3, 3),
            "prompt_token_ms": round(self.per_token_s * 1e3, 4),
            "ratio": self.ratio,
            "min_tokens": self.min_tokens,
            "max_rows": self.max_rows,
            "burst": self.burst,
            "horizon": self.horizon,
            "tokens_at_1_row": self.tokens(1),
            "tokens_at_max_rows": self.tokens(self.max_rows),
        }


def _whole(tokens: float) -> int:
    """Whole tokens, not one fewer for a quotient that float arithmetic left at 221.99999."""
    return math.floor(tokens + 1e-6)


def check_prefill_budget(budget: PrefillBudget) -> None:
    costs = (budget.base_s, budget.per_row_s, budget.per_token_s)
    counts = (budget.max_tokens, budget.min_tokens, budget.max_rows, budget.horizon)
    if min(counts) < 1:
        raise PrefillBudgetError(
            "a prefill budget needs max_tokens, min_tokens, max_rows and horizon >= 1, got"
            f" {budget.max_tokens}, {budget.min_tokens}, {budget.max_rows}, {budget.horizon}"
        )
    if any(c < 0 or c != c for c in costs) or budget.ratio < 1 or budget.burst < 1:
        raise PrefillBudgetError(
            f"costs must be >= 0 and the ratios >= 1, got base {budget.base_s} s, per row"
            f" {budget.per_row_s} s, per token {budget.per_token_s} s, ratio {budget.ratio},"
            f" burst {budget.burst}"
        )

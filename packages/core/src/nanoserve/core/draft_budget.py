"""DraftBudget: how many draft tokens each decoding row verifies this step, if any.

A verify row feeds its last token and k proposed ones; the target's tokens are compared with
the proposal, and the row keeps the matching prefix plus one token of the target's own. If each
proposed token is accepted with probability `alpha` once the ones before it were, the j-th
draft token adds alpha**j expected tokens, and costs `per_draft_s` more step time, plus
`propose_s` to propose where proposing is work (a draft model's forward; prompt lookup's is
free). A step of R
decoding rows costs `base_s + per_row_s * R`; any draft at all turns it from a decode step into
a verify step, which costs `switch_s` more (another attention kernel, a host plan per chunk).

The step's rate is tokens per second. A draft token is taken when it raises that rate, best
first, so a row's drafts are always a prefix of its proposal. On one row the decode step is
dominated by streaming the weights (base_s), so a few tokens more are almost free and a
proposal accepted a third of the time already pays. With 32 rows the step is already
weight-efficient: its rate, R / (base_s + per_row_s * R), is close to 1 / per_row_s, and a
draft token, whose expected worth is below 1 token, pays only when it is much cheaper than a
row. So speculation backs off under load by the same arithmetic that turns it on alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from nanoserve.core.errors import NanoserveError

MARGIN = 0.05  # what a draft must beat the plain step's rate by


class DraftBudgetError(NanoserveError, ValueError):
    """Costs or counts that cannot price a draft."""


@dataclass(frozen=True, slots=True)
class DraftCost:
    """A step's cost in seconds, measured at boot (runtime's engine/timing/draft_timing.py)."""

    base_s: float  # a decode step at zero rows: the weights read once
    per_row_s: float  # each decoding row
    switch_s: float  # a verify step's extra cost over a decode step of the same rows
    per_draft_s: float  # each draft token verified
    propose_s: float = 0.0  # each draft token proposed (a draft model's forward per token)

    def __post_init__(self) -> None:
        for name in ("base_s", "per_row_s", "switch_s", "per_draft_s", "propose_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise DraftBudgetError(
                    f"{name} must be a finite number of seconds >= 0, got {value}"
                )
        if self.base_s + self.per_row_s <= 0:
            raise DraftBudgetError("a decode step of one row must cost some time")

    def decode_s(self, rows: int) -> float:
        return self.base_s + self.per_row_s * rows

    @property
    def token_s(self) -> float:
        """What one draft token adds to a step: its proposal and its verify."""
        return self.per_draft_s + self.propose_s


@dataclass(frozen=True, slots=True)
class Acceptance:
    """One sequence's record of its proposals: each proposed token it examined is a trial, and
    a trial succeeds when the target's token matched. A verify of k tokens that accepted a made
    a trials that succeeded, and one more that failed unless a == k. The estimate starts at the
    prior's rate and forgets old trials by `decay` per verify, so a request whose text turns
    from quoting to free writing stops proposing within a few steps."""

    accepted: float = 1.0  # the prior: one success in two trials
    trials: float = 2.0

    @property
    def rate(self) -> float:
        return self.accepted / self.trials

    def after(self, proposed: int, accepted: int, decay: float = 0.8) -> Acceptance:
        if not 0 <= accepted <= proposed:
            raise DraftBudgetError(f"accepted {accepted} of {proposed} proposed tokens")
        trials = accepted + (1 if accepted < proposed else 0)
        return Acceptance(self.accepted * decay + accepted, self.trials * decay + trials)

    def toward_prior(self, weight: float = 0.95, prior: Acceptance | None = None) -> Acceptance:
        """A step in which this sequence had a proposal and verified none: its estimate drifts
        back to the prior's (default: one success in two), so a sequence that stopped
        proposing tries again later."""
        prior = prior or Acceptance()
        return Acceptance(
            self.accepted * weight + prior.accepted * (1 - weight),
            self.trials * weight + prior.trials * (1 - weight),
        )


@dataclass(frozen=True, slots=True)
class DraftCandidate:
    seq_id: int
    rate: float  # its acceptance estimate
    longest: int  # the most tokens it may verify (its proposal, max_tokens and the context)


def plan_drafts(
    cost: DraftCost,
    rows: int,
    candidates: Sequence[DraftCandidate],
    max_tokens: int,
    margin: float = MARGIN,
) -> dict[int, int]:
    """Draft tokens per seq_id (absent: none) for a step of `rows` decoding rows, at most
    `max_tokens` in all (what the step's token budget leaves). A draft token is taken when
    the tokens it adds per second of step it costs beat the step's rate by `margin`, and the
    drafts at all when the step's rate beats the plain decode step's by `margin`: the prices
    and the acceptance are estimates, and near break-even their noise decides."""
    if rows < 1:
        raise DraftBudgetError(f"a step with drafts has decoding rows, got {rows}")
    plain_s = cost.decode_s(rows)
    tokens, seconds = float(rows), plain_s + cost.switch_s
    marginal = sorted(
        (
            (candidate.rate**j, -j, candidate.seq_id)
            for candidate in candidates
            for j in range(1, candidate.longest + 1)
        ),
        reverse=True,
    )
    chosen: dict[int, int] = {}
    for gain, _, seq_id in marginal[: max(0, max_tokens)]:
        if gain * seconds <= (1 + margin) * tokens * cost.token_s:  # gain/cost vs rate
            break
        tokens += gain
        seconds += cost.token_s
        chosen[seq_id] = chosen.get(seq_id, 0) + 1
    if tokens / seconds <= (1 + margin) * rows / plain_s:  # the verify step does not pay
        return {}
    return chosen


def expected_tokens(rate: float, drafts: int) -> float:
    """Tokens a verify of `drafts` tokens emits on average: 1 + rate + ... + rate**drafts."""
    return sum(rate**j for j in range(drafts + 1))

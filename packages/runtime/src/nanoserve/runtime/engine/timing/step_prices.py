"""StepPrices: what the engine's own steps say a decode step and a draft token cost.

The boot's timing (draft_timing.py) prices tokens that see almost no context, and a forward
alone. A served token reads its whole context's K/V in every layer, and a step also samples, so
at a few hundred tokens of context a row costs 1.5x what the boot saw, and drafts priced at the
boot's figures are taken where they lose. So the prices follow the steps:

- a decode step of r rows: a line, base + per_row * r, fitted by exponentially weighted least
  squares to the decode steps run (each step's weight decays by DECAY per later step), with the
  boot's line at 1 and `max_rows` rows as two light pseudo-steps, so that steps of one row count
  alone still leave it a slope. A step's time is clipped to twice the line's before it counts:
  a shared machine's stolen time comes in bursts that say nothing of the next step;
- a draft token, by row bucket (1, 2, 3-4, 5-8, ...: at one row a step streams the weights and a
  few tokens more hide in it, with 32 the step is arithmetic and a draft token costs a row): what
  a verify step took beyond the decode step of its rows (and the boot's switch), per draft
  token, moved into the bucket's price by SMOOTHING, from a start at the boot's draft token or
  row, the dearer. While no verify runs, each bucket drifts back towards that start, so a price
  that rose under load is tried again once the load is gone;
- a proposed token (a draft model's; prompt lookup's cost nothing), by the bucket of the rows
  drafting: the proposer's seconds over the tokens it proposed, moved in by SMOOTHING from the
  boot's draft-model forward of one row, and drifting back to it like the draft token's. Only a
  proposal in the steady state counts: one that first caught the draft up on a prompt is a
  request's one-off cost, not a token's.
"""

from __future__ import annotations

from nanoserve.core.draft_budget import DraftCost

DECAY = 0.95  # a decode step's weight in the line, per later decode step
PRIOR_WEIGHT = 0.5  # each of the boot's two pseudo-steps
SMOOTHING = 0.25  # a verify step's weight in its bucket's draft price
DRIFT = 0.01  # per decode step, each draft price's pull back towards the start


def row_bucket(rows: int) -> int:
    """The power of two at or above rows."""
    return 1 << max(0, rows - 1).bit_length()


class StepPrices:
    def __init__(self, boot: DraftCost, max_rows: int) -> None:
        self.boot = boot
        self.prior_draft_s = max(boot.per_draft_s, boot.per_row_s)
        self._prior = [(1.0, boot.decode_s(1)), (float(max(2, max_rows)), boot.decode_s(max_rows))]
        self._sums = [0.0] * 5  # decayed sums of w, w*r, w*r*r, w*t, w*r*t over decode steps
        self._draft_s: dict[int, float] = {}  # by row bucket
        self._propose_s: dict[int, float] = {}  # by the bucket of the step's decoding rows

    def decode_s(self, rows: int) -> float:
        base, per_row = self.line()
        return base + per_row * rows

    def line(self) -> tuple[float, float]:
        """(base, per_row) of the decode step, in seconds."""
        w, wr, wrr, wt, wrt = self._sums
        for r, t in self._prior:
            w, wr, wrr, wt, wrt = (
                w + PRIOR_WEIGHT,
                wr + PRIOR_WEIGHT * r,
                wrr + PRIOR_WEIGHT * r * r,
                wt + PRIOR_WEIGHT * t,
                wrt + PRIOR_WEIGHT * r * t,
            )
        spread = wrr * w - wr * wr
        per_row = max(0.0, (wrt * w - wr * wt) / spread)  # the priors' two points: spread > 0
        return max(0.0, (wt - per_row * wr) / w), per_row

    def draft_s(self, rows: int) -> float:
        return self._draft_s.get(row_bucket(rows), self.prior_draft_s)

    def propose_s(self, rows: int) -> float:
        return self._propose_s.get(row_bucket(rows), self.boot.propose_s)

    def cost(self, rows: int) -> DraftCost:
        """The cost a step of `rows` decoding rows plans its drafts at."""
        return DraftCost(
            base_s=max(self.decode_s(rows), 1e-9),
            per_row_s=0.0,
            switch_s=self.boot.switch_s,
            per_draft_s=self.draft_s(rows),
            propose_s=self.propose_s(rows),
        )

    def observe_proposal(self, rows: int, tokens: int, seconds: float) -> None:
        """A proposer took `seconds` for `tokens` tokens in a step of `rows` decoding rows."""
        if rows < 1 or tokens < 1:
            return
        key = row_bucket(rows)
        old = self._propose_s.get(key, self.boot.propose_s)
        sample = seconds / tokens if not old else min(seconds / tokens, 4 * old)
        self._propose_s[key] = old + SMOOTHING * (sample - old) if old else sample

    def observe(self, rows: int, drafts: int, seconds: float) -> None:
        """A decode step of `rows` rows, with `drafts` draft tokens (a verify step) or none,
        took `seconds` from its forward to its sampled tokens."""
        if rows < 1:
            return
        if drafts:
            sample = max(0.0, seconds - self.decode_s(rows) - self.boot.switch_s) / drafts
            key = row_bucket(rows)
            old = self._draft_s.get(key, self.prior_draft_s)
            self._draft_s[key] = old + SMOOTHING * (min(sample, 4 * old) - old)
            return
        t = min(seconds, 2 * self.decode_s(rows))
        r = float(rows)
        self._sums = [DECAY * s for s in self._sums]
        for i, value in enumerate((1.0, r, r * r, t, r * t)):
            self._sums[i] += value
        for key, price in self._draft_s.items():
            self._draft_s[key] = price + DRIFT * (self.prior_draft_s - price)
        for key, price in self._propose_s.items():
            self._propose_s[key] = price + DRIFT * (self.boot.propose_s - price)

    def as_dict(self) -> dict[str, object]:
        base, per_row = self.line()
        return {
            "decode_base_s": base,
            "decode_per_row_s": per_row,
            "draft_s": self._draft_s,
            "propose_s": self._propose_s,
        }

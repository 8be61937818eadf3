"""Speculator: the proposals of a step's decoding rows, and what became of them.

Proposals come from a Proposer: prompt lookup (ngram_index.PromptLookup), free, so each row's
proposal is found first and priced after; or a draft model (draft_model.DraftModel), k
forwards for k tokens, so the rows are priced first and the draft proposes what they take.
Which rows verify how many tokens is `plan_drafts`, with each sequence's acceptance record.

The price is the boot's timing at first, then what the engine's own steps say (StepPrices).
Counters feed /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from nanoserve.core import KVPoolPlan, PrefillBudget
from nanoserve.core.draft_budget import Acceptance, DraftCandidate, DraftCost, plan_drafts
from nanoserve.runtime.engine.config.engine_config import ResolvedConfig
from nanoserve.runtime.engine.config.speculative_config import (
    SpeculativeConfig,
    SpeculativeConfigError,
)
from nanoserve.runtime.engine.speculation.draft_model import DraftModel
from nanoserve.runtime.engine.speculation.ngram_index import PromptLookup
from nanoserve.runtime.engine.step.scheduler import SchedulerOutput
from nanoserve.runtime.engine.step.sequence import Sequence
from nanoserve.runtime.engine.timing.draft_timing import measure_draft_cost
from nanoserve.runtime.engine.timing.step_prices import StepPrices
from nanoserve.runtime.model.llama import LlamaModel


class Proposer(Protocol):
    """Where proposals come from. `propose` gives each (sequence, count) at most count tokens
    (or none); `forget` drops a finished sequence's state; `check_blocks` checks what K/V it
    holds (none left when idle)."""

    @property
    def priced_first(self) -> bool: ...  # True: proposing costs work; price, then propose

    @property
    def steady(self) -> bool: ...  # the last proposal's time was a token's, no catching up

    @property
    def prior(self) -> Acceptance: ...  # where a request's acceptance record starts

    def propose(self, wants: Seq[tuple[Sequence, int]]) -> dict[int, tuple[int, ...]]: ...

    def forget(self, seq_id: int) -> None: ...

    def check_blocks(self, idle: bool) -> None: ...

    def describe(self) -> str: ...


@dataclass(slots=True)
class SpecStats:
    """vLLM's spec_decode counters: drafts (verify rows), their tokens, the accepted ones, and
    accepted tokens by position within a draft."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    verify_steps: int = 0  # steps that carried a draft (they run eagerly: never recorded)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass(frozen=True, slots=True)
class SpecCounts:
    """A snapshot of a Speculator, as /health and /metrics read it."""

    method: str
    proposer: str  # what proposes: the n-grams, or the draft model and its pool
    num_speculative_tokens: int
    cost: DraftCost  # what the boot measured
    prices: dict[str, object]  # what the steps say: the decode step's line, draft_s by bucket
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]
    verify_steps: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate}


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        cost: DraftCost,
        max_model_len: int,
        max_rows: int = 32,
        proposer: Proposer | None = None,
    ) -> None:
        """proposer: None is prompt lookup by config's n-gram sizes."""
        self.config = config
        self.proposer: Proposer = proposer or PromptLookup(
            config.prompt_lookup_min, config.prompt_lookup_max
        )
        self.cost = cost  # the boot's measurement
        self.calibrate = True  # follow the steps' times (off: price at `cost`, as tests do)
        self.prices = StepPrices(cost, max_rows)
        self.max_model_len = max_model_len
        self.stats = SpecStats(accepted_per_position=[0] * config.num_speculative_tokens)
        self._acceptance: dict[int, Acceptance] = {}

    def drafts(self, rows: Seq[Sequence], budget: int) -> dict[int, tuple[int, ...]]:
        """Draft tokens for some of `rows` (the step's decoding rows), at most `budget` in all."""
        if budget < 1 or not rows:
            return {}
        wants = []
        for seq in rows:
            room = min(
                self.config.num_speculative_tokens,
                seq.params.max_tokens - len(seq.output_ids) - 1,  # the target adds one more
                self.max_model_len - seq.num_tokens,
            )
            if room >= 1:
                wants.append((seq, room))
        free = not self.proposer.priced_first
        proposals = self.proposer.propose(wants) if free else {}
        candidates = [
            DraftCandidate(seq.seq_id, self._record(seq.seq_id).rate, longest)
            for seq, room in wants
            if (longest := len(proposals.get(seq.seq_id, ())) if free else room)
        ]
        if not candidates:
            return {}
        chosen = plan_drafts(self.priced(len(rows)), len(rows), candidates, budget)
        for candidate in candidates:
            if candidate.seq_id not in chosen:
                self._acceptance[candidate.seq_id] = self._record(candidate.seq_id).toward_prior(
                    prior=self.proposer.prior
                )
        if free:
            return {seq_id: proposals[seq_id][:count] for seq_id, count in chosen.items()}
        started = time.perf_counter()
        proposals = self.proposer.propose(
            [(seq, chosen[seq.seq_id]) for seq, _ in wants if seq.seq_id in chosen]
        )
        if self.calibrate and self.proposer.steady:
            spent = time.perf_counter() - started
            # Priced by the step's decoding rows, as plan_drafts looks the price up
            self.prices.observe_proposal(len(rows), sum(chosen.values()), spent)
        return proposals

    def reset_counters(self) -> None:
        self.stats = SpecStats(accepted_per_position=[0] * self.config.num_speculative_tokens)

    def counts(self) -> SpecCounts:
        stats = self.stats
        return SpecCounts(
            method=self.config.method,
            proposer=self.proposer.describe(),
            num_speculative_tokens=self.config.num_speculative_tokens,
            cost=self.cost,
            prices=self.prices.as_dict(),
            drafts=stats.drafts,
            draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens,
            accepted_per_position=tuple(stats.accepted_per_position),
            verify_steps=stats.verify_steps,
        )

    def priced(self, rows: int) -> DraftCost:
        """The cost a step of `rows` decoding rows plans its drafts at."""
        return self.prices.cost(rows) if self.calibrate else self.cost

    def observe_time(self, out: SchedulerOutput, seconds: float) -> None:
        """A step took `seconds` from its forward to its sampled tokens. Only decode and verify
        steps price a token: a prompt chunk's tokens cost less than a row's (no sampling)."""
        if not self.calibrate or any(
            len(i.chunk.token_ids) > 1 + len(i.draft) for i in out.scheduled
        ):
            return
        drafts = sum(len(item.draft) for item in out.scheduled)
        self.prices.observe(len(out.scheduled), drafts, seconds)

    def observe_step(self, accepted: dict[int, int], proposed: dict[int, int]) -> None:
        """A verify step's outcome: per verify row's seq_id, its accepted draft tokens."""
        self.stats.verify_steps += 1
        for seq_id, count in accepted.items():
            self.observe(seq_id, proposed[seq_id], count)

    def observe(self, seq_id: int, proposed: int, accepted: int) -> None:
        self._acceptance[seq_id] = self._record(seq_id).after(proposed, accepted)
        stats = self.stats
        stats.drafts += 1
        stats.draft_tokens += proposed
        stats.accepted_tokens += accepted
        for position in range(accepted):
            stats.accepted_per_position[position] += 1

    def forget(self, seq_id: int) -> None:
        """The sequence finished: its proposer state and its record go with it."""
        self.proposer.forget(seq_id)
        self._acceptance.pop(seq_id, None)

    def check_blocks(self, idle: bool) -> None:
        self.proposer.check_blocks(idle)

    def _record(self, seq_id: int) -> Acceptance:
        return self._acceptance.get(seq_id) or self.proposer.prior


def build_speculator(
    model: LlamaModel,
    config: ResolvedConfig,
    budget: PrefillBudget | None,
    pool_plan: KVPoolPlan,
    draft: LlamaModel | None = None,
) -> Speculator | None:
    """The config's speculation, priced on this model (None: speculation is off). A draft
    model's pool holds the target pool's positions and each row's draft."""
    spec = config.speculative
    if spec is None:
        return None
    for role, each in (("model", model), ("draft model", draft)):
        if each is not None and each.config.state_shapes:
            raise SpeculativeConfigError(
                f"speculative decoding is not built for {each.config.architecture}'s recurrent"
                f" state (the {role}'s): a rejected draft token would stay in it; serve it"
                " without speculation"
            )
    if (spec.method == "draft_model") != (draft is not None):
        raise SpeculativeConfigError(
            f"speculative method {spec.method} "
            + ("needs a draft model" if draft is None else "takes no draft model")
        )
    cost = measure_draft_cost(
        model,
        drafts=spec.num_speculative_tokens,
        max_batch=config.max_batch,
        budget=budget,
        draft=draft,
    )
    proposer = None
    if draft is not None:
        proposer = DraftModel.with_pool(
            draft,
            slots=pool_plan.num_slots + config.max_batch * spec.num_speculative_tokens,
            block_size=pool_plan.block_size,
            max_len=config.max_model_len,
            vocab=model.config.vocab_size,
            name=Path(spec.model or "draft").name,
            catch_up=config.max_num_batched_tokens,
        )
        # Resident now, as the target's pool is after the warm-up: memory it cannot have
        # fails the boot, not the first request that drafts
        proposer.pool.touch()
    return Speculator(spec, cost, config.max_model_len, config.max_batch, proposer)

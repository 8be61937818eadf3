"""Verification: a step's logits rows, grouped back into the sequences that sample from them.

A verify row (speculation) has one logits row per position: its last token's, then each draft
token's. Row j is sampled as if the draft's first j tokens had been generated, with the same
penalties and the same generator, so its token is the one the target would pick there. The row
keeps the draft's longest prefix that matches the target's tokens, then the target's token
after it. Under greedy decoding that is the output without speculation, token for token: the
logits of a position do not depend on the batch or on how many positions a step feeds.

Under sampling, a draft is a proposal fixed by the context (a point mass q on one token d); the
rejection rule accepts d with probability min(1, p(d) / q(d)) = p(d) and otherwise draws from
max(0, p - q) renormalised, which is p without d. Drawing t ~ p and accepting when t == d does
exactly that: P(accept) = p(d), and a rejected t is p conditioned on t != d. A seeded
sequence's generator is rewound to its state after the last kept token's draw, so it draws
each position's noise once, as without speculation, and gives the same tokens too.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from nanoserve.runtime.engine.step.sampler import SampleResult, SampleRow
from nanoserve.runtime.engine.step.scheduler import ScheduledSeq
from nanoserve.runtime.engine.step.sequence import Sequence


@dataclass(frozen=True, slots=True)
class RowGroup:
    """One sampling sequence of a step and where its rows start in the step's logits."""

    seq: Sequence
    draft: tuple[int, ...]
    first: int

    @property
    def rows(self) -> range:
        return range(self.first, self.first + 1 + len(self.draft))


def group_rows(seqs: Seq[Sequence], scheduled: Seq[ScheduledSeq]) -> list[RowGroup]:
    """The sampling rows of a step, in the order of its logits."""
    groups, first = [], 0
    for seq, item in zip(seqs, scheduled, strict=True):
        if item.samples:
            groups.append(RowGroup(seq, item.draft, first))
            first += 1 + len(item.draft)
    return groups


def sample_rows(groups: Seq[RowGroup]) -> list[SampleRow]:
    rows = []
    for group in groups:
        seq = group.seq
        for j in range(len(group.draft) + 1):
            output = seq.output_ids if j == 0 else [*seq.output_ids, *group.draft[:j]]
            rows.append(
                SampleRow(
                    seq.params,
                    seq.prompt_ids,
                    output,
                    seq.generator,
                    keep_state=bool(group.draft) and seq.generator is not None,
                )
            )
    return rows


def accepted_drafts(groups: Seq[RowGroup], tokens: Seq[int]) -> dict[int, int]:
    """Per verify row's seq_id: how many of its draft tokens the target's tokens match."""
    return {
        g.seq.seq_id: accepted_count(g.draft, tokens[g.first : g.rows.stop])
        for g in groups
        if g.draft
    }


def append_kept(group: RowGroup, result: SampleResult, kept: int) -> int:
    """Append a group's tokens to its sequence: its `kept` draft tokens, then the target's
    next, stopping where the sequence finishes (a stop can fall inside the draft). A seeded
    generator is rewound to its state after the last kept row's draw. Returns how many."""
    seq, appended = group.seq, 0
    for row in group.rows[: kept + 1]:
        logprob = result.logprobs[row] if result.logprobs is not None else None
        top = tuple(result.top_logprobs[row]) if result.top_logprobs is not None else None
        seq.append(result.token_ids[row], logprob, top)
        appended += 1
        if seq.finished:
            break
    states = result.generator_states
    state = states[group.first + kept] if group.draft and states is not None else None
    if state is not None and seq.generator is not None:
        seq.generator.set_state(state)
    return appended


def accepted_count(draft: Seq[int], targets: Seq[int]) -> int:
    """How many of draft's tokens the target's tokens (one per position) match, from the first."""
    count = 0
    for proposed, target in zip(draft, targets, strict=False):
        if proposed != target:
            break
        count += 1
    return count

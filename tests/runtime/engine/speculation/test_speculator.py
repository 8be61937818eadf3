"""Speculator: proposals by prompt lookup, bounded by each sequence's room, and priced."""

from __future__ import annotations

import itertools

import pytest

from nanoserve.core import BlockTable
from nanoserve.core.draft_budget import Acceptance, DraftCost
from nanoserve.runtime.engine.config.speculative_config import SpeculativeConfig
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.speculation.speculator import Speculator
from nanoserve.runtime.engine.step.sequence import Sequence
from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.text.tokenizer import IncrementalDetokenizer

CONFIG = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=3)
CHEAP = DraftCost(base_s=0.020, per_row_s=0.001, switch_s=0.0, per_draft_s=0.001)


@pytest.fixture
def make_seq(tiny_llama_checkpoint: Checkpoint):
    ids = itertools.count()

    def make(prompt: list[int], output: list[int], max_tokens: int = 50) -> Sequence:
        seq = Sequence(
            seq_id=next(ids),
            request_id="r",
            index=0,
            prompt_ids=prompt,
            params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
            block_table=BlockTable(4),
            detokenizer=IncrementalDetokenizer(tiny_llama_checkpoint.tokenizer),
            eos_token_ids=frozenset({2}),
        )
        seq.output_ids = output
        return seq

    return make


def speculator(cost: DraftCost = CHEAP, max_model_len: int = 128) -> Speculator:
    spec = Speculator(CONFIG, cost, max_model_len)
    spec.calibrate = False  # priced at `cost`
    return spec


def test_a_quoting_row_proposes_what_followed(make_seq) -> None:
    seq = make_seq([10, 11, 12, 13, 14, 15, 16, 10, 11], [12])
    # 1 row: 21 ms; the 4th token, worth 1/16 of one, would lower the rate
    assert speculator().drafts([seq], budget=64) == {seq.seq_id: (13, 14, 15)}


def test_a_proposal_stops_at_max_tokens_and_the_context(make_seq) -> None:
    near_the_end = make_seq([10, 11, 12, 13, 14, 15, 16, 10, 11], [12], max_tokens=3)
    assert speculator().drafts([near_the_end], 64) == {near_the_end.seq_id: (13,)}  # 1 + 1 + 1
    last = make_seq([10, 11, 12, 13, 14, 15, 16, 10, 11], [12], max_tokens=2)
    assert speculator().drafts([last], 64) == {}  # its next token is its last
    short = make_seq([10, 11, 12, 13, 14, 15, 16, 10, 11], [12])
    assert speculator(max_model_len=12).drafts([short], 64) == {short.seq_id: (13, 14)}


def test_nothing_to_look_up_proposes_nothing(make_seq) -> None:
    assert speculator().drafts([make_seq([10, 11, 12, 13], [14])], 64) == {}


def test_a_full_step_backs_off(make_seq) -> None:
    rows = [make_seq([10, 11, 12, 13, 10, 11], [12]) for _ in range(32)]
    assert speculator().drafts(rows, 64) == {}  # 32 rows / 52 ms beat a coin-flip draft


def test_rejections_stop_a_row_proposing_and_are_counted(make_seq) -> None:
    seq = make_seq([10, 11, 12, 13, 14, 15, 16, 10, 11], [12])
    spec = speculator(DraftCost(base_s=0.020, per_row_s=0.001, switch_s=0.0, per_draft_s=0.008))
    assert spec.drafts([seq], 64) == {seq.seq_id: (13,)}  # a coin flip pays for one token
    spec.observe_step({seq.seq_id: 0}, {seq.seq_id: 1})
    spec.observe_step({seq.seq_id: 0}, {seq.seq_id: 1})
    assert spec.drafts([seq], 64) == {}
    spec.observe_step({seq.seq_id: 1}, {seq.seq_id: 2})
    counts = spec.counts()
    assert (counts.drafts, counts.draft_tokens, counts.accepted_tokens) == (3, 4, 1)
    assert counts.accepted_per_position == (1, 0, 0, 0)
    assert counts.verify_steps == 3
    spec.forget(seq.seq_id)
    assert spec.drafts([seq], 64) == {seq.seq_id: (13,)}  # a fresh record


class Scripted:
    """A proposer that costs work (priced first), proposing 20, 21, ... as asked."""

    priced_first = True
    prior = Acceptance(4.0, 5.0)  # a draft model's

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []
        self.steady = True

    def propose(self, wants) -> dict[int, tuple[int, ...]]:
        self.asked += [(seq.seq_id, count) for seq, count in wants]
        return {seq.seq_id: tuple(range(20, 20 + count)) for seq, count in wants}

    def forget(self, seq_id: int) -> None:
        pass

    def check_blocks(self, idle: bool) -> None:
        pass

    def describe(self) -> str:
        return "scripted"


def test_a_draft_model_is_priced_before_it_proposes_from_a_trusting_prior(make_seq) -> None:
    config = SpeculativeConfig(method="draft_model", model="d", num_speculative_tokens=4)
    # decode 21 ms at one row; a draft token 1 ms to verify, 5 ms to propose
    cost = DraftCost(
        base_s=0.020, per_row_s=0.001, switch_s=0.0, per_draft_s=0.001, propose_s=0.005
    )
    proposer = Scripted()
    spec = Speculator(config, cost, 128, proposer=proposer)
    spec.calibrate = False
    seq = make_seq([10, 11, 12], [13])
    # the prior 4 in 5: 0.8 * 21 ms > 1.05 * 6 ms, ...; a fourth, 0.8^4 * 39 ms < 1.05 * 2.95 * 6
    assert spec.drafts([seq], 64) == {seq.seq_id: (20, 21, 22)}
    assert proposer.asked == [(seq.seq_id, 3)]  # asked for what the price took, no more
    for _ in range(6):
        spec.observe_step({seq.seq_id: 0}, {seq.seq_id: 3})  # rejected at once, six times
    assert spec.drafts([seq], 64) == {}
    assert proposer.asked == [(seq.seq_id, 3)]  # and not asked at all

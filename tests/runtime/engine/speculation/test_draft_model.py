"""DraftModel: greedy proposals on its own K/V pool, kept across steps, and speculation by it
through the engine, greedy tokens and logprobs unchanged bit for bit in every weight form.

A twin draft (the target itself, in its weight form) agrees with the target on every greedy
token, since the kernels give a position the same bits in a chunk and in a decode step, so its
drafts are all accepted; a noisy draft (the fp32 weights perturbed) is often rejected, at every
position. Drafts are free here (FREE), so every row drafts what it can.
"""

# ruff: noqa: F811 (the form-parametrized fixtures come from test_speculation.py)
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import tokenizers
import torch

from nanoserve.core import PrefillChunk, plan_prefill
from nanoserve.core.blocks import BlockTable, ConservationError
from nanoserve.core.draft_budget import DraftCost
from nanoserve.runtime.engine.config.speculative_config import SpeculativeConfig
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.speculation.draft_model import (
    DraftModel,
    DraftVocabularyError,
    check_draft_vocabulary,
)
from nanoserve.runtime.engine.step.sequence import Sequence
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.text.tokenizer import Tokenizer
from tests.runtime.capture_helpers import speculator_of
from tests.runtime.engine.speculation.test_speculation import (  # noqa: F401 (the form-parametrized fixtures)
    FREE,
    WORKLOAD,
    alone,
    form,
    make_tiny_engine,
    random_config,
    seeded,
    tiny_engine_builder,
)
from tests.runtime.engine.test_engine import VOCAB, Request, serve

pytestmark = pytest.mark.usefixtures("single_torch_thread")

DRAFT = SpeculativeConfig.draft("tiny-draft")


def tiny_model(checkpoint, weights: dict[str, torch.Tensor], noise: float = 0.0) -> LlamaModel:
    """The tiny Llama in fp32; with noise, each weight plus that much of its own spread."""
    generator = torch.Generator().manual_seed(5)
    if noise:
        weights = {
            name: w + noise * w.float().std() * torch.randn(w.shape, generator=generator)
            if w.dim() > 1
            else w
            for name, w in weights.items()
        }
    return LlamaModel.from_tensors(
        checkpoint.config, weights.items(), batch_invariant=True, max_positions=128
    )


@pytest.fixture(scope="module")
def fp32(tiny_llama_checkpoint, tiny_llama_weights) -> LlamaModel:
    return tiny_model(tiny_llama_checkpoint, tiny_llama_weights)


@pytest.fixture(scope="module")
def twin(form, request) -> LlamaModel:
    """The target itself, in its weight form: a draft that agrees on every greedy token."""
    ck, weights = (
        ("tiny_mixed_checkpoint", "tiny_mixed_sources")
        if form.get("mixed")
        else ("tiny_llama_checkpoint", "tiny_llama_weights")
    )
    return LlamaModel.from_tensors(
        request.getfixturevalue(ck).config,
        request.getfixturevalue(weights).items(),
        dtype=form["dtype"],
        batch_invariant=True,
        max_positions=128,
        quantize=form["quantize"],
    )


@pytest.fixture(scope="module")
def noisy(tiny_llama_checkpoint, tiny_llama_weights) -> LlamaModel:
    return tiny_model(tiny_llama_checkpoint, tiny_llama_weights, noise=0.6)


@dataclass
class _Seq:
    """What a proposer reads of a sequence."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)

    def token_ids(self) -> list[int]:
        return list(self.tokens)


def seq(seq_id: int, tokens: list[int]) -> Sequence:
    """A stand-in for an engine's sequence, as a proposer reads one."""
    return cast(Sequence, _Seq(seq_id, tokens))


def draft_of(
    model: LlamaModel, blocks: int = 64, vocab: int = VOCAB, catch_up: int = 512
) -> DraftModel:
    return DraftModel.with_pool(
        model,
        slots=4 * blocks,
        block_size=4,
        max_len=128,
        vocab=vocab,
        name="twin",
        catch_up=catch_up,
    )


def greedy_by_whole_forwards(model: LlamaModel, tokens: list[int], count: int) -> list[int]:
    """The reference: each next token from a forward over the whole sequence, no cache kept."""
    out = []
    for _ in range(count):
        pool = draft_of(model).pool
        table = BlockTable(4, range(-(-len(tokens) // 4)))
        plan = plan_prefill(
            [PrefillChunk(0, tuple(tokens), 0, table)], sink_slot=pool.plan.sink_slot
        )
        token = int(model.forward(plan, pool.view(plan.seq_ids)).argmax(dim=-1))
        out.append(token)
        tokens = [*tokens, token]
    return out


PROMPT = [5, 17, 33, 9, 250, 41, 7]


def test_proposals_are_the_drafts_greedy_continuation(fp32) -> None:
    draft = draft_of(fp32)
    proposal = draft.propose([(seq(0, PROMPT), 5)])
    assert proposal == {0: tuple(greedy_by_whole_forwards(fp32, PROMPT, 5))}
    assert draft._fed[0] == PROMPT + list(proposal[0][:4])  # the last proposed: no K/V yet


def test_a_rejected_tail_is_recomputed_and_the_kept_prefix_is_not(fp32) -> None:
    draft = draft_of(fp32)
    first = draft.propose([(seq(0, PROMPT), 4)])[0]
    wrong = (first[2] + 1) % VOCAB
    grown = PROMPT + list(first[:2]) + [wrong]  # two accepted, then the target's own token
    again = draft.propose([(seq(0, grown), 3)])
    assert again == {0: tuple(greedy_by_whole_forwards(fp32, grown, 3))}
    assert again == draft_of(fp32).propose([(seq(0, grown), 3)])  # as a fresh draft says


def test_a_short_pool_frees_idle_states_least_recent_first_then_skips(fp32) -> None:
    draft = draft_of(fp32, blocks=6)  # 24 slots
    draft.propose([(seq(0, PROMPT), 2)])  # 8 positions: 2 blocks
    draft.propose([(seq(1, PROMPT), 2)])
    draft.propose([(seq(2, PROMPT), 2)])
    assert list(draft._tables) == [0, 1, 2] and draft.allocator.num_free == 0
    long = seq(3, PROMPT * 2)  # 14 tokens + 2: 4 blocks; sequences 0 and 1 give theirs
    assert 3 in draft.propose([(long, 3)])
    assert list(draft._tables) == [2, 3]
    draft.check_blocks(idle=False)
    too_long = seq(4, PROMPT * 4)  # 28 positions: more than the pool, even emptied
    assert draft.propose([(too_long, 1), (seq(2, PROMPT), 1)]).keys() == {2}
    assert list(draft._tables) == [3, 2]  # 3's state kept: freeing it would not have made room
    draft.check_blocks(idle=False)


def test_forget_and_the_block_check(fp32) -> None:
    draft = draft_of(fp32)
    draft.propose([(seq(0, PROMPT), 3), (seq(1, PROMPT[:3]), 2)])
    with pytest.raises(ConservationError, match="while idle"):
        draft.check_blocks(idle=True)
    draft.forget(0)
    draft.forget(1)
    draft.check_blocks(idle=True)
    draft.allocator.allocate(1)  # a block no table holds
    with pytest.raises(ConservationError, match="tables hold 0 blocks, 1 are used"):
        draft.check_blocks(idle=False)


def test_context_and_vocabulary_cut_proposals(fp32) -> None:
    draft = draft_of(fp32)
    assert draft.propose([(seq(0, [1] * 129), 3)]) == {}  # past the draft's 128 positions
    assert len(draft.propose([(seq(1, [1] * 126), 5)])[1]) == 3  # positions 126, 127 fed
    proposal = draft_of(fp32).propose([(seq(0, PROMPT), 5)])[0]
    narrow = draft_of(fp32, vocab=max(proposal))  # the largest proposed id lies outside it
    assert narrow.propose([(seq(0, PROMPT), 5)]) == (
        {0: proposal[: proposal.index(max(proposal))]} if max(proposal) != proposal[0] else {}
    )


def test_a_long_catch_up_is_fed_over_steps_shortest_first(fp32) -> None:
    """A step's catch-ups feed at most `catch_up` tokens, the shortest first; a row still
    catching up proposes nothing, and proposes what a fresh draft would once current."""
    draft = draft_of(fp32, catch_up=8)
    prompt = [3 + i % 200 for i in range(20)]
    short = seq(1, PROMPT[:3])
    assert draft.propose([(seq(0, prompt), 3), (short, 2)]).keys() == {1}  # 3 fed, then 5
    assert draft._fed[0] == prompt[:5] and not draft.steady
    assert draft.propose([(seq(0, prompt), 3)]) == {}
    assert draft._fed[0] == prompt[:13]
    proposal = draft.propose([(seq(0, prompt), 3)])  # the last 7 tokens
    assert proposal == {0: tuple(greedy_by_whole_forwards(fp32, prompt, 3))}
    draft.check_blocks(idle=False)


def test_a_token_past_the_drafts_embedding_gets_no_proposal(fp32) -> None:
    """A target may have more embedding rows than its draft: such a token is never fed."""
    draft = draft_of(fp32, vocab=VOCAB + 8)
    assert draft.rows == VOCAB
    assert draft.propose([(seq(0, [*PROMPT, VOCAB + 3]), 3)]) == {}
    assert draft._tables == {} and not draft.steady
    assert draft.propose([(seq(1, PROMPT), 3)]).keys() == {1}
    draft.check_blocks(idle=False)


def word_level(*tokens: str) -> Tokenizer:
    vocab = {token: i for i, token in enumerate(tokens)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=tokens[0]))
    return Tokenizer(backend, eos_token_ids=[0], bos_token_id=None)


def test_a_draft_with_another_vocabulary_is_refused_in_one_line(tiny_mixed_checkpoint) -> None:
    check_draft_vocabulary(tiny_mixed_checkpoint.tokenizer, tiny_mixed_checkpoint.tokenizer, "a")
    target = word_level("<unk>", "a", "b", "c")
    check_draft_vocabulary(target, word_level("<unk>", "a", "b", "c"), "same.gguf")
    with pytest.raises(DraftVocabularyError) as refused:
        check_draft_vocabulary(target, word_level("<unk>", "a", "b"), "small.gguf")
    assert str(refused.value) == (
        "draft model small.gguf has a vocabulary of 3 tokens, the target 4:"
        " a draft must share the target's tokenizer"
    )
    with pytest.raises(DraftVocabularyError) as refused:
        check_draft_vocabulary(target, word_level("<unk>", "a", "c", "b"), "swapped.gguf")
    assert str(refused.value) == (
        "draft model swapped.gguf: token 'b' is id 3 in its vocabulary and 2 in the target's:"
        " a draft must share the target's tokenizer"
    )


# -- through the engine ------------------------------------------------------------------------


def drafting(make: Callable[..., Engine], draft: LlamaModel, **config: Any) -> Engine:
    engine = make(speculative=DRAFT, draft=draft, **config)
    assert engine.speculator is not None and isinstance(speculator_of(engine).proposer, DraftModel)
    speculator_of(engine).cost = FREE
    speculator_of(engine).calibrate = False
    return engine


def test_a_twin_draft_matches_alone(make_tiny_engine, twin, alone) -> None:
    engine = drafting(make_tiny_engine, twin)
    proposer = speculator_of(engine).proposer
    assert isinstance(proposer, DraftModel)
    assert proposer.pool.resident  # allocated at boot, not on a first draft
    run = serve(engine, WORKLOAD)
    assert run.trace == alone  # tokens and top-5 logprobs, bit for bit
    stats = speculator_of(engine).stats
    assert stats.accepted_tokens == stats.draft_tokens > 100  # the target's own tokens
    assert engine.generation_tokens == sum(r.max_tokens for r in WORKLOAD)
    assert engine.num_steps < sum(r.max_tokens for r in WORKLOAD) // 2


def test_a_noisy_draft_under_preemption_and_chunks_matches_alone(
    make_tiny_engine, noisy, alone
) -> None:
    engine = drafting(
        make_tiny_engine, noisy, num_blocks=18, max_num_batched_tokens=11, max_batch=6
    )
    run = serve(engine, WORKLOAD)
    assert run.preempted > 0 and run.partial_chunks > 0
    assert run.trace == alone
    stats = speculator_of(engine).stats
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    assert stats.accepted_per_position[0] > stats.accepted_per_position[2]


def test_random_configurations_with_a_draft(make_tiny_engine, twin, noisy, alone) -> None:
    rng = random.Random(11)
    for _ in range(3):
        config = random_config(rng)
        engine = drafting(make_tiny_engine, rng.choice([twin, noisy]), **config)
        assert serve(engine, WORKLOAD).trace == alone, config


def test_seeded_sampling_is_unchanged_by_a_draft(make_tiny_engine, noisy) -> None:
    plain = serve(make_tiny_engine(), WORKLOAD, seeded)
    engine = drafting(make_tiny_engine, noisy)
    assert serve(engine, WORKLOAD, seeded).trace == plain.trace
    assert speculator_of(engine).stats.accepted_tokens > 0


def test_a_draft_that_costs_a_target_step_is_never_run(make_tiny_engine, twin) -> None:
    """Priced: a proposal as dear as the target's own step never pays, even all accepted."""
    engine = make_tiny_engine(speculative=DRAFT, draft=twin)
    speculator_of(engine).calibrate = False
    speculator_of(engine).cost = DraftCost(
        base_s=1.0, per_row_s=0.0, switch_s=0.0, per_draft_s=0.0, propose_s=1.0
    )
    serve(engine, [Request(tuple(PROMPT), 20)])
    assert speculator_of(engine).stats.draft_tokens == 0
    proposer = speculator_of(engine).proposer
    assert isinstance(proposer, DraftModel) and proposer._tables == {}


def test_only_a_steady_proposal_may_price_a_token(fp32) -> None:
    """Catching a prompt up is a request's one-off cost: the Speculator learns no price then."""
    draft = draft_of(fp32)
    prompt = [3 + i % 200 for i in range(40)]
    draft.propose([(seq(0, prompt), 4)])
    assert not draft.steady  # 40 tokens caught up
    grown = prompt + list(draft.propose([(seq(0, prompt), 4)])[0][:2]) + [9]
    draft.propose([(seq(0, grown), 4)])
    assert draft.steady  # the last token, and the drafts the verify kept: 4 tokens
    assert draft.propose([(seq(0, grown), 4), (seq(1, [1] * 200), 2)]).keys() == {0}
    assert not draft.steady  # a row dropped (past the draft's context): not what was asked
    long = [3 + i % 200 for i in range(126)]
    draft.propose([(seq(3, long), 1)])  # caught up on 126 tokens
    assert len(draft.propose([(seq(3, [*long, 7]), 4)])[3]) == 2  # positions 126, 127 fed
    assert not draft.steady  # cut to 2 tokens by the context

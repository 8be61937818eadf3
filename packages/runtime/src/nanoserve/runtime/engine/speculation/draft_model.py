"""DraftModel: proposals from a smaller model with the target's tokenizer, on its own K/V pool.

A row that drafts k tokens costs k forwards of the draft, batched over the drafting rows: one
catch-up chunk (what the row gained since it last drafted, ending with its last token), whose
logits give the first proposed token, then k - 1 decode steps, each feeding the token before.
Proposals are greedy: they are only proposals, and the target's verify decides every token, so
the draft's numbers never reach the output (exactness is the verify's, verify.py).

The draft's K/V is kept per sequence with the tokens it was computed from (`_fed`). The next
proposal keeps the longest prefix those share with the sequence's tokens now, so the rejected
tail is recomputed, the accepted drafts are not, and a row that has not drafted for a while
just catches up with a longer chunk. A step's catch-ups feed at most `catch_up` tokens in all
(the target's step budget), the shortest first: a long prompt is fed over several steps, as the
target chunks its prefill, and its row proposes once it is current. Blocks go back when the
sequence finishes; when the pool runs short, the states of sequences not drafting this step go
first, least recently used.

`load_draft_model` reads the draft in its own stored form (a GGUF's blocks on the CPU kernels,
as the target's "auto") and refuses, in one line, a draft whose tokenizer is not the target's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import torch

from nanoserve.core import (
    BlockAllocator,
    BlockTable,
    DecodeSeq,
    KVPoolPlan,
    PrefillChunk,
    check_conservation,
    plan_decode,
    plan_prefill,
)
from nanoserve.core.blocks import ConservationError
from nanoserve.core.draft_budget import Acceptance
from nanoserve.core.errors import NanoserveError
from nanoserve.runtime.engine.config.engine_config import ResolvedConfig
from nanoserve.runtime.engine.step.sequence import Sequence
from nanoserve.runtime.kernels.cpu_kernels import kernels_available
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.loading.embedded import embedded_model_path
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.weight_forms import auto_quantize
from nanoserve.runtime.text.tokenizer import Tokenizer

# A verify keeps at most k drafts and adds one token: beyond this, a catch-up is a prompt's
STEADY_CATCH_UP = 16


class DraftVocabularyError(NanoserveError, ValueError):
    """The draft's tokenizer is not the target's: its token ids would mean other tokens."""


def draft_path(model: str) -> Path:
    """A directory, a GGUF file, or "embedded" (the embedded SmolLM2-135M)."""
    return embedded_model_path() if model == "embedded" else Path(model)


def load_draft_model(model: str, config: ResolvedConfig, target: Tokenizer) -> LlamaModel:
    checkpoint = load_checkpoint(draft_path(model))
    check_draft_vocabulary(target, checkpoint.tokenizer, Path(model).name)
    form = auto_quantize(checkpoint.linear_types(), config.device)
    return LlamaModel.from_checkpoint(
        checkpoint,
        dtype=config.torch_dtype,
        device=config.device,
        batch_invariant=config.batch_invariant,
        max_positions=config.max_model_len,
        quantize=form if kernels_available() else None,
    )


def check_draft_vocabulary(target: Tokenizer, draft: Tokenizer, name: str) -> None:
    if draft.vocab_size != target.vocab_size:
        raise DraftVocabularyError(
            f"draft model {name} has a vocabulary of {draft.vocab_size:,} tokens, the target"
            f" {target.vocab_size:,}: a draft must share the target's tokenizer"
        )
    ours, theirs = (t.backend.get_vocab(with_added_tokens=True) for t in (target, draft))
    if ours != theirs:
        token = min((t for t, i in ours.items() if theirs.get(t) != i), key=ours.__getitem__)
        raise DraftVocabularyError(
            f"draft model {name}: token {token!r} is id {theirs.get(token)} in its vocabulary"
            f" and {ours[token]} in the target's: a draft must share the target's tokenizer"
        )


@dataclass(slots=True)
class _Row:
    seq_id: int
    tokens: list[int]  # the sequence's prompt and output now
    keep: int  # positions of the draft's K/V still valid for them
    want: int  # tokens to propose
    proposal: list[int]
    end: int = 0  # this step feeds tokens[keep:end]; the row proposes when end is all of them

    @property
    def gap(self) -> int:
        return len(self.tokens) - self.keep

    @property
    def proposes(self) -> bool:
        return self.end == len(self.tokens)


class DraftModel:
    """The Speculator's proposer when speculating with a draft model (speculator.Proposer)."""

    priced_first = True  # proposing is k forwards: price first, then propose what is taken
    prior = Acceptance(4.0, 5.0)  # a draft is chosen to agree with its target

    def __init__(
        self,
        model: LlamaModel,
        pool_plan: KVPoolPlan,
        *,
        max_len: int,
        vocab: int,
        name: str,
        catch_up: int = 512,
    ) -> None:
        """max_len: the longest context the draft computes (its own and the target's);
        vocab: the target's vocabulary, which a proposed id must lie within; catch_up: the
        tokens a step's catch-up chunks feed in all."""
        self.model = model
        self.name = name
        self.pool = KVPool(pool_plan, model.device)
        self.allocator = BlockAllocator(pool_plan.num_blocks)
        self.block_size = pool_plan.block_size
        self.max_len = max_len
        self.vocab = vocab
        # The draft's embedding rows: a target may have more (padding rows past the tokenizer,
        # a 7B Qwen's 152,064 against a 0.5B's 151,936), and a token the draft has no row for
        # cannot be fed to it
        self.rows = model.config.vocab_size
        self.catch_up = catch_up
        self._tables: OrderedDict[int, BlockTable] = OrderedDict()  # least recently used first
        self._fed: dict[int, list[int]] = {}  # the tokens of each table's K/V, from position 0
        # The last proposal caught no row up by more than a verify's worth of tokens (a
        # prompt's catch-up is the request's one-off cost: not a price per token)
        self.steady = True

    @classmethod
    def with_pool(
        cls,
        model: LlamaModel,
        *,
        slots: int,
        block_size: int,
        max_len: int,
        vocab: int,
        name: str,
        catch_up: int = 512,
    ) -> DraftModel:
        """A draft whose pool holds `slots` positions (the target pool's and each row's draft)."""
        cfg = model.config
        blocks = max(1, -(-slots // block_size))
        plan = KVPoolPlan(
            len(cfg.kv_layers), cfg.num_kv_heads, cfg.head_dim, model.kv_dtype, block_size,
            blocks, layer_shapes=cfg.kv_layer_shapes,
        )  # fmt: skip
        max_len = min(max_len, cfg.max_position_embeddings)
        return cls(model, plan, max_len=max_len, vocab=vocab, name=name, catch_up=catch_up)

    def propose(self, wants: Seq[tuple[Sequence, int]]) -> dict[int, tuple[int, ...]]:
        """Up to `count` greedy tokens for each (sequence, count); a row the pool or the
        draft's context cannot hold gets none, and so does a row still catching up."""
        planned = [row for seq, count in wants if (row := self._plan(seq, count)) is not None]
        rows = self._fit(planned, {seq.seq_id for seq, _ in wants})
        # A price per token only when this step computed what was asked, as it will again: no
        # row dropped or cut short, no prompt caught up on
        self.steady = len(rows) == len(wants) and all(
            row.proposes and row.want == count and row.gap <= STEADY_CATCH_UP
            for row, (_, count) in zip(rows, wants, strict=False)
        )
        if not rows:
            return {}
        proposing = [row for row in rows if row.proposes]
        with torch.inference_mode():
            self._catch_up(rows)
            for step in range(1, max((row.want for row in proposing), default=0)):
                self._decode([row for row in proposing if row.want > step])
        proposals = {}
        for row in rows:
            if not row.proposes:
                self._fed[row.seq_id] = row.tokens[: row.end]
                continue
            proposal = row.proposal
            if any(t >= self.vocab for t in proposal):  # padding rows of a wider embedding
                proposal = proposal[: next(i for i, t in enumerate(proposal) if t >= self.vocab)]
            self._fed[row.seq_id] = row.tokens + row.proposal[:-1]
            if proposal:
                proposals[row.seq_id] = tuple(proposal)
        return proposals

    def forget(self, seq_id: int) -> None:
        table = self._tables.pop(seq_id, None)
        if table is not None:
            self.allocator.free(table.blocks)
        self._fed.pop(seq_id, None)

    def check_blocks(self, idle: bool) -> None:
        """Every used block is one table's; idle (no sequence left), none is used."""
        check_conservation(self.allocator)
        held = sum(len(table.blocks) for table in self._tables.values())
        if held != self.allocator.num_used or (idle and held):
            raise ConservationError(
                f"draft pool: tables hold {held} blocks, {self.allocator.num_used} are used"
                f"{' while idle' if idle else ''}"
            )

    def describe(self) -> str:
        plan = self.pool.plan
        return (
            f"draft model {self.name} ({self.model.kernels}), its K/V pool {plan.num_blocks}"
            f" blocks of {plan.block_size} ({plan.total_bytes / 2**20:.0f} MiB) for contexts up"
            f" to {self.max_len}"
        )

    # -- the forwards -------------------------------------------------------------------------

    def _plan(self, seq: Sequence, count: int) -> _Row | None:
        """What the row would feed and propose; None where the draft cannot take it."""
        tokens = seq.token_ids()
        want = min(count, self.max_len - len(tokens) + 1)  # the last proposal needs no K/V
        if want < 1:
            return None
        fed = self._fed.get(seq.seq_id, [])
        limit = min(len(fed), len(tokens) - 1)  # the last token is always fed
        keep = next((i for i in range(limit) if fed[i] != tokens[i]), limit)
        if max(tokens[keep:]) >= self.rows:
            return None
        return _Row(seq.seq_id, tokens, keep, want, [])

    def _fit(self, planned: list[_Row], drafting: set[int]) -> list[_Row]:
        """The rows this step feeds, the shortest catch-up first, within the step's catch-up
        tokens and the pool, each with its blocks; in the order planned."""
        left = self.catch_up
        fitted = set()
        for row in sorted(planned, key=lambda r: r.gap):
            row.end = row.keep + min(row.gap, left)
            if row.end == row.keep:
                break
            table = self._tables.pop(row.seq_id, None) or BlockTable(self.block_size)
            self._tables[row.seq_id] = table  # the most recently used now
            needed = table.blocks_needed(
                len(row.tokens) + row.want - 1 if row.proposes else row.end
            )
            if not self._make_room(needed, drafting):
                self.forget(row.seq_id)
                continue
            table.blocks.extend(self.allocator.allocate(needed))
            left -= row.end - row.keep
            fitted.add(row.seq_id)
        return [row for row in planned if row.seq_id in fitted]

    def _make_room(self, needed: int, drafting: set[int]) -> bool:
        """Free the states of sequences not drafting now, least recently used first, if that
        makes room (otherwise none)."""
        others = [s for s in self._tables if s not in drafting]
        if self.allocator.num_free + sum(len(self._tables[s].blocks) for s in others) < needed:
            return False
        for seq_id in others:
            if self.allocator.num_free >= needed:
                break
            self.forget(seq_id)
        return True

    def _catch_up(self, rows: list[_Row]) -> None:
        chunks = [
            PrefillChunk(r.seq_id, tuple(r.tokens[r.keep : r.end]), r.keep, self._tables[r.seq_id])
            for r in rows
        ]
        plan = plan_prefill(chunks, sink_slot=self.pool.plan.sink_slot, device=self.pool.device)
        logits = self.model.forward(plan, self.pool.view(plan.seq_ids))  # [rows, vocab]
        for row, token in zip(rows, logits.argmax(dim=-1).tolist(), strict=True):
            if row.proposes:
                row.proposal.append(token)

    def _decode(self, rows: list[_Row]) -> None:
        seqs = [
            DecodeSeq(
                r.seq_id,
                r.proposal[-1],
                len(r.tokens) + len(r.proposal) - 1,
                self._tables[r.seq_id],
            )
            for r in rows
        ]
        plan = plan_decode(seqs, sink_slot=self.pool.plan.sink_slot, device=self.pool.device)
        logits = self.model.forward(plan, self.pool.view(plan.seq_ids))  # [rows, vocab]
        for row, token in zip(rows, logits.argmax(dim=-1).tolist(), strict=True):
            row.proposal.append(token)

"""Sequence: how sampled tokens become text and a finish reason, with the tiny model's tokenizer.

Tokens of "hello world, the quick" in the tiny BPE: he(259) llo(272) ' w'(269) orld(300) ','(14)
' the'(271) ' '(223) qu(301) ick(292). Id 2 is <|im_end|>, the eos.
"""

from __future__ import annotations

import pytest
import torch

from nanoserve.core import BlockTable
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step.sequence import Sequence, Status
from nanoserve.runtime.loading.checkpoint import Checkpoint
from nanoserve.runtime.text.tokenizer import IncrementalDetokenizer

HE, LLO, W, ORLD, COMMA, THE = 259, 272, 269, 300, 14, 271
EOS = 2


@pytest.fixture
def make_seq(tiny_llama_checkpoint: Checkpoint):
    tokenizer = tiny_llama_checkpoint.tokenizer
    assert tokenizer.encode("hello world, the") == [HE, LLO, W, ORLD, COMMA, THE]

    def make(**params: object) -> Sequence:
        return Sequence(
            seq_id=0,
            request_id="r",
            index=0,
            prompt_ids=[5, 6, 7],
            params=SamplingParams(**params),  # type: ignore[arg-type]
            block_table=BlockTable(4),
            detokenizer=IncrementalDetokenizer(tokenizer, skip_special_tokens=True),
            eos_token_ids=frozenset({EOS}),
        )

    return make


def feed(seq: Sequence, tokens: list[int]) -> list[tuple[str, tuple[int, ...], str | None]]:
    """Append each token and take its delta, as the engine does once per step."""
    out = []
    for token in tokens:
        assert not seq.finished
        seq.append(token, None, None)
        delta = seq.take_delta()
        out.append((delta.text, delta.token_ids, delta.finish_reason))
    return out


def test_text_streams_token_by_token(make_seq) -> None:
    seq = make_seq(max_tokens=10)
    assert feed(seq, [HE, LLO, W]) == [
        ("he", (HE,), None),
        ("llo", (LLO,), None),
        (" w", (W,), None),
    ]
    assert seq.num_tokens == 6
    assert seq.uncomputed == 6  # nothing computed yet: the scheduler's business
    assert seq.token_ids() == [5, 6, 7, HE, LLO, W]


def test_max_tokens_finishes_with_length(make_seq) -> None:
    seq = make_seq(max_tokens=2)
    assert feed(seq, [HE, LLO]) == [("he", (HE,), None), ("llo", (LLO,), "length")]
    assert seq.status is Status.FINISHED
    assert seq.output_ids == [HE, LLO]


def test_eos_finishes_with_stop_and_is_not_text(make_seq) -> None:
    seq = make_seq(max_tokens=10)
    assert feed(seq, [HE, EOS]) == [("he", (HE,), None), ("", (EOS,), "stop")]
    assert seq.text == "he"
    assert seq.finish_reason == "stop"


def test_ignore_eos_runs_to_max_tokens(make_seq) -> None:
    seq = make_seq(max_tokens=3, ignore_eos=True)
    out = feed(seq, [HE, EOS, LLO])
    assert [d[2] for d in out] == [None, None, "length"]
    assert seq.text == "hello"  # the special token is skipped in the text
    assert seq.output_ids == [HE, EOS, LLO]


def test_stop_token_ids_stop_even_with_ignore_eos(make_seq) -> None:
    seq = make_seq(max_tokens=10, stop_token_ids=[ORLD], ignore_eos=True)
    assert feed(seq, [HE, LLO, ORLD]) == [
        ("he", (HE,), None),
        ("llo", (LLO,), None),
        ("", (ORLD,), "stop"),
    ]
    assert seq.text == "hello"


def test_eos_beats_max_tokens(make_seq) -> None:
    seq = make_seq(max_tokens=2)
    assert feed(seq, [HE, EOS])[-1] == ("", (EOS,), "stop")


def test_stop_string_split_across_tokens_is_caught_and_not_emitted(make_seq) -> None:
    seq = make_seq(max_tokens=10, stop=["lo w"])
    out = feed(seq, [HE, LLO, W])
    # "hello" ends with "lo", a prefix of the stop: held back. " w" completes it: cut there.
    assert out == [("he", (HE,), None), ("l", (LLO,), None), ("", (W,), "stop")]
    assert seq.text == "hel"
    assert seq.output_ids == [HE, LLO, W]  # the tokens are reported; the text is cut


def test_stop_string_inside_one_token(make_seq) -> None:
    seq = make_seq(max_tokens=10, stop=["or"])
    out = feed(seq, [HE, LLO, W, ORLD])
    assert out[-1] == ("", (ORLD,), "stop")
    assert "".join(d[0] for d in out) == "hello w"


def test_partial_match_is_released_when_it_fails(make_seq) -> None:
    seq = make_seq(max_tokens=10, stop=["lo x"])
    out = feed(seq, [HE, LLO, W, ORLD])
    # "lo" is held after "llo"; " w" breaks the match, so "lo w" comes out with it.
    assert [d[0] for d in out] == ["he", "l", "lo w", "orld"]
    assert [d[2] for d in out] == [None] * 4


def test_held_back_text_is_released_at_length(make_seq) -> None:
    seq = make_seq(max_tokens=2, stop=["lo x"])
    assert feed(seq, [HE, LLO]) == [("he", (HE,), None), ("llo", (LLO,), "length")]


def test_held_back_text_is_released_at_eos(make_seq) -> None:
    seq = make_seq(max_tokens=5, stop=["lo x"])
    out = feed(seq, [HE, LLO, EOS])
    assert [d[0] for d in out] == ["he", "l", "lo"]
    assert out[-1][2] == "stop"


def test_earliest_of_several_stops_wins(make_seq) -> None:
    seq = make_seq(max_tokens=10, stop=["world", "o w", "zzz"])
    out = feed(seq, [HE, LLO, W])
    # "o w" (at 4) completes with " w", before "world" could.
    assert out[-1][2] == "stop"
    assert seq.text == "hell"
    assert "".join(d[0] for d in out) == "hell"


def test_stop_string_at_the_very_start(make_seq) -> None:
    seq = make_seq(max_tokens=10, stop=["he"])
    assert feed(seq, [HE]) == [("", (HE,), "stop")]
    assert seq.text == ""


def test_stop_string_on_the_last_allowed_token_is_stop_not_length(make_seq) -> None:
    seq = make_seq(max_tokens=3, stop=["lo w"])
    assert feed(seq, [HE, LLO, W])[-1] == ("", (W,), "stop")


def test_longest_partial_prefix_is_held(make_seq) -> None:
    # Two stops: "llo there" (prefix "llo" held) and "o!" (prefix "o" held): the longer wins.
    seq = make_seq(max_tokens=10, stop=["llo there", "o!"])
    out = feed(seq, [HE, LLO])
    assert [d[0] for d in out] == ["he", ""]
    assert seq.take_delta().text == ""


def test_logprobs_ride_on_the_delta(make_seq) -> None:
    seq = make_seq(max_tokens=4, logprobs=1)
    seq.append(HE, -0.5, ((HE, -0.5),))
    seq.append(LLO, -1.25, ((W, -1.0),))
    delta = seq.take_delta()
    assert delta.token_ids == (HE, LLO)
    assert delta.logprobs == (-0.5, -1.25)
    assert delta.top_logprobs == (((HE, -0.5),), ((W, -1.0),))
    assert delta.text == "hello"
    assert (delta.prompt_tokens, delta.completion_tokens) == (3, 2)
    empty = seq.take_delta()  # drained
    assert (empty.token_ids, empty.logprobs, empty.text) == ((), (), "")


def test_no_logprobs_unless_asked(make_seq) -> None:
    seq = make_seq(max_tokens=4)
    seq.append(HE, -0.5, ())  # the sampler computed them for a batch neighbour
    delta = seq.take_delta()
    assert delta.logprobs is None and delta.top_logprobs is None


def test_abort_releases_held_text(make_seq) -> None:
    seq = make_seq(max_tokens=10, stop=["lo x"])
    feed(seq, [HE, LLO])
    seq.finish("abort")
    delta = seq.take_delta()
    assert (delta.text, delta.finish_reason) == ("lo", "abort")


def test_incomplete_utf8_is_held_until_complete(
    make_seq, tiny_llama_checkpoint: Checkpoint
) -> None:
    hug = tiny_llama_checkpoint.tokenizer.encode(" 🤗")  # ' ', then the emoji's bytes in 2 tokens
    assert len(hug) == 3
    seq = make_seq(max_tokens=10)
    out = feed(seq, hug)
    assert [d[0] for d in out] == [" ", "", "🤗"]


class _Grammar:
    """A stand-in matcher: takes `accepts` tokens, then fails (or stops, with stop_after)."""

    def __init__(self, accepts: int, *, fail: bool) -> None:
        self.left, self.fail = accepts, fail
        self.failed = False

    def consume_token(self, token_id: int) -> bool:
        self.left -= 1
        self.failed = self.fail and self.left < 0
        return not self.failed

    def is_error(self) -> bool:
        return self.failed

    def is_stopped(self) -> bool:
        return not self.fail and self.left <= 0

    def get_error(self) -> str:
        return "resource limit"


def test_a_grammar_that_fails_aborts_and_drops_the_token(make_seq) -> None:
    seq = make_seq(max_tokens=10)
    seq.grammar = _Grammar(2, fail=True)
    for token in (104, 105, 106):
        seq.append(token, None, None)
    assert seq.output_ids == [104, 105]  # the refused token is not the answer's
    assert seq.finish_reason == "abort"


def test_a_grammar_that_ends_finishes_with_stop_at_once(make_seq) -> None:
    seq = make_seq(max_tokens=10)
    seq.grammar = _Grammar(2, fail=False)
    seq.append(104, None, None)
    assert not seq.finished
    seq.append(105, None, None)
    assert seq.finish_reason == "stop" and seq.output_ids == [104, 105]


def test_tokens_reads_positions_across_prompt_and_output(make_seq) -> None:
    """What a step reads of a sequence: its own positions, never the whole list copied."""
    seq = make_seq(max_tokens=10)
    feed(seq, [HE, LLO])
    assert seq.tokens(0, 5) == (5, 6, 7, HE, LLO) == tuple(seq.token_ids())
    assert seq.tokens(1, 3) == (6, 7)
    assert seq.tokens(2, 4) == (7, HE)
    assert seq.tokens(4, 5) == (LLO,)  # a decode step's one token: the last sampled
    assert seq.tokens(3, 3) == ()


def test_special_tokens_are_dropped_unless_the_request_keeps_them(
    tiny_llama_checkpoint: Checkpoint,
) -> None:
    """An answer whose format marks are special tokens (gpt-oss's harmony, Gemma 4's channels)
    asks for them in its text; any other drops them, as the peers do. Id 1 is <|im_start|>."""
    from nanoserve.runtime.engine.step.sequence import request_sequences

    tokenizer = tiny_llama_checkpoint.tokenizer
    texts = []
    for skip in (True, False):
        params = SamplingParams(max_tokens=3, skip_special_tokens=skip)
        [seq] = request_sequences(
            "r", [5], params, block_size=4, tokenizer=tokenizer, eos_token_ids=frozenset({EOS}),
            seq_ids=iter(range(1)), device=torch.device("cpu"),
        )  # fmt: skip
        for token in (HE, 1, LLO):
            seq.append(token, None, None)
        texts.append(seq.text)
    assert tokenizer.id_to_token(1) == "<|im_start|>" and 1 in tokenizer.special_token_ids()
    assert texts == ["hello", "he<|im_start|>llo"]

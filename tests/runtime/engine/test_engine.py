"""Engine: continuous batching end to end on the tiny Llama (batch-invariant), in three forms:
torch's kernels in float32 (the exact mode) and bf16, and nanoserve's CPU kernels (q4 weights).

The reference for every greedy comparison is each request run alone on a fresh engine. A
request's tokens must not change when it shares its steps with 15 others that join and leave,
when its prompt comes from the prefix cache, when it is preempted and recomputed, or when its
prompt is cut into chunks. Every engine built through `make_tiny_engine` must pass
`check_blocks()` at teardown.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from nanoserve.core.errors import NanoserveError
from nanoserve.runtime.engine.engine import Engine, RequestError
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams, SamplingParamsError
from nanoserve.runtime.engine.step.scheduler import QueueFullError, SchedulerOutput
from nanoserve.runtime.engine.step.sequence import Delta

VOCAB = 320
pytestmark = pytest.mark.usefixtures("single_torch_thread")


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    max_tokens: int
    arrive_at: int = 0  # the engine step before which it is added


def workload(
    seed: int, count: int, *, shared_prefix: int = 0, stagger: bool = True
) -> list[Request]:
    """Mixed prompt lengths and max_tokens; with stagger, later requests arrive mid-run."""
    rng = random.Random(seed)
    prefix = tuple(rng.randrange(3, VOCAB) for _ in range(shared_prefix))
    requests = []
    for i in range(count):
        length = rng.randint(1, 40)
        prompt = prefix + tuple(rng.randrange(3, VOCAB) for _ in range(length))
        arrive = 0 if not stagger or i < count // 2 else 2 * (i - count // 2)
        requests.append(Request(prompt, rng.randint(1, 30), arrive))
    return requests


WORKLOAD = workload(0, 16)


def greedy(max_tokens: int, logprobs: int | None = 5, **kwargs: Any) -> SamplingParams:
    """Greedy, with the top-5 logprobs: raw log_softmax values, so comparing them compares the
    model's logits bit for bit, not just which token won."""
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=logprobs, **kwargs
    )


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    # (token, its logprob, the top logprobs) per sampled token, when the request asked for them
    trace: dict[str, list[tuple]] = field(default_factory=dict)
    finish: dict[str, str | None] = field(default_factory=dict)
    outs: list[SchedulerOutput] = field(default_factory=list)
    partial_chunks: int = 0  # prompt chunks that stopped short of the prompt's end

    @property
    def preempted(self) -> int:
        return sum(len(o.preempted) for o in self.outs)


def watch(engine: Engine, run: Run) -> None:
    """Record every SchedulerOutput the engine's step takes (a wrapper on this instance only)."""
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        out = schedule()
        run.outs.append(out)
        run.partial_chunks += sum(
            1 for item in out.scheduled if item.num_new > 1 and not item.samples
        )
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]


def serve(
    engine: Engine,
    requests: list[Request],
    params: Callable[[int, Request], SamplingParams] = lambda i, r: greedy(r.max_tokens),
) -> Run:
    run = Run()
    watch(engine, run)
    pending = list(enumerate(requests))
    step = 0
    while pending or engine.has_unfinished:
        while pending and pending[0][1].arrive_at <= step:
            i, request = pending.pop(0)
            engine.add_request(str(i), request.prompt, params(i, request))
        for delta in engine.step():
            key = delta.request_id if delta.index == 0 else f"{delta.request_id}/{delta.index}"
            run.tokens.setdefault(key, []).extend(delta.token_ids)
            if delta.logprobs is not None:
                steps = zip(delta.token_ids, delta.logprobs, delta.top_logprobs or (), strict=True)
                run.trace.setdefault(key, []).extend(steps)
            if delta.finish_reason is not None:
                run.finish[key] = delta.finish_reason
        step += 1
        assert step < 5000, "the engine stopped making progress"
    engine.check_blocks()
    return run


def drain(engine: Engine, max_steps: int = 2000) -> list[Delta]:
    """run_until_done with a bound: a scheduler that stops making progress fails, not hangs."""
    deltas: list[Delta] = []
    for _ in range(max_steps):
        if not engine.has_unfinished:
            return deltas
        deltas.extend(engine.step())
    raise AssertionError(f"still unfinished after {max_steps} steps")


FORMS: dict[str, dict[str, Any]] = {
    "torch-fp32": {"dtype": torch.float32, "quantize": None},
    "torch-bf16": {"dtype": torch.bfloat16, "quantize": None},
    "q4-kernels": {"dtype": torch.bfloat16, "quantize": "q4"},
    # every weight type, mixed within layers, each tensor in its own (tiny_mixed_gguf)
    "gguf-mixed": {"dtype": torch.bfloat16, "quantize": "gguf", "mixed": True},
}


@pytest.fixture(scope="module", params=list(FORMS))
def form(request: pytest.FixtureRequest) -> dict[str, Any]:
    return FORMS[request.param]


@pytest.fixture(scope="module")
def quantize(form: dict[str, object]) -> object:
    return form["quantize"]


@pytest.fixture(scope="module")
def tiny_engine_builder(tiny_engine_builder, form) -> Callable[..., Engine]:
    return lambda **config: tiny_engine_builder(**{**form, **config})


@pytest.fixture
def make_tiny_engine(make_tiny_engine, form) -> Callable[..., Engine]:
    return lambda **config: make_tiny_engine(**{**form, **config})


@pytest.fixture(scope="module")
def reference(single_torch_thread, tiny_engine_builder) -> Run:
    """Each request of WORKLOAD on its own fresh engine: the reference tokens and logprobs."""
    result = Run()
    for i, request in enumerate(WORKLOAD):
        engine = tiny_engine_builder()
        run = serve(engine, [Request(request.prompt, request.max_tokens)])
        assert engine.blocks.num_in_use == 0
        result.tokens[str(i)] = run.tokens["0"]
        result.trace[str(i)] = run.trace["0"]
    assert [len(t) for t in result.tokens.values()] == [r.max_tokens for r in WORKLOAD]
    return result


@pytest.fixture
def alone(reference: Run) -> dict[str, list[int]]:
    return reference.tokens


@pytest.fixture
def alone_trace(reference: Run) -> dict[str, list[tuple]]:
    return reference.trace


# -- greedy tokens do not depend on the company a request keeps ------------------------------------


def test_batch_of_16_mixed_requests_matches_alone(make_tiny_engine, alone, alone_trace) -> None:
    engine = make_tiny_engine()
    run = serve(engine, WORKLOAD)
    assert run.tokens == alone
    assert run.trace == alone_trace  # bit-identical logprobs
    assert set(run.finish.values()) == {"length"}
    rows = [len(o.scheduled) for o in run.outs]
    assert max(rows) >= 9  # they really shared steps
    assert len(set(rows)) > 5  # and joined and left as they went
    assert any(not o.is_decode_only for o in run.outs[1:])  # prompts arrived mid-decode
    assert run.preempted == 0
    assert engine.blocks.num_in_use == 0


def test_the_kernel_set_is_the_one_asked_for(make_tiny_engine, quantize) -> None:
    model = make_tiny_engine().runner.model
    assert model.ops.name == ("nanoserve" if quantize else "torch")
    assert model.invariance == ("batch, bucket and ISA" if quantize else "batch and bucket")


def test_prefix_cache_hits_match_alone(make_tiny_engine, alone_trace) -> None:
    engine = make_tiny_engine()
    first, second = WORKLOAD[2], WORKLOAD[9]
    assert len(first.prompt) == 36
    # Arriving two steps later, it shares the first's 30-token prefix: 7 whole blocks of 4.
    reuse = Request(first.prompt[:30] + second.prompt[:5], 12, arrive_at=2)
    by_itself = serve(make_tiny_engine(), [Request(reuse.prompt, 12)]).trace["0"]
    run = serve(engine, [first, reuse])
    assert run.trace == {"0": alone_trace["2"], "1": by_itself}
    prefix = engine.status().prefix_cache
    assert (prefix.hit_tokens, prefix.queried_tokens) == (28, 36 + 35)
    assert prefix.hit_rate == pytest.approx(28 / 71)


def test_prefix_hit_after_the_owner_finished(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    first = WORKLOAD[2]
    serve(engine, [first])
    again = Request((*first.prompt, 7, 8), 10)
    by_itself = serve(make_tiny_engine(), [again]).trace
    assert serve(engine, [again]).trace == by_itself
    assert engine.status().prefix_cache.hit_tokens == 36  # 9 whole blocks of the prompt


def test_the_same_prompt_twice_at_once(make_tiny_engine, alone_trace) -> None:
    """Admitted in the same step, neither can reuse the other: both compute, same tokens."""
    engine = make_tiny_engine()
    run = serve(engine, [WORKLOAD[2], WORKLOAD[2]])
    assert run.trace == {"0": alone_trace["2"], "1": alone_trace["2"]}
    assert engine.status().prefix_cache.hit_tokens == 0


def test_preempted_and_recomputed_matches_alone(make_tiny_engine, alone, alone_trace) -> None:
    engine = make_tiny_engine(num_blocks=20)  # 80 slots for 16 requests of up to 70 tokens
    run = serve(engine, WORKLOAD)
    assert run.preempted > 0
    assert run.tokens == alone
    assert run.trace == alone_trace  # bit-identical logprobs
    assert engine.blocks.num_in_use == 0


def test_preemption_without_prefix_cache_matches_alone(
    make_tiny_engine, alone, alone_trace
) -> None:
    engine = make_tiny_engine(num_blocks=20, enable_prefix_cache=False)
    run = serve(engine, WORKLOAD)
    assert run.preempted > 0
    assert run.tokens == alone
    assert run.trace == alone_trace  # bit-identical logprobs
    assert engine.status().prefix_cache.hit_tokens == 0


def test_chunked_prefill_matches_alone(make_tiny_engine, alone, alone_trace) -> None:
    engine = make_tiny_engine(max_num_batched_tokens=7)
    run = serve(engine, WORKLOAD)
    assert run.partial_chunks > 10
    assert all(o.num_tokens <= 7 for o in run.outs)
    assert run.tokens == alone
    assert run.trace == alone_trace  # bit-identical logprobs


def test_everything_at_once_matches_alone(make_tiny_engine, alone, alone_trace) -> None:
    """A tight pool, a small budget, a row limit and the prefix cache, all together."""
    engine = make_tiny_engine(num_blocks=24, max_num_batched_tokens=9, max_batch=5)
    run = serve(engine, WORKLOAD)
    assert run.preempted > 0 and run.partial_chunks > 0
    assert max(len(o.scheduled) for o in run.outs) == 5
    assert run.tokens == alone
    assert run.trace == alone_trace  # bit-identical logprobs


def test_bucketed_and_recorded_decode_matches_alone(make_tiny_engine, alone, alone_trace) -> None:
    """Decode rows padded to buckets (and replayed from recordings) keep their tokens."""
    engine = make_tiny_engine(decode_mode="recorded", width_multiple=16)
    run = serve(engine, WORKLOAD)
    assert run.tokens == alone
    assert run.trace == alone_trace  # bit-identical logprobs


def test_bucketed_decode_with_preemption_and_chunks_matches_alone(
    make_tiny_engine, alone, alone_trace
) -> None:
    """Preempted sequences give their slot-table rows back and are rewritten when they return."""
    engine = make_tiny_engine(
        num_blocks=20,
        max_num_batched_tokens=9,
        decode_mode="recorded",
        width_multiple=16,
    )
    run = serve(engine, WORKLOAD)
    assert run.preempted > 0 and run.partial_chunks > 0
    assert sum(o.is_decode_only for o in run.outs) > 20
    assert run.tokens == alone
    assert run.trace == alone_trace  # bit-identical logprobs


def test_prompts_sharing_a_long_prefix_match_alone(make_tiny_engine, tiny_engine_builder) -> None:
    requests = workload(5, 8, shared_prefix=24)
    by_itself = {}
    for i, request in enumerate(requests):
        by_itself[str(i)] = serve(
            tiny_engine_builder(), [Request(request.prompt, request.max_tokens)]
        ).trace["0"]
    engine = make_tiny_engine(num_blocks=40, max_num_batched_tokens=16)
    run = serve(engine, requests)
    assert run.trace == by_itself
    assert engine.status().prefix_cache.hit_tokens > 0


def test_random_configurations_match_alone(make_tiny_engine, alone_trace) -> None:
    """Seeded fuzz over block size, pool size, budget, row limit, prefix cache and bucketing:
    every run finishes, frees its blocks, and gives every request its tokens from alone."""
    rng = random.Random(42)
    longest = max(len(r.prompt) + r.max_tokens for r in WORKLOAD)
    for _ in range(12):
        block_size = rng.choice([1, 2, 3, 4, 8, 16])
        fits_one = -(-longest // block_size)
        config: dict[str, object] = {
            "block_size": block_size,
            "num_blocks": rng.randint(fits_one, 3 * fits_one),
            "max_batch": rng.randint(1, 16),
            "max_num_batched_tokens": rng.randint(1, 48),
            "enable_prefix_cache": rng.random() < 0.7,
        }
        if rng.random() < 0.4:
            config.update(decode_mode=rng.choice(["persistent", "recorded"]), width_multiple=8)
        engine = make_tiny_engine(**config)
        run = serve(engine, WORKLOAD)
        assert run.trace == alone_trace, config
        assert engine.blocks.num_in_use == 0, config


# -- seeded sampling -------------------------------------------------------------------------------


def seeded(i: int, request: Request) -> SamplingParams:
    return SamplingParams(
        max_tokens=request.max_tokens,
        temperature=1.0,
        top_p=0.9,
        seed=100 + i,
        ignore_eos=True,
        logprobs=2,
    )


def test_seeded_sampling_is_reproducible_alone_and_batched(
    make_tiny_engine, tiny_engine_builder, alone
) -> None:
    by_itself = {}
    for i in (0, 5, 11):
        request = WORKLOAD[i]
        engine = tiny_engine_builder()
        run = serve(
            engine,
            [Request(request.prompt, request.max_tokens)],
            lambda _, r, i=i: seeded(i, r),  # type: ignore[misc]
        )
        by_itself[str(i)] = run.trace["0"]

    # In a batch beside greedy and unseeded neighbours, with preemption and chunking.
    def mixed(i: int, request: Request) -> SamplingParams:
        if i in (0, 5, 11):
            return seeded(i, request)
        if i % 2:
            return SamplingParams(max_tokens=request.max_tokens, temperature=1.0, ignore_eos=True)
        return greedy(request.max_tokens)

    engine = make_tiny_engine(num_blocks=24, max_num_batched_tokens=12)
    run = serve(engine, WORKLOAD, mixed)
    assert run.preempted > 0
    assert {k: run.trace[k] for k in by_itself} == by_itself
    # The seeded requests really sampled (a random model's greedy run is something else).
    assert all([t for t, _, _ in by_itself[k]] != alone[k] for k in by_itself)
    # Greedy neighbours kept their greedy tokens.
    assert all(run.tokens[str(i)] == alone[str(i)] for i in range(0, 16, 2) if i not in (0,))


def test_unseeded_sampling_follows_the_engine_seed(make_tiny_engine) -> None:
    request = WORKLOAD[2]

    def sampled(i: int, r: Request) -> SamplingParams:
        return SamplingParams(max_tokens=r.max_tokens, temperature=1.0, ignore_eos=True)

    first = serve(make_tiny_engine(seed=3), [request], sampled).tokens
    again = serve(make_tiny_engine(seed=3), [request], sampled).tokens
    other = serve(make_tiny_engine(seed=4), [request], sampled).tokens
    assert first == again
    assert first != other


# -- parallel samples ------------------------------------------------------------------------------


def test_n_samples_share_the_prompt_blocks(make_tiny_engine, alone_trace) -> None:
    engine = make_tiny_engine()
    request = WORKLOAD[2]  # 36 tokens: 8 whole blocks can be shared (not the last token's)
    run = serve(engine, [request], lambda i, r: greedy(r.max_tokens, n=3))
    assert run.finish == {"0": "length", "0/1": "length", "0/2": "length"}
    assert run.trace == {key: alone_trace["2"] for key in ("0", "0/1", "0/2")}
    status = engine.status()
    assert status.prefix_cache.hit_tokens == 2 * 32  # each later sample reuses 8 blocks
    assert status.prefix_cache.queried_tokens == 3 * 36
    assert status.finished == {"length": 3}
    assert status.generation_tokens == 3 * request.max_tokens
    assert status.prompt_tokens == 36


def test_n_seeded_samples_differ_and_reproduce(make_tiny_engine) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=9, n=4, ignore_eos=True)

    def once() -> dict[int, list[int]]:
        engine = make_tiny_engine()
        engine.add_request("n", WORKLOAD[1].prompt, params)
        tokens: dict[int, list[int]] = {}
        for delta in drain(engine):
            tokens.setdefault(delta.index, []).extend(delta.token_ids)
        return tokens

    first = once()
    assert sorted(first) == [0, 1, 2, 3]
    assert all(len(t) == 12 for t in first.values())
    assert len({tuple(t) for t in first.values()}) == 4
    assert once() == first


def test_n_samples_without_prefix_cache(make_tiny_engine, alone) -> None:
    engine = make_tiny_engine(enable_prefix_cache=False)
    engine.add_request("n", WORKLOAD[3].prompt, greedy(WORKLOAD[3].max_tokens, n=2))
    tokens: dict[int, list[int]] = {}
    for delta in drain(engine):
        tokens.setdefault(delta.index, []).extend(delta.token_ids)
    assert tokens == {0: alone["3"], 1: alone["3"]}


# -- aborts ----------------------------------------------------------------------------------------


def test_random_aborts_free_every_block(make_tiny_engine) -> None:
    rng = random.Random(11)
    requests = workload(11, 30)
    reference = serve(make_tiny_engine(), requests).tokens
    engine = make_tiny_engine(num_blocks=40, max_num_batched_tokens=24)
    pending = list(enumerate(requests))
    tokens: dict[str, list[int]] = {}
    finish: dict[str, str] = {}
    aborted = set()
    step = 0
    while pending or engine.has_unfinished:
        while pending and pending[0][1].arrive_at <= step:
            i, request = pending.pop(0)
            engine.add_request(str(i), request.prompt, greedy(request.max_tokens))
        deltas = engine.step()
        if step % 3 == 2:
            live = sorted(
                {s.request_id for s in (*engine.scheduler.running, *engine.scheduler.waiting)}
            )
            if live:
                victim = rng.choice(live)
                aborted.add(victim)
                deltas += engine.abort(victim)
        for delta in deltas:
            tokens.setdefault(delta.request_id, []).extend(delta.token_ids)
            if delta.finish_reason:
                assert delta.request_id not in finish, "finished twice"
                finish[delta.request_id] = delta.finish_reason
        engine.check_blocks()
        step += 1
        assert step < 5000
    assert len(aborted) >= 10
    assert {r for r, why in finish.items() if why == "abort"} == aborted
    assert len(finish) == 30
    assert engine.status().finished == {"abort": len(aborted), "length": 30 - len(aborted)}
    engine.check_blocks()
    assert engine.blocks.num_in_use == 0
    assert not engine.has_unfinished
    for request_id, got in tokens.items():
        if request_id in aborted:  # cut short, but what it produced is what it would have
            assert got == reference[request_id][: len(got)]
        else:
            assert got == reference[request_id]
    assert engine.abort("no-such-request") == []


def test_abort_a_waiting_request(make_tiny_engine) -> None:
    engine = make_tiny_engine(max_batch=1)
    engine.add_request("a", WORKLOAD[0].prompt, greedy(5))
    engine.add_request("b", WORKLOAD[1].prompt, greedy(5))
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (1, 1)
    [delta] = engine.abort("b")
    assert (delta.request_id, delta.finish_reason, delta.token_ids) == ("b", "abort", ())
    assert engine.num_waiting == 0
    drain(engine)
    assert engine.blocks.num_in_use == 0


def test_abort_all_n_samples(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    engine.add_request("n", WORKLOAD[3].prompt, greedy(20, n=3))
    for _ in range(3):
        engine.step()
    deltas = engine.abort("n")
    assert sorted(d.index for d in deltas) == [0, 1, 2]
    assert {d.finish_reason for d in deltas} == {"abort"}
    assert not engine.has_unfinished
    engine.check_blocks()
    assert engine.blocks.num_in_use == 0


# -- stopping ---------------------------------------------------------------------------------------


def test_stop_token_id_ends_the_request(make_tiny_engine, alone) -> None:
    expected = alone["4"]
    stop = expected[5]
    first = expected.index(stop)
    engine = make_tiny_engine()
    engine.add_request(
        "s", WORKLOAD[4].prompt, greedy(WORKLOAD[4].max_tokens, stop_token_ids=[stop])
    )
    deltas = drain(engine)
    assert [t for d in deltas for t in d.token_ids] == expected[: first + 1]
    assert deltas[-1].finish_reason == "stop"


def test_stop_string_ends_the_request_and_is_not_emitted(
    make_tiny_engine, alone, tiny_llama_checkpoint
) -> None:
    tokenizer = tiny_llama_checkpoint.tokenizer
    expected = alone["4"]
    full = tokenizer.decode(expected, skip_special_tokens=True)
    stop = full[10:13]
    at = full.index(stop)
    engine = make_tiny_engine()
    engine.add_request("s", WORKLOAD[4].prompt, greedy(WORKLOAD[4].max_tokens, stop=[stop]))
    deltas = drain(engine)
    assert "".join(d.text for d in deltas) == full[:at]
    assert deltas[-1].finish_reason == "stop"
    tokens = [t for d in deltas for t in d.token_ids]
    assert tokens == expected[: len(tokens)] and len(tokens) < len(expected)
    assert stop in tokenizer.decode(tokens, skip_special_tokens=True)


def test_eos_stops_unless_ignored(make_tiny_engine) -> None:
    # A +100 bias makes eos (id 2) the greedy choice at every step: one request stops on its
    # first token, the other (ignore_eos) runs to max_tokens on eos after eos.
    engine = make_tiny_engine()
    engine.add_request(
        "e",
        WORKLOAD[0].prompt,
        SamplingParams(max_tokens=8, temperature=0.0, logit_bias={2: 100.0}),
    )
    engine.add_request(
        "i",
        WORKLOAD[0].prompt,
        SamplingParams(max_tokens=8, temperature=0.0, logit_bias={2: 100.0}, ignore_eos=True),
    )
    deltas = drain(engine)
    by_id: dict[str, list[int]] = {}
    reasons = {}
    for d in deltas:
        by_id.setdefault(d.request_id, []).extend(d.token_ids)
        if d.finish_reason:
            reasons[d.request_id] = d.finish_reason
    assert by_id == {"e": [2], "i": [2] * 8}
    assert reasons == {"e": "stop", "i": "length"}


# -- logprobs and numbers --------------------------------------------------------------------------


def test_logprobs_through_the_engine(make_tiny_engine, alone) -> None:
    engine = make_tiny_engine()
    engine.add_request("l", WORKLOAD[6].prompt, greedy(WORKLOAD[6].max_tokens, logprobs=3))
    tokens: list[int] = []
    logprobs: list[float] = []
    tops: list[tuple[tuple[int, float], ...]] = []
    for delta in drain(engine):
        tokens += delta.token_ids
        assert delta.logprobs is not None and delta.top_logprobs is not None
        logprobs += delta.logprobs
        tops += delta.top_logprobs
    assert tokens == alone["6"]
    assert len(logprobs) == len(tops) == len(tokens)
    for token, lp, top in zip(tokens, logprobs, tops, strict=True):
        assert len(top) == 3
        assert top[0] == (token, lp)  # greedy: the chosen token is the most likely one
        assert top[0][1] >= top[1][1] >= top[2][1]
        assert lp < 0.0


def test_stats_count_exactly(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    requests = WORKLOAD[:4]
    serve(engine, [Request(r.prompt, r.max_tokens) for r in requests])
    status = engine.status()
    assert status.prompt_tokens == sum(len(r.prompt) for r in requests)
    assert status.generation_tokens == sum(r.max_tokens for r in requests)
    assert status.finished == {"length": 4} and status.steps > 0
    assert (status.running, status.waiting, status.blocks_in_use) == (0, 0, 0)
    assert status.pool == engine.pool_plan and status.kv_cache_usage == 0.0
    assert (status.decode_mode, status.warm, status.recordings) == ("eager", None, None)
    engine.reset_counters()
    assert engine.status().generation_tokens == 0
    assert engine.status().prefix_cache.queried_tokens == 0


def test_step_with_nothing_to_do(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    assert not engine.has_unfinished
    assert engine.step() == []
    assert engine.num_steps == 0


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ((), greedy(4), "prompt"),
        ((5, 6, VOCAB), greedy(4), "prompt"),
        ((5, -1), greedy(4), "prompt"),
        ((5,) * 100, greedy(29), "max_tokens"),  # 129 > max_model_len 128
        ((5,) * 10, greedy(120), "max_tokens"),
        ((5,), SamplingParams(logit_bias={VOCAB: 1.0}), "logit_bias"),
        ((5,), SamplingParams(stop_token_ids=[VOCAB + 3]), "stop_token_ids"),
    ],
)
def test_bad_requests_are_refused_with_the_field(make_tiny_engine, prompt, params, field) -> None:
    engine = make_tiny_engine()
    with pytest.raises((RequestError, SamplingParamsError)) as caught:
        engine.add_request("bad", prompt, params)
    assert isinstance(caught.value, RequestError | SamplingParamsError)
    assert caught.value.field == field
    assert isinstance(caught.value, NanoserveError | ValueError)
    assert not engine.has_unfinished
    engine.add_request("bad", (5, 6), greedy(2))  # the id was not taken by the refusal
    drain(engine)


def test_request_longer_than_the_pool_is_refused(make_tiny_engine) -> None:
    engine = make_tiny_engine(num_blocks=4)  # 16 slots
    with pytest.raises(RequestError) as caught:
        engine.add_request("big", (5,) * 13, greedy(4))
    assert caught.value.field == "max_tokens"
    assert "16 slots" in str(caught.value)
    # Exactly the pool: its prompt alone takes all 4 blocks, leaving no room for the admission
    # watermark. With nothing else running it must still be admitted (else it waits forever).
    engine.add_request("fits", (5,) * 13, greedy(3))
    assert len(drain(engine)) == 3


def test_duplicate_request_id(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    engine.add_request("x", (5, 6), greedy(3))
    with pytest.raises(RequestError) as caught:
        engine.add_request("x", (7, 8), greedy(3))
    assert caught.value.field == "request_id"
    drain(engine)
    engine.add_request("x", (7, 8), greedy(3))  # finished ids can be used again
    drain(engine)


def test_queue_bound(make_tiny_engine) -> None:
    engine = make_tiny_engine(max_waiting=2)
    engine.add_request("a", (5,), greedy(2))
    engine.add_request("b", (5,), greedy(2))
    with pytest.raises(QueueFullError):
        engine.add_request("c", (5,), greedy(2))
    with pytest.raises(QueueFullError):  # n samples count against the bound together
        engine.add_request("d", (5,), greedy(2, n=3))
    drain(engine)
    engine.add_request("c", (5,), greedy(2))  # refused ids were not taken
    drain(engine)
    assert engine.status().finished == {"length": 3}


def test_thread_count_does_not_change_tokens(make_tiny_engine, alone_trace) -> None:
    """The suite runs on one torch thread; two threads give the same tokens."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run = serve(make_tiny_engine(), [WORKLOAD[11]])
    finally:
        torch.set_num_threads(threads)
    assert run.trace == {"0": alone_trace["11"]}


# -- the embedded model ----------------------------------------------------------------------------

EMBEDDED_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived",
    "1, 2, 3, 4,",
    "Water boils at",
    "The three primary colors are red,",
    "import torch\nimport numpy as np\n\n# Load the",
    "Q: What is the largest planet in our solar system?\nA:",
]


@pytest.mark.slow
def test_embedded_model_alone_batched_and_preempted(embedded_checkpoint, embedded_tensors) -> None:
    """SmolLM2-135M in fp32, batch-invariant: the same greedy tokens (and logprobs, bit for bit)
    alone, in a batch of 8 that join and leave, and after preemption with chunked prefill."""
    from nanoserve.runtime.engine.config.engine_config import EngineConfig
    from nanoserve.runtime.model.llama import LlamaModel

    ck = embedded_checkpoint
    model = LlamaModel.from_tensors(
        ck.config,
        embedded_tensors.items(),
        dtype=torch.float32,
        batch_invariant=True,
        max_positions=256,
    )
    # K and V of 30 layers x 3 heads x 64 dims in fp32, per slot; 16 slots a block.
    per_slot = 2 * 30 * 3 * 64 * 4

    def engine(num_blocks: int, **overrides: Any) -> Engine:
        config = EngineConfig(
            block_size=16,
            max_model_len=256,
            kv_budget_bytes=per_slot * (16 * num_blocks + 1),
            **overrides,
        )
        return Engine.from_config(model, ck.tokenizer, config)

    prompts = [tuple(ck.tokenizer.encode(p)) for p in EMBEDDED_PROMPTS]
    requests = [
        Request(p, 8 + 3 * i, arrive_at=0 if i < 5 else 3 * (i - 4)) for i, p in enumerate(prompts)
    ]
    assert max(r.max_tokens for r in requests) == 29
    by_itself = {}
    for i, r in enumerate(requests):
        one = engine(64)
        by_itself[str(i)] = serve(one, [Request(r.prompt, r.max_tokens)]).trace["0"]
        assert one.blocks.num_in_use == 0
    batched_engine = engine(64)
    batched = serve(batched_engine, requests)
    assert max(len(o.scheduled) for o in batched.outs) >= 6
    tight = engine(8, max_num_batched_tokens=12)
    preempted = serve(tight, requests)
    assert preempted.preempted > 0 and preempted.partial_chunks > 0
    tokens = {k: [t for t, _, _ in v] for k, v in by_itself.items()}
    assert batched.tokens == tokens
    assert preempted.tokens == tokens
    assert batched.trace == by_itself  # bit-identical logprobs
    assert preempted.trace == by_itself
    for e in (batched_engine, tight):
        e.check_blocks()
        assert e.blocks.num_in_use == 0

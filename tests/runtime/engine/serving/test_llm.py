"""LLM: the offline API over the tiny Llama — generate() and chat() return whole outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanoserve.runtime.engine.engine import RequestError
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.serving.llm import LLM

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TINY_CHAT_PROMPT = (
    "<|im_start|>system\nYou are tiny.<|im_end|>\n"
    "<|im_start|>user\nhi there<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def greedy(max_tokens: int, **kwargs: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kwargs)  # type: ignore[arg-type]


def alone(make_tiny_engine, prompt_ids: list[int], params: SamplingParams) -> list[int]:
    engine = make_tiny_engine()
    engine.add_request("ref", prompt_ids, params)
    return [t for d in engine.run_until_done() for t in d.token_ids]


def test_generate_returns_text_tokens_reason_and_logprobs(make_tiny_engine) -> None:
    llm = LLM(engine=make_tiny_engine())
    tokenizer = llm.tokenizer
    prompts = ["hello world", "the quick brown fox"]
    params = greedy(9, logprobs=2)
    outputs = llm.generate(prompts, params)
    assert [o.prompt for o in outputs] == prompts
    assert [o.request_id for o in outputs] == ["offline-0", "offline-1"]
    for prompt, result in zip(prompts, outputs, strict=True):
        assert result.prompt_token_ids == tokenizer.encode(prompt)
        assert result.num_prompt_tokens == len(result.prompt_token_ids)
        [out] = result.outputs
        assert out.index == 0
        assert out.finish_reason == "length"
        assert out.token_ids == alone(make_tiny_engine, result.prompt_token_ids, params)
        assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
        assert out.logprobs is not None and len(out.logprobs) == 9
        assert out.top_logprobs is not None and len(out.top_logprobs) == 9
        assert all(
            top[0] == (t, lp)
            for t, lp, top in zip(out.token_ids, out.logprobs, out.top_logprobs, strict=True)
        )
        assert result.num_generated_tokens == 9
    assert not llm.engine.has_unfinished


def test_generate_takes_token_ids(make_tiny_engine) -> None:
    llm = LLM(engine=make_tiny_engine())
    [result] = llm.generate([5, 6, 7, 8], greedy(4))
    assert result.prompt is None
    assert result.prompt_token_ids == [5, 6, 7, 8]
    assert result.outputs[0].token_ids == alone(make_tiny_engine, [5, 6, 7, 8], greedy(4))
    assert result.outputs[0].logprobs is None  # not asked for
    prompts: list[str | list[int]] = [[5, 6], "hello"]
    both = llm.generate(prompts, greedy(2))
    assert [r.prompt for r in both] == [None, "hello"]


def test_generate_per_prompt_params(make_tiny_engine) -> None:
    llm = LLM(engine=make_tiny_engine())
    outputs = llm.generate(["a", "b", "c"], [greedy(1), greedy(3), greedy(5)])
    assert [len(o.outputs[0].token_ids) for o in outputs] == [1, 3, 5]
    with pytest.raises(RequestError, match=r"^3 prompts but 2 SamplingParams$"):
        llm.generate(["a", "b", "c"], [greedy(1), greedy(2)])


def test_generate_default_params_sample(make_tiny_engine) -> None:
    llm = LLM(engine=make_tiny_engine())
    [result] = llm.generate("hello")
    out = result.outputs[0]
    assert out.finish_reason in ("length", "stop")
    assert 1 <= len(out.token_ids) <= 16  # SamplingParams() default max_tokens


def test_generate_n_samples(make_tiny_engine) -> None:
    llm = LLM(engine=make_tiny_engine())
    [result] = llm.generate(
        "hello world", SamplingParams(max_tokens=6, n=3, seed=1, ignore_eos=True)
    )
    assert [o.index for o in result.outputs] == [0, 1, 2]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 6 for o in result.outputs)
    assert len({tuple(o.token_ids) for o in result.outputs}) == 3
    assert result.num_generated_tokens == 18


def test_generate_reports_cached_tokens(make_tiny_engine) -> None:
    llm = LLM(engine=make_tiny_engine())
    prompt = list(range(10, 30))  # 20 tokens: 4 whole blocks can be reused
    [first] = llm.generate(prompt, greedy(3))
    [second] = llm.generate(prompt, greedy(3))
    assert first.cached_tokens == 0
    assert second.cached_tokens == 16
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_generate_with_a_stop_string(make_tiny_engine) -> None:
    llm = LLM(engine=make_tiny_engine())
    [free] = llm.generate("hello world", greedy(20))
    text = free.outputs[0].text
    stop = text[6:8]
    [stopped] = llm.generate("hello world", greedy(20, stop=[stop]))
    assert stopped.outputs[0].finish_reason == "stop"
    assert stopped.outputs[0].text == text[: text.index(stop)]


def test_a_bad_prompt_refuses_the_whole_batch(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    llm = LLM(engine=engine)
    with pytest.raises(RequestError) as caught:
        llm.generate([[5, 6], [], [7]], greedy(2))
    assert caught.value.field == "prompt"
    assert not engine.has_unfinished  # the good prompts were not left queued
    [result] = llm.generate([9, 9], greedy(2))
    assert len(result.outputs[0].token_ids) == 2
    assert engine.status().prompt_tokens == 2


def test_chat_renders_the_template(make_tiny_engine) -> None:
    llm = LLM(engine=make_tiny_engine())
    [result] = llm.chat([{"role": "user", "content": "hi there"}], greedy(5))
    assert result.prompt == TINY_CHAT_PROMPT
    assert result.prompt_token_ids == llm.tokenizer.encode(
        TINY_CHAT_PROMPT, add_special_tokens=False
    )
    assert result.prompt_token_ids[0] == 1  # <|im_start|> as its special id, not as text
    assert result.outputs[0].token_ids == alone(
        make_tiny_engine, result.prompt_token_ids, greedy(5)
    )


def test_chat_over_several_conversations(make_tiny_engine) -> None:
    llm = LLM(engine=make_tiny_engine())
    conversations = [
        [{"role": "user", "content": "hi there"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2 + 2?"},
        ],
    ]
    results = llm.chat(conversations, greedy(3))
    assert results[0].prompt == TINY_CHAT_PROMPT
    assert results[1].prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_without_a_template(tiny_engine_builder) -> None:
    engine = tiny_engine_builder()
    engine.chat_template = None
    with pytest.raises(RequestError) as caught:
        LLM(engine=engine).chat([{"role": "user", "content": "hi"}])
    assert caught.value.field == "messages"


def test_llm_builds_its_own_engine(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), block_size=4, max_model_len=64, kv_budget_bytes=1 << 20)
    engine = llm.engine
    assert engine.config.max_model_len == 64
    assert engine.status().generation_tokens == 0  # the boot request left no trace
    [result] = llm.generate("hello", greedy(4))
    assert len(result.outputs[0].token_ids) == 4
    engine.check_blocks()
    assert engine.blocks.num_in_use == 0


def test_the_top_level_names_import_as_vllm_users_expect() -> None:
    import nanoserve.runtime as runtime
    from nanoserve.runtime import LLM, SamplingParams
    from nanoserve.runtime.engine.requests.sampling_params import SamplingParams as DirectParams
    from nanoserve.runtime.engine.serving.llm import LLM as DirectLLM

    assert (LLM, SamplingParams) == (DirectLLM, DirectParams)
    assert set(runtime.__all__) >= {"LLM", "SamplingParams", "Engine", "EngineConfig"}
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        runtime.Nope  # noqa: B018

"""GrammarSpec and GrammarCompiler over the tiny tokenizer: canonical keys, the cache, errors."""

from __future__ import annotations

import pytest

from nanoserve.runtime.structured.grammar_compiler import GrammarCompiler
from nanoserve.runtime.structured.grammar_spec import GrammarError, GrammarSpec

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture
def compiler(tiny_llama_checkpoint) -> GrammarCompiler:
    tokenizer = tiny_llama_checkpoint.tokenizer
    return GrammarCompiler(tokenizer, vocab_size=320, eos_token_ids=[2])


def test_schema_text_is_canonical_and_keeps_key_order() -> None:
    spaced = GrammarSpec.json_schema('{ "type" : "object", "properties": {"b": {}, "a": {}} }')
    assert spaced.text == '{"type":"object","properties":{"b":{},"a":{}}}'
    assert (
        spaced.key
        == GrammarSpec.json_schema({"type": "object", "properties": {"b": {}, "a": {}}}).key
    )


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GrammarSpec.json_schema("{nope"), "not valid JSON"),
        (lambda: GrammarSpec.json_schema("[1]"), "must be an object"),
        (lambda: GrammarSpec.choice([], source="structured_outputs"), "non-empty list"),
        (lambda: GrammarSpec.choice(["a", 1], source="structured_outputs"), "non-empty list"),
        (lambda: GrammarSpec("yaml", "x"), "unknown grammar kind"),  # type: ignore[arg-type]
    ],
)
def test_bad_specs_name_their_field(build, message: str) -> None:
    with pytest.raises(GrammarError, match=message) as caught:
        build()
    assert caught.value.field in ("response_format", "structured_outputs")


def test_second_compile_is_a_cache_hit(compiler: GrammarCompiler) -> None:
    first = compiler.compile(GrammarSpec.json_schema(SCHEMA))
    again = compiler.compile(GrammarSpec.json_schema(dict(SCHEMA)))
    assert again is first
    stats = compiler.stats()
    assert (stats.compiled, stats.hits, stats.cached) == (1, 1, 1)


def test_matchers_are_independent_copies(compiler: GrammarCompiler) -> None:
    spec = GrammarSpec("regex", "ab|cd")
    one, two = compiler.matcher(spec), compiler.matcher(spec)
    tokenizer = compiler._tokenizer
    assert one.consume_tokens(tokenizer.encode("ab", add_special_tokens=False))
    assert one.is_accepting() and not two.is_accepting()
    assert not compiler.compile(spec).is_accepting()  # the cached one never advances


def test_the_tokenizer_side_is_built_once(compiler: GrammarCompiler) -> None:
    compiler.compile(GrammarSpec("regex", "a+"))
    built = compiler.ll_tokenizer
    compiler.compile(GrammarSpec("regex", "b+"))
    assert compiler.ll_tokenizer is built


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GrammarSpec.json_schema({"type": "bogus"}), "bogus"),
        (GrammarSpec("regex", "(unclosed", "structured_outputs"), "invalid regex"),
        (GrammarSpec("grammar", "root ::= missing", "structured_outputs"), "missing"),
        (GrammarSpec("lark", "start: nothing_defined", "tools"), "unknown name"),
    ],
)
def test_grammars_that_do_not_compile_raise_with_the_field(
    compiler: GrammarCompiler, spec: GrammarSpec, message: str
) -> None:
    with pytest.raises(GrammarError, match=message) as caught:
        compiler.compile(spec)
    assert caught.value.field == spec.source
    assert compiler.stats().cached == 0


def test_the_cache_is_bounded(tiny_llama_checkpoint) -> None:
    compiler = GrammarCompiler(
        tiny_llama_checkpoint.tokenizer, vocab_size=320, eos_token_ids=[2], cache_size=2
    )
    for pattern in ("a", "b", "c"):
        compiler.compile(GrammarSpec("regex", pattern))
    assert compiler.stats().cached == 2
    compiler.compile(GrammarSpec("regex", "a"))  # evicted first: compiled again
    assert compiler.stats().compiled == 4


def test_a_tokenizer_llguidance_cannot_read_is_one_cached_refusal(tiny_llama_checkpoint) -> None:
    # A vocabulary smaller than the tokenizer's: llguidance refuses to build its side.
    compiler = GrammarCompiler(tiny_llama_checkpoint.tokenizer, vocab_size=100, eos_token_ids=[2])
    for _ in range(2):
        with pytest.raises(GrammarError, match="unavailable for this model") as caught:
            compiler.compile(GrammarSpec("regex", "a", "structured_outputs"))
        assert caught.value.field == "structured_outputs"
    assert compiler._ll_tokenizer is None and compiler.stats().compiled == 0

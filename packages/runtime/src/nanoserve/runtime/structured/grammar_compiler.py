"""GrammarCompiler: grammar specs compiled against one model's tokenizer, cached by their text.

Compiling builds llguidance's token-level parser for a grammar (~1 ms for a 10-field schema,
far more for large ones); a cache hit copies a compiled, never-advanced matcher (~6 µs). The
tokenizer's side (every token's bytes, llguidance's `LLTokenizer`) is built once per model, on
the first constrained request, so a server that never sees one never pays its ~0.2 s.

Every method may be called from any thread: the event loop compiles (off-loop, in a worker),
the step thread copies. llguidance is imported on first use: an engine that is never asked for
a grammar (the GPU check, on a machine with no package index) does not need it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from nanoserve.runtime.structured.grammar_spec import JSON_OPTIONS, GrammarError, GrammarSpec
from nanoserve.runtime.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    import llguidance

DEFAULT_CACHE_SIZE = 256


@dataclass(frozen=True, slots=True)
class CompileStats:
    compiled: int  # cache misses that compiled
    hits: int
    seconds: float  # spent compiling, all misses together
    cached: int  # grammars held now


class GrammarCompiler:
    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        """vocab_size: the model's logits width (its embedding may have more rows than the
        tokenizer has tokens: those are never allowed)."""
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(set(eos_token_ids))
        self._cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._unavailable: str | None = None  # why there is no tokenizer side, once known
        self._compiled = self._hits = 0
        self._seconds = 0.0

    def _tokenizer_for(self, spec: GrammarSpec) -> llguidance.LLTokenizer:
        """The tokenizer side, or the one GrammarError that says why there is none (kept: a
        tokenizer llguidance cannot read is not retried on every request)."""
        if self._unavailable is None:
            try:
                return self.ll_tokenizer
            except ImportError:
                self._unavailable = "structured outputs need llguidance, which is not installed"
            except BaseException as error:  # a Rust panic is a BaseException
                if isinstance(error, (KeyboardInterrupt, SystemExit)):
                    raise
                self._unavailable = (
                    "structured outputs are unavailable for this model: llguidance cannot read"
                    f" its tokenizer ({_first_line(str(error))})"
                )
        raise GrammarError(spec.source, self._unavailable)

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        llg = _llguidance()
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llg.LLTokenizer(
                    self._tokenizer.to_json(), n_vocab=self.vocab_size, eos_token=self._eos
                )
            return self._ll_tokenizer

    def compile(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        """The compiled, never-advanced matcher of spec (shared: copy it before use)."""
        with self._lock:
            found = self._cache.get(spec.key)
            if found is not None:
                self._cache.move_to_end(spec.key)
                self._hits += 1
                return found
        tokenizer = self._tokenizer_for(spec)
        started = time.perf_counter()
        matcher = _llguidance().LLMatcher(tokenizer, _llguidance_grammar(spec), log_level=0)
        elapsed = time.perf_counter() - started
        if matcher.is_error():
            raise GrammarError(spec.source, _first_line(matcher.get_error()))
        with self._lock:
            self._compiled += 1
            self._seconds += elapsed
            self._cache[spec.key] = matcher
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return matcher

    def matcher(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        """A fresh matcher for one sequence (compiling spec on a cache miss)."""
        return self.compile(spec).deep_copy()

    def stats(self) -> CompileStats:
        with self._lock:
            return CompileStats(self._compiled, self._hits, self._seconds, len(self._cache))


def _llguidance_grammar(spec: GrammarSpec) -> str:
    """spec as llguidance's grammar text (a JSON document naming one grammar)."""
    llguidance = _llguidance()
    try:
        if spec.kind in ("json_schema", "json_object"):
            return llguidance.LLMatcher.grammar_from_json_schema(spec.text, defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.text)
        if spec.kind == "choice":
            return llguidance.grammar_from("choice", spec.text)
        if spec.kind == "grammar":  # EBNF: GBNF (llama.cpp's) or Lark
            return llguidance.grammar_from("grammar", spec.text)
        return llguidance.LLMatcher.grammar_from_lark(spec.text)
    except (ValueError, TypeError) as error:
        raise GrammarError(spec.source, _first_line(str(error))) from None


def _llguidance() -> ModuleType:
    import llguidance

    return llguidance


def _first_line(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else "invalid grammar"
    return line[:500]

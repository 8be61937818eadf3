"""The prompt a decoder reranker scores a (query, document) pair on.

Qwen3-Reranker is a chat model asked whether the document meets the query, answering "yes" or
"no"; its score is the probability of "yes" against "no" at the answer's first token. This is
its documented prompt (the system line, the instruction, query and document, and an empty
think block), which the classification-head conversions of it (`*ForSequenceClassification`
from Qwen3-Reranker) are scored on too.
"""

from __future__ import annotations

from nanoserve.runtime.text.tokenizer import Tokenizer

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query"
    ' and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def rerank_prompt(query: str, document: str, instruction: str | None = None) -> str:
    """The text of one pair's prompt (tokenized without special tokens: it writes its own)."""
    task = instruction or DEFAULT_INSTRUCTION
    return f"{_PREFIX}<Instruct>: {task}\n<Query>: {query}\n<Document>: {document}{_SUFFIX}"


def pair_prompt(
    tokenizer: Tokenizer,
    query: str,
    document: str,
    instruction: str | None = None,
    *,
    segments: bool,
) -> list[int]:
    """A pair's prompt ids: a cross-encoder's two segments (`segments`, the tokenizer's pair
    template), else a decoder reranker's prompt text."""
    if segments:
        return tokenizer.encode_pair(query, document)
    return tokenizer.encode(rerank_prompt(query, document, instruction), add_special_tokens=False)


def score_pairs(first: list[str], second: list[str]) -> list[tuple[str, str]] | None:
    """The (query, document) pairs of a score request, as vLLM pairs them: one first text
    against each second (1:N), or the two lists element by element (N:N); None when the two
    lists are of different lengths (and the first is not one text), or either is empty."""
    if not first or not second:
        return None
    if len(first) == 1:
        return [(first[0], text) for text in second]
    if len(first) != len(second):
        return None
    return list(zip(first, second, strict=True))

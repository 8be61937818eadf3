"""RequestError and check_request: what the engine refuses at the door, naming the field.

A request is checked whole before any of it is queued, so a refusal surfaces before the first
byte of an answer: an empty prompt, a token outside the vocabulary, a prompt plus max_tokens
past the context or past the K/V pool, a token id the sampling parameters name that the model
does not have.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoserve.core.errors import NanoserveError
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams


class RequestError(NanoserveError, ValueError):
    """A request the engine cannot serve as asked; `field` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_request(
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    vocab: int,
    max_model_len: int,
    pool_slots: int,
) -> None:
    if not prompt_ids:
        raise RequestError("prompt", "the prompt is empty")
    if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in prompt_ids):
        raise RequestError("prompt", f"prompt token ids must be in [0, {vocab})")
    if len(prompt_ids) + params.max_tokens > max_model_len:
        raise RequestError(
            "max_tokens",
            f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens})"
            f" exceeds max_model_len ({max_model_len})",
        )
    if len(prompt_ids) + params.max_tokens > pool_slots:
        raise RequestError(
            "max_tokens",
            f"the prompt plus max_tokens ({len(prompt_ids) + params.max_tokens} tokens)"
            f" exceeds the K/V pool's {pool_slots} slots",
        )
    params.check_vocab(vocab)

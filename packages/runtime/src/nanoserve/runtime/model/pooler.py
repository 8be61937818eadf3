"""Pooler: a pooled hidden state made into what a pooling request asked for.

The engine pools the final-normed hidden states of a prompt (core/pooling.py); the pooler
applies the model's own head to the pooled vector:

- an embedding: the Dense projections a sentence-transformers folder names, then an L2
  normalization if the model's config has one (or the request asks), then a Matryoshka
  truncation to `dimensions`, re-normalized;
- a score: a classification head's logit (`score.weight`; a cross-encoder's `classifier`,
  after a dense layer and tanh on the first token: BERT's `pooler.dense`, RoBERTa's
  `classifier.dense`, GGUF's `cls`; one label: its sigmoid, two or more: the softmax's last
  label), or, for a decoder scored as Qwen3-Reranker is, the probability of
  "yes" against "no" from the LM head's logits, sigmoid(logit(yes) - logit(no)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nanoserve.core.pooling import PoolingError, PoolingMethod, normalize, truncate
from nanoserve.runtime.errors import ConfigError
from nanoserve.runtime.loading.pooler_config import PoolerConfig

Logits = Callable[[torch.Tensor], torch.Tensor]  # final-normed hidden [rows, h] -> [rows, vocab]
Affine = tuple[torch.Tensor, torch.Tensor | None]  # a weight [out, in] and its bias, float32


@dataclass(frozen=True, slots=True)
class Classifier:
    """A classification head: tanh(pre(x)) first where it has one, then the labels' logits."""

    out: Affine
    pre: Affine | None = None

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        x = pooled.float().cpu()[None]  # the head's weights were read to the host
        if self.pre is not None:
            x = torch.tanh(torch.nn.functional.linear(x, *self.pre))
        return torch.nn.functional.linear(x, *self.out)[0]


class Pooler:
    def __init__(
        self,
        config: PoolerConfig,
        *,
        logits: Logits,
        classifier: Classifier | None = None,
        yes_no: tuple[int, int] | None = None,
    ) -> None:
        self.config = config
        self._logits = logits
        self.classifier = classifier
        self.yes_no = yes_no
        if config.head == "classifier" and classifier is None:
            raise ConfigError("score.weight", "the classification head's weight is missing")
        if config.head == "yes_no" and yes_no is None:
            raise ConfigError(
                "tokenizer", "a yes/no reranker needs 'yes' and 'no' as single tokens"
            )

    @property
    def task(self) -> str:
        return self.config.task

    @property
    def method(self) -> PoolingMethod:
        return self.config.method

    @property
    def dimensions(self) -> int | None:
        """The embedding's width after the Dense projections (None: the hidden size)."""
        return int(self.config.dense[-1].weight.shape[0]) if self.config.dense else None

    def embed(
        self, pooled: torch.Tensor, *, dimensions: int | None = None, normalizes: bool | None = None
    ) -> torch.Tensor:
        """The embedding of a pooled hidden state; `normalizes` None: as the model's config."""
        vector = pooled.float().cpu()  # the Dense weights were read to the host
        for layer in self.config.dense:
            vector = layer(vector)
        if normalizes is None:
            normalizes = self.config.normalize
        if normalizes:
            vector = normalize(vector)
        return truncate(vector, dimensions, renormalize=normalizes)

    def score(self, pooled: torch.Tensor) -> float:
        if self.classifier is not None:
            logits = self.classifier(pooled)
            if logits.numel() == 1:
                return float(torch.sigmoid(logits[0]))
            return float(torch.softmax(logits.double(), dim=0)[-1])
        if self.yes_no is None:
            raise PoolingError(f"the model serves {self.task}, not scores")
        yes, no = self.yes_no
        logits = self._logits(pooled[None])[0].cpu()  # the LM head, on the model's device
        return float(torch.sigmoid((logits[yes] - logits[no]).double()))

    def describe(self) -> str:
        return self.config.describe()


def yes_no_ids(encode: Callable[[str], list[int]]) -> tuple[int, int] | None:
    """The token ids of "yes" and "no" when each is one token, else None."""
    yes, no = encode("yes"), encode("no")
    return (yes[0], no[0]) if len(yes) == 1 and len(no) == 1 else None


def read_classifier(head_tensor: Callable[[str], torch.Tensor | None]) -> Classifier | None:
    """A checkpoint's classification head: a decoder's `score`, RoBERTa's (and a GGUF's)
    `classifier.dense` then `classifier.out_proj`, or BERT's `pooler.dense` then `classifier`."""

    def affine(name: str) -> Affine | None:
        weight = head_tensor(f"{name}.weight")
        return None if weight is None else (weight, head_tensor(f"{name}.bias"))

    if (out := affine("score")) is not None:
        return Classifier(out)
    if (out := affine("classifier.out_proj")) is not None:
        return Classifier(out, affine("classifier.dense"))
    if (out := affine("classifier")) is not None:
        return Classifier(out, affine("pooler.dense"))
    return None


def build_pooler(
    config: PoolerConfig,
    logits: Logits,
    head_tensor: Callable[[str], torch.Tensor | None],
    encode: Callable[[str], list[int]],
) -> Pooler:
    """The pooler `config` describes: its classification head read from the checkpoint
    (`head_tensor`), or the yes/no token ids from the tokenizer (`encode`)."""
    classifier = read_classifier(head_tensor) if config.head == "classifier" else None
    yes_no = yes_no_ids(encode) if config.head == "yes_no" else None
    return Pooler(config, logits=logits, classifier=classifier, yes_no=yes_no)

"""model/pooler.py: the heads applied to a pooled vector, with exact values."""

from __future__ import annotations

import math

import pytest
import torch

from nanoserve.core.pooling import PoolingMethod
from nanoserve.runtime.errors import ConfigError
from nanoserve.runtime.loading.pooler_config import DenseLayer, PoolerConfig
from nanoserve.runtime.model.pooler import Classifier, Pooler, build_pooler, yes_no_ids

VECTOR = torch.tensor([3.0, 4.0])


def no_logits(hidden: torch.Tensor) -> torch.Tensor:
    raise AssertionError("the LM head is not read here")


def test_embed_applies_dense_then_normalize() -> None:
    dense = DenseLayer(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]), None, "identity")
    config = PoolerConfig("embed", PoolingMethod.MEAN, True, dense=(dense,))
    pooler = Pooler(config, logits=no_logits)
    assert pooler.dimensions == 3
    assert pooler.embed(VECTOR).tolist() == pytest.approx([v / math.sqrt(122) for v in (3, 8, 7)])
    assert pooler.embed(VECTOR, normalizes=False).tolist() == [3.0, 8.0, 7.0]
    assert pooler.embed(VECTOR, dimensions=1).tolist() == pytest.approx([1.0])


def test_a_classifier_scores_by_sigmoid_or_the_last_label() -> None:
    one = Pooler(
        PoolerConfig("rerank", PoolingMethod.LAST, False, "classifier"),
        logits=no_logits,
        classifier=Classifier((torch.tensor([[0.5, -0.25]]), torch.tensor([0.5]))),
    )
    assert one.score(VECTOR) == pytest.approx(1 / (1 + math.exp(-1.0)))  # 1.5 - 1 + 0.5
    two = Pooler(
        PoolerConfig("rerank", PoolingMethod.LAST, False, "classifier"),
        logits=no_logits,
        classifier=Classifier((torch.tensor([[1.0, 0.0], [0.0, 1.0]]), None)),
    )
    assert two.score(VECTOR) == pytest.approx(math.exp(4) / (math.exp(3) + math.exp(4)))


def test_yes_no_scores_by_the_lm_head() -> None:
    head = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # vocab 3: "no" 0, "yes" 1
    pooler = build_pooler(
        PoolerConfig("rerank", PoolingMethod.LAST, False, "yes_no"),
        lambda h: h @ head.T,
        lambda name: None,
        lambda text: {"yes": [1], "no": [0]}[text],
    )
    assert pooler.score(VECTOR) == pytest.approx(1 / (1 + math.exp(-1.0)))  # sigmoid(4 - 3)
    assert yes_no_ids(lambda text: [1, 2]) is None
    with pytest.raises(ConfigError, match="needs 'yes' and 'no' as single tokens"):
        build_pooler(
            PoolerConfig("rerank", PoolingMethod.LAST, False, "yes_no"),
            no_logits,
            lambda name: None,
            lambda text: [1, 2],
        )

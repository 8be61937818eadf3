"""loading/pooler_config.py: what a model's files say it is for, and what --task makes of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanoserve.core.pooling import PoolingMethod
from nanoserve.runtime.errors import ConfigError
from nanoserve.runtime.loading.pooler_config import (
    GENERATE,
    PoolerConfig,
    read_gguf_pooler,
    read_hf_pooler,
    resolve_task,
)


@pytest.mark.parametrize(
    ("kind", "task", "method", "head"),
    [
        (None, "generate", PoolingMethod.LAST, "none"),
        (0, "generate", PoolingMethod.LAST, "none"),
        (1, "embed", PoolingMethod.MEAN, "none"),
        (2, "embed", PoolingMethod.CLS, "none"),
        (3, "embed", PoolingMethod.LAST, "none"),
        (4, "rerank", PoolingMethod.LAST, "yes_no"),
    ],
)
def test_a_gguf_pooling_type(kind: int | None, task: str, method: PoolingMethod, head: str) -> None:
    metadata = {} if kind is None else {"qwen3.pooling_type": kind}
    pooler = read_gguf_pooler(metadata, "qwen3")
    assert (pooler.task, pooler.method, pooler.head) == (task, method, head)


def test_a_sequence_classifier_reranks(tmp_path: Path) -> None:
    pooler = read_hf_pooler(tmp_path, {"architectures": ["Qwen3ForSequenceClassification"]})
    assert (
        pooler.describe()
        == "rerank: last pooling, classification head (Qwen3ForSequenceClassification)"
    )
    assert read_hf_pooler(tmp_path, {"architectures": ["Qwen3ForCausalLM"]}) == GENERATE


def test_sentence_transformers_modules(tmp_path: Path) -> None:
    modules = [
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True})
    )
    pooler = read_hf_pooler(tmp_path, {})
    assert (pooler.task, pooler.method, pooler.normalize) == ("embed", PoolingMethod.CLS, False)
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_max_tokens": True})
    )
    with pytest.raises(ConfigError, match=r"pooling modes \['pooling_mode_max_tokens'\]"):
        read_hf_pooler(tmp_path, {})
    (tmp_path / "modules.json").write_text(json.dumps(modules[:1]))
    with pytest.raises(ConfigError, match="names no Pooling module"):
        read_hf_pooler(tmp_path, {})


def test_task_overrides() -> None:
    embedder = PoolerConfig("embed", PoolingMethod.MEAN, True, source="modules.json")
    assert resolve_task(embedder, "auto") is embedder
    assert resolve_task(embedder, "embed") is embedder
    assert (
        resolve_task(GENERATE, "embed").describe()
        == "embed: last pooling, normalized (--task embed)"
    )
    assert (
        resolve_task(GENERATE, "rerank").describe()
        == "rerank: last pooling, yes/no logits (--task rerank)"
    )
    assert resolve_task(embedder, "generate").task == "generate"
    classifier = PoolerConfig("rerank", PoolingMethod.LAST, False, "classifier")
    with pytest.raises(ConfigError, match="this model's head classifies"):
        resolve_task(classifier, "generate")

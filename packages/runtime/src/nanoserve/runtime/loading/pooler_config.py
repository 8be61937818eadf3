"""What a model is for, read from its files: generation, embeddings or reranking, and how its
hidden states are pooled.

- A sentence-transformers folder (`modules.json`): its `Pooling` module's mode (`1_Pooling/
  config.json`: last token, mean or CLS), a `Normalize` module, and `Dense` projections after
  the pooling (their weights in the module's own `model.safetensors`): an embedder.
- A GGUF's `{arch}.pooling_type` (llama.cpp's: 1 mean, 2 CLS, 3 last, 4 rank): an embedder, or
  a reranker for "rank".
- A `*ForSequenceClassification` architecture: a reranker, scored by its classification head
  (`score.weight`) on the last token.
- Anything else generates.

`--task auto|generate|embed|rerank` overrides it (`resolve_task`): a generative decoder asked to
embed pools its last token and normalizes (as vLLM does); asked to rerank, it is scored the way
Qwen3-Reranker is, by the logit of "yes" against "no" after the query and the document.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from nanoserve.core.pooling import PoolingMethod
from nanoserve.runtime.errors import ConfigError, WeightsError

Task = Literal["generate", "embed", "rerank"]
TASKS = ("auto", "generate", "embed", "rerank")
# Scoring heads: a classification layer (`score.weight`), or the yes/no logits of the LM head
Head = Literal["none", "classifier", "yes_no"]
GGUF_POOLING = {1: PoolingMethod.MEAN, 2: PoolingMethod.CLS, 3: PoolingMethod.LAST}
GGUF_RANK = 4
ST_MODES = {
    "pooling_mode_lasttoken": PoolingMethod.LAST,
    "pooling_mode_mean_tokens": PoolingMethod.MEAN,
    "pooling_mode_cls_token": PoolingMethod.CLS,
}
# EmbeddingGemma's Dense modules as llama.cpp's converter stores them (2_Dense, 3_Dense)
GGUF_DENSE = ("dense_2.weight", "dense_3.weight")
ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class DenseLayer:
    """A sentence-transformers Dense module: activation(x @ weight.T + bias)."""

    weight: torch.Tensor  # [out, in] float32
    bias: torch.Tensor | None
    activation: str  # "identity" | "tanh"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x.float(), self.weight, self.bias)
        return torch.tanh(y) if self.activation == "tanh" else y


@dataclass(frozen=True, slots=True)
class PoolerConfig:
    task: Task
    method: PoolingMethod
    normalize: bool
    head: Head = "none"
    dense: tuple[DenseLayer, ...] = ()
    source: str = "the architecture"  # what said so, for the boot line

    def describe(self) -> str:
        if self.task == "generate":
            return f"generate ({self.source})"
        parts = [f"{self.method.value} pooling"]
        if self.dense:
            parts.append(f"{len(self.dense)} dense")
        if self.normalize and self.task == "embed":
            parts.append("normalized")
        if self.head != "none":
            parts.append(
                {"classifier": "classification head", "yes_no": "yes/no logits"}[self.head]
            )
        return f"{self.task}: {', '.join(parts)} ({self.source})"


GENERATE = PoolerConfig("generate", PoolingMethod.LAST, normalize=False)


def read_hf_pooler(path: Path, config_json: dict[str, Any]) -> PoolerConfig:
    """What a Hugging Face folder says (see the module's docstring)."""
    architectures = config_json.get("architectures") or []
    if any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return PoolerConfig(
            "rerank", PoolingMethod.LAST, False, "classifier", source=architectures[0]
        )
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return GENERATE
    modules = _json(modules_file)
    if not isinstance(modules, list):
        raise ConfigError(modules_file, "is not a list of sentence-transformers modules")
    method, normalize, dense = None, False, []
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = path / str(module.get("path", ""))
        if kind == "Pooling":
            method = _st_pooling(folder / "config.json")
        elif kind == "Normalize":
            normalize = True
        elif kind == "Dense":
            dense.append(_dense(folder))
    if method is None:
        raise ConfigError(modules_file, "names no Pooling module")
    return PoolerConfig("embed", method, normalize, dense=tuple(dense), source="modules.json")


def read_gguf_pooler(metadata: dict[str, Any], arch: str) -> PoolerConfig:
    """What a GGUF's `{arch}.pooling_type` says."""
    kind = metadata.get(f"{arch}.pooling_type")
    source = f"GGUF {arch}.pooling_type {kind}"
    if kind in GGUF_POOLING:
        return PoolerConfig("embed", GGUF_POOLING[kind], True, source=source)
    if kind == GGUF_RANK:
        return PoolerConfig("rerank", PoolingMethod.LAST, False, "yes_no", source=source)
    return GENERATE


def encoder_pooler(files: PoolerConfig, tensors: Iterable[str]) -> PoolerConfig:
    """What a BERT-family encoder serves: what its files say, pooled by the first token where
    they say no method (a cross-encoder's head reads `[CLS]`); a bare encoder embeds by it,
    normalized, as vLLM serves one; one with a classification head scores."""
    head = {"classifier.weight", "classifier.out_proj.weight"} & set(tensors)
    if files.task == "embed":
        return files
    if files.task == "rerank" or head:
        source = files.source if files.task == "rerank" else "its classification head"
        return PoolerConfig("rerank", PoolingMethod.CLS, False, "classifier", source=source)
    return PoolerConfig("embed", PoolingMethod.CLS, True, source="a BERT-family encoder")


def resolve_task(files: PoolerConfig, asked: str, *, whole_inputs: bool = False) -> PoolerConfig:
    """The files' pooler, or what `--task` asks of the model instead (a model with
    bidirectional attention neither generates nor, without a classification head, scores)."""
    if asked not in TASKS:
        raise ConfigError(Path("--task"), f"must be one of {', '.join(TASKS)}, got {asked!r}")
    if asked in ("auto", files.task):
        return files
    source = f"--task {asked}"
    if whole_inputs and asked != "embed":
        problem = "generate" if asked == "generate" else "rerank without a classification head"
        raise ConfigError(
            Path("--task"), f"{asked}: a model with bidirectional attention cannot {problem}"
        )
    if asked == "generate":
        if files.head == "classifier":
            raise ConfigError(
                Path("--task"), "generate: this model's head classifies, it has no LM head"
            )
        return replace(GENERATE, source=source)
    if asked == "embed":
        method = files.method if files.task != "generate" else PoolingMethod.LAST
        return PoolerConfig("embed", method, True, dense=files.dense, source=source)
    return PoolerConfig("rerank", PoolingMethod.LAST, False, "yes_no", source=source)


def _st_pooling(file: Path) -> PoolingMethod:
    config = _json(file)
    on = [mode for mode in config if config.get(mode) is True and mode.startswith("pooling_mode")]
    methods = [ST_MODES[mode] for mode in on if mode in ST_MODES]
    if len(on) != 1 or len(methods) != 1:
        raise ConfigError(
            file,
            f"pooling modes {on or 'none'}: nanoserve pools by exactly one of {sorted(ST_MODES)}",
        )
    return methods[0]


def _dense(folder: Path) -> DenseLayer:
    config = _json(folder / "config.json")
    activation = ACTIVATIONS.get(str(config.get("activation_function")))
    if activation is None:
        raise ConfigError(
            folder / "config.json",
            f"Dense activation {config.get('activation_function')!r} is not supported",
        )
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise WeightsError(folder, "holds no model.safetensors for its Dense module")
    from safetensors.torch import load_file

    tensors = load_file(str(weights))
    weight = tensors.get("linear.weight")
    if weight is None:
        raise WeightsError(weights, "has no 'linear.weight'")
    bias = tensors.get("linear.bias")
    return DenseLayer(weight.float(), None if bias is None else bias.float(), activation)


def _json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(file, "file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as problem:
        raise ConfigError(file, f"is not valid JSON ({problem})") from None

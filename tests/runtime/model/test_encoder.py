"""BERT-family encoders (BERT, XLM-R, NomicBERT) against transformers on tiny random models:
embeddings from sentence-transformers folders and GGUFs, cross-encoder scores, alone against
batched, and the encoder's place in the engine (whole inputs, no K/V, never generates)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nanoserve.runtime import LLM, PoolingParams, SamplingParams
from nanoserve.runtime.engine.config.engine_config import EngineConfigError
from nanoserve.runtime.engine.config.speculative_config import SpeculativeConfig
from nanoserve.runtime.engine.engine import RequestError
from nanoserve.runtime.engine.step.runner import Executed
from nanoserve.runtime.engine.step.scheduler import SchedulerOutput
from nanoserve.runtime.errors import ConfigError
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.encoder import EncoderModel
from tests import tiny_encoders

TEXTS = ["hello world", "the cat sat on the mat.", "dog", "a query, a document?"]
PAIRS = [("hello", "hello world"), ("the cat", "a dog sat on the mat"), ("query", "document")]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("encoders")


def _embed(model: str | Path, texts: list[str], **config: object) -> torch.Tensor:
    llm = LLM(str(model), **config)  # type: ignore[arg-type]
    return torch.tensor([o.embedding for o in llm.embed(texts)])


@pytest.mark.parametrize("kind", tiny_encoders.ENCODERS)
@pytest.mark.parametrize("pooling", ["mean_tokens", "cls_token"])
def test_embeddings_match_transformers(models: Path, kind: str, pooling: str) -> None:
    folder = tiny_encoders.make_tiny_encoder_dir(models, kind, pooling=pooling)
    reference = tiny_encoders.reference_embeddings(folder, TEXTS, pooling)
    got = _embed(folder, TEXTS)
    cosine = torch.nn.functional.cosine_similarity(got, reference)
    assert cosine.min().item() >= 0.9999, cosine
    assert torch.allclose(got.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
def test_cross_encoder_scores_match_transformers(models: Path, kind: str) -> None:
    folder = tiny_encoders.make_tiny_cross_encoder_dir(models, kind)
    reference = tiny_encoders.reference_scores(folder, PAIRS)
    llm = LLM(str(folder))
    assert llm.engine.pooler.describe() == (
        f"rerank: cls pooling, classification head ({llm.engine.pooler.config.source})"
    )
    scores = [o.score for o in llm.score([q for q, _ in PAIRS], [d for _, d in PAIRS])]
    assert scores == pytest.approx(reference, abs=1e-4)


def test_a_pair_reads_its_second_segment_as_token_type_1(models: Path) -> None:
    """BERT's pair: [CLS] q [SEP] d [SEP], the document's rows (and the last [SEP]) of type 1."""
    folder = tiny_encoders.make_tiny_cross_encoder_dir(models, "bert", seed=1)
    llm = LLM(str(folder))
    model = llm.engine.model
    assert isinstance(model, EncoderModel)
    ids = llm.engine.score_prompt("hello", "hello world")
    types = model._token_types(torch.tensor(ids), (0, len(ids)))
    assert types.tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("kind", ["bert", "nomic_bert"])
@pytest.mark.parametrize(("pooling", "pooling_type"), [("mean_tokens", 1), ("cls_token", 2)])
def test_a_gguf_embeds_as_its_folder(
    models: Path, kind: str, pooling: str, pooling_type: int
) -> None:
    folder = tiny_encoders.make_tiny_encoder_dir(models, kind, pooling=pooling, seed=2)
    gguf = tiny_encoders.write_tiny_encoder_gguf(
        folder, models / f"{kind}-{pooling}.gguf", pooling_type=pooling_type
    )
    reference = tiny_encoders.reference_embeddings(folder, TEXTS, pooling)
    assert load_checkpoint(gguf).linear_types() == {"F32"}  # what --quantize auto reads
    exact = _embed(gguf, TEXTS)  # F32 tensors, served as floats
    assert torch.nn.functional.cosine_similarity(exact, reference).min().item() >= 0.9999
    q8 = _embed(gguf, TEXTS, quantize="q8")  # the linears on nanoserve's kernels
    assert torch.nn.functional.cosine_similarity(q8, reference).min().item() >= 0.999


def test_a_gguf_reranker_scores_with_its_cls_head(models: Path) -> None:
    folder = tiny_encoders.make_tiny_cross_encoder_dir(models, "bert", seed=3)
    gguf = tiny_encoders.write_tiny_encoder_gguf(folder, models / "rank.gguf", pooling_type=4)
    llm = LLM(str(gguf))
    scores = [o.score for o in llm.score([q for q, _ in PAIRS], [d for _, d in PAIRS])]
    assert scores == pytest.approx(tiny_encoders.reference_scores(folder, PAIRS), abs=1e-4)


def test_an_xlm_r_gguf_with_a_unigram_vocabulary_embeds_and_scores_as_its_folder(
    models: Path,
) -> None:
    """bge-m3's and bge-reranker-v2-m3's shape: XLM-R, its SentencePiece Unigram vocabulary
    written by llama.cpp as `t5`, its position table cut past the padding id."""
    folder = tiny_encoders.make_tiny_encoder_dir(models, "xlm-roberta", seed=4, vocab="unigram")
    gguf = tiny_encoders.write_tiny_encoder_gguf(folder, models / "xlmr.gguf")
    from tokenizers import Tokenizer

    expected_ids = [
        Tokenizer.from_file(str(folder / "tokenizer.json")).encode(t).ids for t in TEXTS
    ]
    outs = LLM(str(gguf)).embed(TEXTS)
    assert [o.prompt_token_ids for o in outs] == expected_ids
    reference = tiny_encoders.reference_embeddings(folder, TEXTS, "mean_tokens")
    got = torch.tensor([o.embedding for o in outs])
    assert torch.nn.functional.cosine_similarity(got, reference).min().item() >= 0.9999
    cross = tiny_encoders.make_tiny_cross_encoder_dir(models, "xlm-roberta", 5, vocab="unigram")
    rank = tiny_encoders.write_tiny_encoder_gguf(cross, models / "xlmr-rank.gguf", pooling_type=4)
    scores = [o.score for o in LLM(str(rank)).score([q for q, _ in PAIRS], [d for _, d in PAIRS])]
    assert scores == pytest.approx(tiny_encoders.reference_scores(cross, PAIRS), abs=1e-4)


def test_alone_equals_batched_and_no_kv_is_kept(models: Path) -> None:
    folder = tiny_encoders.make_tiny_encoder_dir(models, "bert", seed=4)
    llm = LLM(str(folder), max_batch=4, max_num_batched_tokens=64)
    engine = llm.engine
    assert engine.pool_plan.num_layers == 0 and engine.pool_plan.total_bytes == 0
    assert engine.config.decode_mode.value == "eager" and engine.step_timings is None
    batched = [o.embedding for o in llm.embed(TEXTS * 3)]  # 12 inputs over several steps
    alone = [llm.embed(text)[0].embedding for text in TEXTS]
    assert batched == alone * 3
    assert engine.blocks.num_in_use == 0


def test_every_step_holds_whole_inputs(models: Path) -> None:
    """Inputs of 4 to 11 tokens under a 16-token step: each runs whole, in one step."""
    folder = tiny_encoders.make_tiny_encoder_dir(models, "bert", seed=5)
    llm = LLM(str(folder), max_batch=8, max_num_batched_tokens=16)
    engine = llm.engine
    steps: list[list[tuple[int, int]]] = []
    execute = engine.runner.execute

    def spy(out: SchedulerOutput) -> Executed:
        steps.append([(i.chunk.start_pos, len(i.chunk.token_ids)) for i in out.scheduled])
        return execute(out)

    engine.runner.execute = spy  # type: ignore[method-assign]
    prompts = [engine.tokenizer.encode(t) for t in TEXTS * 2]
    answers = llm.embed(TEXTS * 2)
    assert [o.prompt_token_ids for o in answers] == prompts
    assert sorted(n for step in steps for _, n in step) == sorted(len(p) for p in prompts)
    assert all(start == 0 for step in steps for start, _ in step)
    assert all(sum(n for _, n in step) <= 16 for step in steps)


def test_refusals(models: Path) -> None:
    folder = tiny_encoders.make_tiny_encoder_dir(models, "bert", seed=6)
    llm = LLM(str(folder), max_num_batched_tokens=16)
    with pytest.raises(RequestError, match="serves embed, it does not generate"):
        llm.engine.check_request([2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(RequestError) as long:
        llm.engine.check_request(list(range(5, 25)), PoolingParams("embed"))
    assert "16" in str(long.value)
    with pytest.raises(ConfigError, match="a model with bidirectional attention cannot generate"):
        LLM(str(folder), task="generate")
    with pytest.raises(ConfigError, match="cannot rerank without a classification head"):
        LLM(str(folder), task="rerank")
    with pytest.raises(EngineConfigError, match="takes no --speculative-config"):
        LLM(str(folder), speculative=SpeculativeConfig.parse("ngram"))

"""Tiny random BERT-family encoders built with transformers' own classes: BERT, XLM-R and
NomicBERT embedders (sentence-transformers folders) and cross-encoders, a WordPiece tokenizer
for them, and the same models written as GGUFs in llama.cpp's `bert` / `nomic-bert` names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from tests.tiny_models import randomized

_WORDS = ("the", "query", "document", "hello", "world", "cat", "dog", "sat", "on", "mat")
_BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # XLM-R's ids 0..3 (its pad_token_id 1)
GEOMETRY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "hidden_act": "gelu",
}
ENCODERS = ("bert", "xlm-roberta", "nomic_bert")


def wordpiece_tokenizer(specials: str = "bert") -> Tokenizer:
    """A lower-casing WordPiece over letters and a few words, with BERT's or RoBERTa's specials
    and pair template."""
    special = _BERT_SPECIALS if specials == "bert" else _ROBERTA_SPECIALS
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = [*special, *letters, *(f"##{c}" for c in letters), *_WORDS, ".", ",", "?", "!"]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    unk = "[UNK]" if specials == "bert" else "<unk>"
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    if specials == "bert":
        cls, sep = "[CLS]", "[SEP]"
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
        )
    else:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", 0), ("</s>", 2)],
        )
    tokenizer.add_special_tokens(list(special))
    return tokenizer


def unigram_tokenizer() -> Tokenizer:
    """XLM-R's kind of tokenizer, small: a Unigram over SentencePiece's `▁`-spaced pieces
    (`<s> <pad> </s> <unk>` at ids 0-3, letters, a few words and parts of words, each with a
    fixed log-probability), runs of spaces collapsed, RoBERTa's framing."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = [(t, 0.0) for t in _ROBERTA_SPECIALS] + [("\u2581", -2.0)]
    pieces += [(c, -4.0) for c in [*letters, ".", ",", "?", "!"]]
    pieces += [(f"\u2581{w}", -6.0 - i / 10) for i, w in enumerate(_WORDS)]
    pieces += [(part, -5.0) for part in ("at", "he", "og", "ment", "\u2581do", "\u2581th")]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=3))
    tokenizer.normalizer = normalizers.Replace(Regex(" {2,}"), " ")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.add_special_tokens(list(_ROBERTA_SPECIALS))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tokenizer


def _tokenizer(kind: str, vocab: str) -> Tokenizer:
    if vocab == "unigram":
        return unigram_tokenizer()
    return wordpiece_tokenizer("roberta" if kind == "xlm-roberta" else "bert")


def _config(kind: str, vocab: int, num_labels: int | None = None) -> Any:
    import transformers

    extra: dict[str, Any] = {"vocab_size": vocab}
    if num_labels is not None:
        extra["num_labels"] = num_labels
    if kind == "bert":
        return transformers.BertConfig(**GEOMETRY, max_position_embeddings=64, **extra)
    if kind == "xlm-roberta":
        return transformers.XLMRobertaConfig(
            **GEOMETRY, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
            bos_token_id=0, eos_token_id=2, **extra,
        )  # fmt: skip
    return transformers.NomicBertConfig(
        **{**GEOMETRY, "hidden_act": "silu"}, max_position_embeddings=64, head_dim=16, **extra
    )


def make_tiny_encoder_dir(
    tmp_path: Path,
    kind: str = "bert",
    *,
    pooling: str = "mean_tokens",
    seed: int = 0,
    vocab: str = "wordpiece",
) -> Path:
    """A tiny encoder saved as sentence-transformers saves one: the base model, a Pooling module
    (`mean_tokens` or `cls_token`) and Normalize; `vocab` "unigram": XLM-R's kind of tokenizer."""
    import transformers

    tokenizer = _tokenizer(kind, vocab)
    config = _config(kind, tokenizer.get_vocab_size())
    model = randomized(transformers.AutoModel.from_config(config), seed).eval()
    out = tmp_path / f"{kind}-embed-{pooling}-{seed}-{vocab}"
    model.save_pretrained(out)
    tokenizer.save(str(out / "tokenizer.json"))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]  # fmt: skip
    (out / "1_Pooling").mkdir()
    modes = {f"pooling_mode_{m}": m == pooling for m in ("lasttoken", "mean_tokens", "cls_token")}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(modes))
    (out / "modules.json").write_text(json.dumps(modules))
    return out


def make_tiny_cross_encoder_dir(
    tmp_path: Path, kind: str = "bert", seed: int = 0, vocab: str = "wordpiece"
) -> Path:
    """A tiny `*ForSequenceClassification` cross-encoder with one label (bge-reranker's shape:
    XLM-R, with `vocab` "unigram" its kind of tokenizer; ms-marco-MiniLM's: BERT)."""
    import transformers

    tokenizer = _tokenizer(kind, vocab)
    config = _config(kind, tokenizer.get_vocab_size(), num_labels=1)
    classes = {"bert": transformers.BertForSequenceClassification,
               "xlm-roberta": transformers.XLMRobertaForSequenceClassification}  # fmt: skip
    model = randomized(classes[kind](config), seed).eval()
    out = tmp_path / f"{kind}-cross-{seed}-{vocab}"
    model.save_pretrained(out)
    tokenizer.save(str(out / "tokenizer.json"))
    return out


def reference_embeddings(model_dir: Path, texts: list[str], pooling: str) -> torch.Tensor:
    """transformers' last hidden states of each text, pooled as `pooling` and normalized."""
    import transformers

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    rows = []
    for text in texts:
        encoding = tokenizer.encode(text)
        ids = torch.tensor([encoding.ids])
        with torch.no_grad():
            hidden = model(input_ids=ids, token_type_ids=torch.tensor([encoding.type_ids]))
        states = hidden.last_hidden_state[0]
        pooled = states[0] if pooling == "cls_token" else states.mean(dim=0)
        rows.append(torch.nn.functional.normalize(pooled, dim=0))
    return torch.stack(rows)


def reference_scores(model_dir: Path, pairs: list[tuple[str, str]]) -> list[float]:
    """transformers' sigmoid of a one-label cross-encoder's logit per (query, document)."""
    import transformers

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    scores = []
    for query, document in pairs:
        encoding = tokenizer.encode(query, document)
        with torch.no_grad():
            out = model(
                input_ids=torch.tensor([encoding.ids]),
                token_type_ids=torch.tensor([encoding.type_ids]),
            )
        scores.append(float(torch.sigmoid(out.logits[0, 0])))
    return scores


def write_tiny_encoder_gguf(model_dir: Path, out: Path, *, pooling_type: int = 1) -> Path:
    """A tiny BERT, XLM-R or NomicBERT folder (embedder or cross-encoder) as llama.cpp's
    converter writes it: arch `bert` or `nomic-bert`, F32 tensors in its names, `pooling_type`
    (1 mean, 2 CLS, 4 rank), and the vocabulary: WordPiece with word starts marked `▁` and `##`
    dropped, or a Unigram's pieces and scores (`t5`); XLM-R's position table cut to start at
    its position 0 (past its padding id)."""
    import gguf
    from safetensors.torch import load_file

    from nanoserve.runtime.loading.encoder_names import encoder_name

    config = json.loads((model_dir / "config.json").read_text())
    nomic = config["model_type"] == "nomic_bert"
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    offset = config["pad_token_id"] + 1 if config["model_type"] == "xlm-roberta" else 0
    writer = gguf.GGUFWriter(str(out), "nomic-bert" if nomic else "bert")
    writer.add_context_length(config["max_position_embeddings"] - offset)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config.get("layer_norm_eps", 1e-12))
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(pooling_type))
    if nomic:
        writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_token_type_count(config.get("type_vocab_size", 2))
    if tokenizer["model"]["type"] == "Unigram":
        _write_unigram_vocab(writer, tokenizer["model"])
    else:
        _write_wordpiece_vocab(writer, tokenizer["model"]["vocab"])
    for name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        gguf_name = _gguf_name(encoder_name(name))
        if gguf_name == "position_embd.weight":
            tensor = tensor[offset:]
        if gguf_name is not None:
            writer.add_tensor(gguf_name, np.ascontiguousarray(tensor.float().numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write_unigram_vocab(writer: Any, model: dict[str, Any]) -> None:
    """As llama.cpp's `_xlmroberta_set_vocab`: pieces, scores, types, XLM-R's special ids."""
    import gguf

    pieces = [piece for piece, _ in model["vocab"]]
    writer.add_tokenizer_model("t5")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(pieces)
    writer.add_token_scores([float(score) for _, score in model["vocab"]])
    kinds = {0: gguf.TokenType.CONTROL, 1: gguf.TokenType.CONTROL, 2: gguf.TokenType.CONTROL,
             3: gguf.TokenType.UNKNOWN}  # fmt: skip
    writer.add_token_types([kinds.get(i, gguf.TokenType.NORMAL) for i in range(len(pieces))])
    writer.add_add_space_prefix(True)
    writer.add_remove_extra_whitespaces(True)
    writer.add_bos_token_id(0)
    writer.add_pad_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_sep_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(True)  # its pair template: <s> a </s> </s> b </s>


def _write_wordpiece_vocab(writer: Any, ids: dict[str, int]) -> None:
    import gguf

    vocab = sorted(ids.items(), key=lambda kv: kv[1])
    writer.add_tokenizer_model("bert")

    def phantom(token: str) -> str:
        if token.startswith("[") and token.endswith("]"):
            return token
        return token[2:] if token.startswith("##") else "\u2581" + token

    writer.add_token_list([phantom(t) for t, _ in vocab])
    types = [
        gguf.TokenType.CONTROL if t.startswith("[") else gguf.TokenType.NORMAL for t, _ in vocab
    ]
    writer.add_token_types(types)
    writer.add_bos_token_id(ids["[CLS]"])  # llama.cpp keeps [CLS] as BOS
    writer.add_sep_token_id(ids["[SEP]"])
    writer.add_pad_token_id(ids["[PAD]"])
    writer.add_unk_token_id(ids["[UNK]"])


# llama.cpp's names (its convert_hf_to_gguf.py and tensor_mapping.py) of BERT's modules
_GGUF_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.self.qkv": "attn_qkv",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "intermediate.gate": "ffn_gate",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_GGUF_GLOBAL = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.LayerNorm": "token_embd_norm",
    "pooler.dense": "cls",
    "classifier": "cls.output",
    "classifier.dense": "cls",  # RoBERTa's head
    "classifier.out_proj": "cls.output",
}


def _gguf_name(name: str) -> str | None:
    stem, _, kind = name.rpartition(".")
    if stem.startswith("encoder.layer."):
        _, _, layer, part = stem.split(".", 3)
        return f"blk.{layer}.{_GGUF_LAYER[part]}.{kind}"
    return f"{_GGUF_GLOBAL[stem]}.{kind}" if stem in _GGUF_GLOBAL else None

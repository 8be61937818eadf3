"""A tiny EmbeddingGemma built with transformers' own class: Gemma 3 with bidirectional
attention (`use_bidirectional_attention`), saved as sentence-transformers saves
google/embeddinggemma-300m: the base model, mean pooling, two Dense projections without bias
or activation (hidden -> 2 * hidden -> hidden, the real one's 768 -> 3072 -> 768), Normalize."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.tiny_models import make_tiny_model_dir, write_tiny_gguf

WINDOW = 6  # config.json's sliding_window: each side sees 6 // 2 = 3 tokens past itself
HIDDEN = 64


def make_tiny_embedding_gemma_dir(tmp_path: Path, seed: int = 0) -> Path:
    import transformers
    from safetensors.torch import save_file

    causal = make_tiny_model_dir(
        tmp_path, "gemma3", seed=seed, use_bidirectional_attention=True, sliding_window=WINDOW
    )
    out = tmp_path / f"embeddinggemma-{seed}"
    (tmp_path / "causal-source").write_text(str(causal))  # what the GGUF writer converts
    base = transformers.AutoModelForCausalLM.from_pretrained(causal).model
    base.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_text((causal / name).read_text())
    modules: list[dict[str, Any]] = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]  # fmt: skip
    (out / "1_Pooling").mkdir()
    modes = {f"pooling_mode_{m}": m == "mean_tokens" for m in ("lasttoken", "mean_tokens", "cls_token")}  # fmt: skip
    (out / "1_Pooling" / "config.json").write_text(json.dumps(modes))
    generator = torch.Generator().manual_seed(seed + 1)
    for idx, (n_in, n_out) in enumerate(((HIDDEN, 2 * HIDDEN), (2 * HIDDEN, HIDDEN)), start=2):
        folder = f"{idx}_Dense"
        modules.append({"idx": idx, "name": str(idx), "path": folder,
                        "type": "sentence_transformers.models.Dense"})  # fmt: skip
        (out / folder).mkdir()
        config = {"in_features": n_in, "out_features": n_out, "bias": False,
                  "activation_function": "torch.nn.modules.linear.Identity"}  # fmt: skip
        (out / folder / "config.json").write_text(json.dumps(config))
        weight = torch.randn(n_out, n_in, generator=generator) * 0.2
        save_file({"linear.weight": weight}, str(out / folder / "model.safetensors"))
    modules.append({"idx": 4, "name": "4", "path": "4_Normalize",
                    "type": "sentence_transformers.models.Normalize"})  # fmt: skip
    (out / "modules.json").write_text(json.dumps(modules))
    return out


def write_tiny_embedding_gemma_gguf(folder: Path, out: Path, qtype: Any = None) -> Path:
    """`folder` as llama.cpp's converter writes EmbeddingGemma: arch `gemma-embedding`, the
    window as config.json states it (not halved), `pooling_type` mean, and the two Dense
    modules as `dense_2.weight`, `dense_3.weight`."""
    from safetensors.torch import load_file

    causal = Path((folder.parent / "causal-source").read_text())
    dense = {
        f"dense_{i}.weight": (
            load_file(str(folder / f"{i}_Dense" / "model.safetensors"))["linear.weight"].numpy(),
            None,
        )
        for i in (2, 3)
    }
    sizes = {f"dense_{i}_feat_{end}": int(dense[f"dense_{i}.weight"][0].shape[axis])
             for i in (2, 3) for end, axis in (("in", 1), ("out", 0))}  # fmt: skip
    return write_tiny_gguf(
        causal,
        out,
        qtype=qtype,
        arch="gemma-embedding",
        pooling_type=1,
        raw_tensors=dense,
        uint32_keys=sizes,
    )


def reference_embedding(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """transformers' bidirectional last hidden states of ids, mean-pooled, through both Dense
    projections, normalized: [hidden] float32."""
    import transformers
    from safetensors.torch import load_file

    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    assert model.config.use_bidirectional_attention
    with torch.no_grad():
        x = model(input_ids=torch.tensor([ids])).last_hidden_state[0].double().mean(0)
    for folder in ("2_Dense", "3_Dense"):
        x = x @ load_file(str(model_dir / folder / "model.safetensors"))["linear.weight"].double().T
    return torch.nn.functional.normalize(x, dim=0).float()

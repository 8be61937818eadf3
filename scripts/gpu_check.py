"""The GPU check: everything a lent GPU machine can tell us, in one run of a few minutes.

    python3 scripts/gpu_check.py [--out DIR] [--device cuda|cpu] [--skip-tests] ...

Run by scripts/gpu-check.sh and `nox -s gpu`. It needs only what the GPU machine has (torch,
pytest, tokenizers; FACTS.md, "The GPU machine"): no package index, no wheels, no embedded
model. The model is a random-weight one of SmolLM2-135M's shape, built in memory.

1. runs the `gpu`-marked tests (`pytest -m gpu tests`) and counts the outcomes;
2. builds the random-weight model and a tokenizer covering its vocabulary;
3. checks the greedy tokens of an eager engine, a bucketed-eager engine and a warmed, recorded
   engine over a staggered workload (requests join and leave mid-run): all equal, and no
   recording made after the warm-up;
4. times the forward, eager against replay, at 1, 8 and 32 rows (CUDA events), and
   `engine.step()` wall time of an eager and of a recorded engine;
5. counts host syncs per decode step (`torch.cuda.set_sync_debug_mode`), by source line, and
   checks that a replay makes none;
6. warms the default warm list as `build_engine` would and reports its seconds and pool bytes;
7. writes gpu-check.json and gpu-check.txt to --out ($OUT, else /tmp) and exits 1 on any
   correctness failure (a failed test, a token mismatch, a recording after the warm-up, a sync
   inside a replay, a section that raised).

Without CUDA it is a dry run on the CPU at a reduced size (2 layers, rows 1/2/4), so that the
code path cannot rot: each CUDA-only part is skipped with one "SKIP (no CUDA): ..." line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
import traceback
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC_PATHS = [ROOT / "packages" / p / "src" for p in ("core", "runtime", "api")]
# The source trees first, so the working tree is what runs whether or not nanoserve is
# installed; the repository root for `benchmarks` and `tests.runtime.capture_helpers`.
for _path in reversed([*SRC_PATHS, ROOT]):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402 - after the path set-up, like everything below
from tokenizers import Tokenizer as HfTokenizer  # noqa: E402
from tokenizers import models, pre_tokenizers  # noqa: E402

from benchmarks.decode_step import (  # noqa: E402
    EXPLICIT_WARM_SECONDS,
    forward_ms,
    warm_exactly,
)
from nanoserve.core import Shape, warm_shapes  # noqa: E402
from nanoserve.runtime.decode.warmup import warm_batch  # noqa: E402
from nanoserve.runtime.engine.boot.build import warm_engine  # noqa: E402
from nanoserve.runtime.engine.config.engine_config import EngineConfig  # noqa: E402
from nanoserve.runtime.engine.engine import Engine  # noqa: E402
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams  # noqa: E402
from nanoserve.runtime.loading.model_config import ModelConfig  # noqa: E402
from nanoserve.runtime.model.llama import LlamaModel, weight_shapes  # noqa: E402
from nanoserve.runtime.text.tokenizer import Tokenizer  # noqa: E402

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0-2, as SmolLM2's
WEIGHT_STD = 0.02  # small enough that logits are spread, not saturated to one token
SYNC_WARNING = "synchronizing CUDA operation"
REPORTED_WARNINGS = ("DeprecationWarning", "PendingDeprecationWarning", "FutureWarning")
# What each line of the table claims: a strict check fails the run, a reported one is data.
CLAIMS = (
    "strict: the gpu tests pass; persistent (bucketed, eager) == recorded, bit for bit (the same"
    " shapes run the same kernels, logits over the bucket's rows on both); no recording after"
    " the warm-up; a replay makes no host sync",
    "reported: eager (unpadded) == recorded, strict only where the model claims batch"
    " invariance (nanoserve's CPU kernels, torch on a CPU), since cuBLAS may pick another"
    " kernel per row count; timings; deprecation warnings; pool and needed bytes",
)
WARM_CONFIG_KEYS = (
    "max_batch",
    "max_model_len",
    "width_multiple",
    "kv_budget_bytes",
    "warm_max_rows",
    "warm_max_width",
    "warm_budget_bytes",
    "warm_seconds",
)


@dataclass
class Sizes:
    """How big each part runs: the full check on CUDA, a reduced dry run on a CPU."""

    layers: int
    rows: tuple[int, ...]  # forward and step timing
    width: int  # the timing engines' max_model_len and the timed bucket width
    requests: int  # in the staggered workload
    max_batch: int  # the correctness engines'
    max_model_len: int
    width_multiple: int
    repeats: int  # timed calls per forward cell
    steps: int  # timed engine steps per step cell
    sync_steps: int  # steps counted under sync debug mode
    dtypes: tuple[str, ...]
    default_warm: dict[str, Any]  # EngineConfig overrides of the "default warm list" engine


FULL = Sizes(
    layers=30,
    rows=(1, 8, 32),
    width=512,
    requests=24,
    max_batch=32,
    max_model_len=512,
    width_multiple=64,
    repeats=20,
    steps=16,
    sync_steps=4,
    dtypes=("float32", "bfloat16"),
    default_warm={},  # EngineConfig's own defaults: 32 rows, 4096 tokens, 3 s on CUDA
)
DRY = Sizes(
    layers=2,
    rows=(1, 2, 4),
    width=64,
    requests=6,
    max_batch=4,
    max_model_len=64,
    width_multiple=16,
    repeats=3,
    steps=3,
    sync_steps=2,
    dtypes=("float32",),
    default_warm={
        "max_batch": 4,
        "max_model_len": 128,
        "width_multiple": 32,
        "kv_budget_bytes": 1 << 24,  # not 1 GiB: making that resident costs seconds on a CPU
        "warm_seconds": 5.0,
    },
)


@dataclass
class Report:
    """What the run found: data for the JSON, lines for the table, and the failures."""

    data: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def skip(self, what: str) -> None:
        self.say(f"SKIP (no CUDA): {what}")
        self.data.setdefault("skipped", []).append(what)

    def fail(self, what: str) -> None:
        self.say(f"FAIL: {what}")
        self.failures.append(what)

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """A section that raises is a failure, and the run goes on: a GPU run is scarce, and
        one broken part must not cost the measurements of the others."""
        self.say()
        self.say(f"== {name}")
        started = time.perf_counter()
        try:
            yield
        except Exception as error:  # reported, counted, and the run goes on
            self.data.setdefault("errors", {})[name] = traceback.format_exc()
            self.fail(f"{name} raised {type(error).__name__}: {error}")
            traceback.print_exc()
        self.data.setdefault("section_seconds", {})[name] = round(time.perf_counter() - started, 2)


# -- the model ---------------------------------------------------------------------------------


def smollm2_config(layers: int) -> ModelConfig:
    """SmolLM2-135M's shape (its config.json), with `layers` of its 30 layers."""
    return ModelConfig(
        architecture="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=layers,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        rope_scaling=None,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        max_position_embeddings=8192,
        eos_token_ids=(2,),
        bos_token_id=1,
    )


def random_weights(
    config: ModelConfig, device: torch.device, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Every weight the model takes (`weight_shapes`): N(0, 0.02²) matrices, unit norms; drawn
    on the device (fast there)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return {
        name: torch.ones(shape, device=device)
        if name.endswith("norm.weight")
        else torch.randn(shape, generator=generator, device=device) * WEIGHT_STD
        for name, shape in weight_shapes(config).items()
    }


def make_tokenizer(vocab_size: int) -> Tokenizer:
    """A word-level tokenizer naming every id of the vocabulary (`<t123>`), specials at 0-2:
    built in memory in milliseconds, and any id a random model emits decodes."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab |= {f"<t{i}>": i for i in range(len(SPECIAL_TOKENS), vocab_size)}
    backend = HfTokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return Tokenizer(backend, eos_token_ids=(2,), bos_token_id=1)


def build_model(
    config: ModelConfig, dtype: str, device: torch.device, max_positions: int
) -> LlamaModel:
    return LlamaModel(
        config,
        random_weights(config, device),
        dtype=getattr(torch, dtype),
        device=device,
        max_positions=max_positions,
    )


def kv_budget(model: LlamaModel, slots: int, block_size: int) -> int:
    """Bytes for `slots` token slots (whole blocks, plus the sink)."""
    cfg = model.config
    per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * model.kv_dtype.itemsize
    blocks = -(-slots // block_size) + 1
    return per_slot * (blocks * block_size + 1)


# -- workloads ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrival:
    request_id: str
    step: int  # the engine step before which it is added
    prompt: tuple[int, ...]
    max_tokens: int


def staggered_workload(num: int, max_len: int, vocab: int, seed: int = 0) -> list[Arrival]:
    """A third of the requests start together, the rest join mid-run; prompt and output
    lengths differ, so rows leave at different steps and contexts cross width buckets."""
    rng = random.Random(seed)
    arrivals = []
    for i in range(num):
        prompt_len = rng.randrange(3, max_len // 3)
        max_tokens = rng.randrange(4, min(max_len - prompt_len, max_len // 2))
        step = 0 if i < max(1, num // 3) else rng.randrange(1, 4 * num)
        prompt = tuple(rng.randrange(len(SPECIAL_TOKENS), vocab) for _ in range(prompt_len))
        arrivals.append(Arrival(f"r{i}", step, prompt, max_tokens))
    return arrivals


def run_workload(engine: Engine, arrivals: Sequence[Arrival]) -> dict[str, list[int]]:
    """Greedy tokens per request, requests added at their arrival steps."""
    pending = sorted(arrivals, key=lambda a: a.step)
    tokens: dict[str, list[int]] = {a.request_id: [] for a in arrivals}
    step = 0
    while pending or engine.has_unfinished:
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            params = SamplingParams(max_tokens=a.max_tokens, temperature=0, ignore_eos=True)
            engine.add_request(a.request_id, a.prompt, params)
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.token_ids)
        step += 1
    engine.check_blocks()
    return tokens


def first_mismatch(a: dict[str, list[int]], b: dict[str, list[int]]) -> str | None:
    for request_id in sorted(a):
        x, y = a[request_id], b.get(request_id, [])
        if x != y:
            at = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
            at = min(len(x), len(y)) if at is None else at
            return (
                f"{request_id} differs at token {at}: {x[at : at + 3]} vs {y[at : at + 3]}"
                f" ({len(x)} vs {len(y)} tokens)"
            )
    return None


def start_decoding(engine: Engine, rows: int, prompt_len: int, max_tokens: int) -> list[str]:
    """`rows` requests, prefilled and one decode step in: every following step is decode-only."""
    ids = [f"t{rows}-{i}" for i in range(rows)]
    for i, request_id in enumerate(ids):
        prompt = [(i * 131 + j * 7) % 40000 + 17 for j in range(prompt_len)]
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        engine.add_request(request_id, prompt, params)
    started: set[str] = set()  # a request's first token comes from its last prefill chunk
    while len(started) < rows:
        started |= {d.request_id for d in engine.step() if d.token_ids}
    engine.step()
    return ids


# -- host syncs --------------------------------------------------------------------------------


@contextmanager
def counting_syncs() -> Iterator[Counter[str]]:
    """Count torch's sync warnings by the Python line that made them."""
    counts: Counter[str] = Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if SYNC_WARNING in str(w.message):
            counts[f"{_short(w.filename)}:{w.lineno}"] += 1


def _short(filename: str) -> str:
    path = Path(filename)
    for root in (*SRC_PATHS, ROOT):
        if path.is_relative_to(root):
            return str(path.relative_to(root))
    return path.name


def replay_is_sync_free(engine: Engine, shape: Shape) -> bool:
    """Replay one recording with sync debug mode at "error": any sync inside raises."""
    recordings = engine.runner.recordings
    assert recordings is not None
    batch = warm_batch(recordings, engine.pool, shape)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            recordings.replay(batch.plan)
        return True
    except RuntimeError as error:
        if SYNC_WARNING not in str(error):
            raise
        return False
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


# -- the sections ------------------------------------------------------------------------------


def run_gpu_tests(report: Report, out: Path, timeout_s: float) -> None:
    """`pytest -m gpu tests` in a subprocess; outcomes from its JUnit XML."""
    junit = out / "gpu-tests.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*SRC_PATHS, ROOT]))}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] += os.pathsep + os.environ["PYTHONPATH"]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-q", "-p", "no:cacheprovider"]
    cmd += [f"--junitxml={junit}"]
    # The suite turns warnings into errors (pyproject.toml); the machine's own transformers,
    # torch and pytest may deprecate what ours do not. Those are reported, not failures: a
    # command-line -W outranks the ini's "error".
    cmd += [f"-Wdefault::{category}" for category in REPORTED_WARNINGS]
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        report.fail(f"gpu tests ran past {timeout_s:.0f} s")
        return
    (out / "gpu-tests.txt").write_text(proc.stdout + proc.stderr)
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    if junit.is_file():
        for suite in ET.parse(junit).getroot().iter("testsuite"):
            tests = int(suite.get("tests", 0))
            failed, errors = int(suite.get("failures", 0)), int(suite.get("errors", 0))
            skipped = int(suite.get("skipped", 0))
            counts["passed"] += tests - failed - errors - skipped
            counts["failed"] += failed
            counts["errors"] += errors
            counts["skipped"] += skipped
    summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    seconds = time.perf_counter() - started
    warned = re.search(r"(\d+) warnings?", summary)
    counts["warnings"] = int(warned.group(1)) if warned else 0
    report.data["tests"] = {**counts, "returncode": proc.returncode, "summary": summary}
    report.say(
        f"gpu tests: {counts['passed']} passed, {counts['failed']} failed, {counts['errors']}"
        f" errors, {counts['skipped']} skipped ({seconds:.0f} s; exit {proc.returncode});"
        f" {counts['warnings']} warnings, reported (gpu-tests.txt)"
    )
    # 5: nothing collected (no gpu-marked test): not a failure of the code under test.
    if counts["failed"] or counts["errors"] or proc.returncode not in (0, 5):
        report.fail(f"gpu tests: {summary} (see gpu-tests.txt)")


def check_tokens(report: Report, model: LlamaModel, tokenizer: Tokenizer, sizes: Sizes) -> None:
    """Eager, bucketed-eager and warmed-recorded engines give the same greedy tokens over the
    staggered workload, and the warmed one records nothing after its warm-up."""
    arrivals = staggered_workload(sizes.requests, sizes.max_model_len, model.config.vocab_size)
    slots = sum(len(a.prompt) + a.max_tokens for a in arrivals)
    base: dict[str, Any] = {
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "max_batch": sizes.max_batch,
        "max_model_len": sizes.max_model_len,
        "width_multiple": sizes.width_multiple,
        "block_size": 16,
        "kv_budget_bytes": kv_budget(model, slots, 16),
    }
    # "persistent": the recorded mode's bucket shapes and input storage, run eagerly.
    tokens = {
        name: run_workload(
            Engine.from_config(model, tokenizer, EngineConfig(**base, decode_mode=name)), arrivals
        )
        for name in ("eager", "persistent")
    }
    config = EngineConfig(**base, decode_mode="recorded", warm_seconds=EXPLICIT_WARM_SECONDS)
    engine = Engine.from_config(model, tokenizer, config)
    recordings, buckets = engine.runner.recordings, engine.runner.buckets
    assert recordings is not None and buckets is not None
    warm_report = warm_exactly(engine, warm_shapes(buckets))
    before = recordings.stats()
    tokens["recorded"] = run_workload(engine, arrivals)
    after = recordings.stats()
    new_recordings = after.recordings - before.recordings
    cold = after.cold_recordings
    num_tokens = sum(map(len, tokens["eager"].values()))
    result = {
        "requests": len(arrivals),
        "tokens": num_tokens,
        "warm_shapes": warm_report.num_recorded,
        "eager_equals_recorded": tokens["eager"] == tokens["recorded"],
        "persistent_equals_recorded": tokens["persistent"] == tokens["recorded"],
        "recordings_after_warmup": new_recordings,
        "cold_recordings": cold,
        "replays": after.replays,
        "eager_fallback_steps": after.eager_fallback_steps,
    }
    report.data["correctness"] = result
    report.say(
        f"staggered workload: {len(arrivals)} requests, {num_tokens} greedy tokens,"
        f" {base['dtype']}, warm list {warm_report.num_recorded} shapes"
    )
    # Same bucket shapes run the same kernels: persistent == recorded must hold everywhere.
    # Across shapes (eager rows vs a padded bucket) only the CPU's batch-invariant mode claims
    # bit-identity; on CUDA it is reported (cuBLAS may pick another kernel per row count).
    cross_shape_claimed = model.invariance == "batch and bucket"
    result["cross_shape_claimed"] = cross_shape_claimed
    for label, a, b, strict in (
        ("eager == recorded", "eager", "recorded", cross_shape_claimed),
        ("persistent (bucketed, eager) == recorded: same shapes", "persistent", "recorded", True),
    ):
        mismatch = first_mismatch(tokens[a], tokens[b])
        verdict = "PASS" if mismatch is None else ("FAIL, " if strict else "differs, ") + mismatch
        report.say(f"  {label}: {verdict}" + ("" if strict else " (reported, not claimed)"))
        if mismatch is not None and strict:
            report.failures.append(f"{label}: {mismatch}")
    ok = new_recordings == 0 and cold == 0
    report.say(
        f"  recordings after the warm-up: {new_recordings} (cold {cold}):"
        f" {'PASS' if ok else 'FAIL'}; replays {after.replays},"
        f" eager fallback steps {after.eager_fallback_steps}"
    )
    if not ok:
        report.failures.append(f"{new_recordings} recordings ({cold} cold) after the warm-up")


def time_dtype(
    report: Report, model: LlamaModel, tokenizer: Tokenizer, sizes: Sizes, cuda: bool
) -> None:
    """Forward eager vs replay, step wall time eager vs recorded, and syncs per step."""
    dtype = str(model.dtype).removeprefix("torch.")
    max_rows = max(sizes.rows)
    max_tokens = 2 + sizes.steps + sizes.sync_steps + 2
    prompt_len = sizes.width // 2  # the context stays in one width bucket while timed
    base: dict[str, Any] = {
        "device": str(model.device),
        "dtype": dtype,
        "max_batch": max_rows,
        "max_model_len": sizes.width,
        "width_multiple": sizes.width_multiple,
        "max_num_batched_tokens": max(512, max_rows * (prompt_len + 1)),
        "kv_budget_bytes": kv_budget(model, max_rows * sizes.width, 16),
    }
    config = EngineConfig(**base, decode_mode="recorded", warm_seconds=EXPLICIT_WARM_SECONDS)
    recorded = Engine.from_config(model, tokenizer, config)
    eager = Engine.from_config(model, tokenizer, EngineConfig(**base))
    warm_report = warm_exactly(recorded, warm_shapes(recorded.runner.buckets))  # type: ignore[arg-type]
    recordings = recorded.runner.recordings
    assert recordings is not None

    forward = forward_ms(recorded, sizes.rows, sizes.width, sizes.repeats)
    for row in forward:
        row["dtype"] = dtype
    report.data.setdefault("forward", []).extend(forward)
    if cuda:
        sync_free = replay_is_sync_free(recorded, Shape(max_rows, sizes.width))
        report.data.setdefault("replay_sync_free", {})[dtype] = sync_free
        if not sync_free:
            report.fail(f"{dtype}: a replay synchronized the host")

    steps = []
    for rows in sizes.rows:
        row: dict[str, Any] = {"dtype": dtype, "rows": rows}
        for name, engine in (("eager", eager), ("recorded", recorded)):
            ids = start_decoding(engine, rows, prompt_len, max_tokens)
            if cuda:
                torch.cuda.synchronize()
            times = []
            for _ in range(sizes.steps):
                started = time.perf_counter()
                engine.step()  # returns host token ids: the step is over when it returns
                times.append(time.perf_counter() - started)
            row[f"{name}_step_ms"] = statistics.median(times) * 1000
            if cuda:
                with counting_syncs() as syncs:
                    for _ in range(sizes.sync_steps):
                        engine.step()
                row[f"{name}_syncs_per_step"] = sum(syncs.values()) / sizes.sync_steps
                row[f"{name}_sync_sites"] = {
                    k: v / sizes.sync_steps for k, v in syncs.most_common()
                }
            for request_id in ids:
                engine.abort(request_id)
            engine.check_blocks()
        row["speedup"] = row["eager_step_ms"] / row["recorded_step_ms"]
        steps.append(row)
    report.data.setdefault("step", []).extend(steps)
    stats = recordings.stats()
    if stats.recordings != warm_report.num_recorded:
        report.fail(f"{dtype}: the timing engine recorded after its warm-up: {stats.as_dict()}")
    report.say(
        f"{dtype}: timing engines warmed {warm_report.num_recorded} shapes in"
        f" {warm_report.total_seconds:.2f} s; timed rows {', '.join(map(str, sizes.rows))}"
    )
    report.data.setdefault("timing_engines", {})[dtype] = {
        "warm_shapes": warm_report.num_recorded,
        "warm_seconds": round(warm_report.total_seconds, 3),
        "recordings_after_warmup": stats.recordings - warm_report.num_recorded,
        "pool_bytes": stats.pool_bytes,
    }


def check_default_warm(
    report: Report,
    model: LlamaModel,
    tokenizer: Tokenizer,
    overrides: dict[str, Any],
    cuda: bool,
    *,
    label: str = "default_warm",
) -> None:
    """A warm list warmed as build_engine warms it (memory and time budgets): `overrides` on
    EngineConfig's defaults (none: the default warm list)."""
    config = EngineConfig(
        decode_mode="recorded",
        device=str(model.device),
        dtype=str(model.dtype).removeprefix("torch."),
        **overrides,
    )
    engine = Engine.from_config(model, tokenizer, config)
    said: list[str] = []
    warm_report = warm_engine(engine, say=said.append)
    for line in said:
        report.say(f"  {line}")
    assert engine.runner.recordings is not None
    stats = engine.runner.recordings.stats()
    buckets = engine.runner.buckets
    assert buckets is not None
    result = {
        "config": {k: getattr(engine.config, k) for k in WARM_CONFIG_KEYS},
        "full_list": len(warm_shapes(buckets)),
        "recorded": warm_report.num_recorded,
        "skipped": len(warm_report.skipped),
        "estimated_seconds": warm_report.estimate.seconds,
        "seconds": warm_report.total_seconds,
        "needed_bytes": stats.needed_bytes,
        "pool_bytes": stats.pool_bytes,
        "pool_sharing_ratio": stats.pool_sharing_ratio,
        "kv_pool_bytes": engine.pool_plan.total_bytes,
    }
    report.data[label] = result
    report.say(
        f"{label.replace('_', ' ')} list: {warm_report.num_recorded} of {result['full_list']} shapes"
        f" ({len(warm_report.skipped)} skipped), estimated"
        f" {warm_report.estimate.seconds:.2f} s, took {warm_report.total_seconds:.2f} s"
    )
    if cuda:
        report.say(
            f"  graph pool: {_mib(stats.pool_bytes)}, discarded probes included; the kept"
            f" shapes need {_mib(stats.needed_bytes)} at their peaks (sharing ratio"
            f" {stats.pool_sharing_ratio:.2f}); K/V pool {_mib(engine.pool_plan.total_bytes)}"
        )
    elif label == "default_warm":
        report.skip("graph pool bytes (frozen-call recordings hold no pool)")


def release_memory(cuda: bool) -> None:
    """Between sections: engines hold K/V pools and recordings; free them before the next."""
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _mib(value: object) -> str:
    return f"{value / 2**20:,.1f} MiB" if isinstance(value, int | float) else "n/a"


# -- the table ---------------------------------------------------------------------------------


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> list[str]:
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return lines


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return "-" if value is None else str(value)


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "cuda": torch.version.cuda,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {"gpu": props.name, "gpu_memory_bytes": props.total_memory}
    try:
        env["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # no git on the GPU machine: fine
        env["commit"] = None
    return env


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, help="default: 30 on CUDA, 2 on a CPU")
    parser.add_argument("--rows", help="timed row counts, e.g. 1,8,32 (default by device)")
    parser.add_argument("--requests", type=int, help="in the staggered workload (24 / 6)")
    parser.add_argument("--dtypes", help="timed dtypes, e.g. float32,bfloat16 (default by device)")
    parser.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu")
    parser.add_argument("--tests-timeout", type=float, default=180.0)
    parser.add_argument(
        "--full-warm-seconds",
        type=float,
        default=60.0,
        help="CUDA: also warm the default list under this time budget, not 3 s (0: skip)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch.cuda.is_available() is False")
    sizes = FULL if cuda else DRY
    if args.layers:
        sizes = replace(sizes, layers=args.layers)
    if args.rows:
        sizes = replace(sizes, rows=tuple(int(r) for r in args.rows.split(",")))
    if args.requests:
        sizes = replace(sizes, requests=args.requests)
    if args.dtypes:
        sizes = replace(sizes, dtypes=tuple(args.dtypes.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report()
    report.data["environment"] = env = environment(device)
    report.data["sizes"] = asdict(sizes)
    where = env.get("gpu") or f"CPU ({env['cpu']}), dry run"
    report.say(
        f"nanoserve GPU check: {where}; torch {env['torch']} (CUDA {env['cuda']}),"
        f" python {env['python']}, commit {env['commit']}"
    )
    report.say(
        f"model: random N(0, {WEIGHT_STD}²) weights of SmolLM2-135M's shape, {sizes.layers} layers"
    )
    for claim in CLAIMS:
        report.say(claim)
    started = time.perf_counter()
    if not cuda:
        report.skip("the gpu-marked tests run, and skip themselves")

    with report.section("1. gpu-marked tests"):
        if args.skip_tests:
            report.say("not run (--skip-tests)")
        else:
            run_gpu_tests(report, args.out, args.tests_timeout)

    config = smollm2_config(sizes.layers)
    tokenizer = make_tokenizer(config.vocab_size)
    # One model per dtype, shared by that dtype's engines (a model holds no request state).
    # Its rotary table covers the longest context any engine here serves.
    max_positions = max(sizes.width, sizes.max_model_len, 4096 if cuda else 128)
    models: dict[str, LlamaModel] = {}

    def model_of(dtype: str) -> LlamaModel:
        if dtype not in models:
            models[dtype] = build_model(config, dtype, device, max_positions)
        return models[dtype]

    with report.section("2-3. greedy tokens: eager == persistent == warmed and recorded"):
        check_tokens(report, model_of("float32"), tokenizer, sizes)
    release_memory(cuda)

    if not cuda:
        report.skip("CUDA-event timing (forward timed by wall clock; a frozen call: ~1.0x)")
        report.skip("host syncs per step (torch.cuda.set_sync_debug_mode)")
    for dtype in sizes.dtypes:
        with report.section(f"4-5. timing and syncs, {dtype}"):
            time_dtype(report, model_of(dtype), tokenizer, sizes, cuda)
        release_memory(cuda)
    timer = "CUDA events" if cuda else "wall clock, median"
    report.say()
    report.say(f"forward at width {sizes.width}, eager vs replay ({timer}), ms:")
    for line in table(
        report.data.get("forward", []), ("dtype", "rows", "eager_ms", "replay_ms", "speedup")
    ):
        report.say(f"  {line}")
    columns = ["dtype", "rows", "eager_step_ms", "recorded_step_ms", "speedup"]
    if cuda:
        columns += ["eager_syncs_per_step", "recorded_syncs_per_step"]
    report.say(f"engine.step() wall time, decode at context ~{sizes.width // 2}, median ms:")
    for line in table(report.data.get("step", []), columns):
        report.say(f"  {line}")
    if cuda:
        for row in report.data.get("step", []):
            sites = ", ".join(f"{k} x{v:g}" for k, v in row["recorded_sync_sites"].items())
            report.say(f"  syncs, recorded, {row['dtype']} {row['rows']} rows: {sites or 'none'}")

    with report.section("6. the default warm list"):
        if not cuda:
            report.say(f"reduced for the dry run: {sizes.default_warm}")
        check_default_warm(report, model_of(sizes.dtypes[0]), tokenizer, sizes.default_warm, cuda)
    release_memory(cuda)
    if not cuda:
        report.skip("the untrimmed warm list (what every recording's pool bytes add up to)")
    elif args.full_warm_seconds > 0:
        with report.section("6b. the untrimmed warm list, within --full-warm-seconds"):
            check_default_warm(
                report,
                model_of(sizes.dtypes[0]),
                tokenizer,
                {"warm_seconds": args.full_warm_seconds},
                cuda,
                label="untrimmed_warm",
            )
        release_memory(cuda)

    report.data["seconds"] = round(time.perf_counter() - started, 1)
    report.data["failures"] = report.failures
    report.say()
    verdict = "PASS" if not report.failures else f"FAIL ({len(report.failures)})"
    report.say(f"RESULT: {verdict} in {report.data['seconds']:.0f} s")
    for failure in report.failures:
        report.say(f"  - {failure}")
    (args.out / "gpu-check.json").write_text(json.dumps(report.data, indent=2, default=str))
    (args.out / "gpu-check.txt").write_text("\n".join(report.lines) + "\n")
    print(f"wrote {args.out / 'gpu-check.json'} and {args.out / 'gpu-check.txt'}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())

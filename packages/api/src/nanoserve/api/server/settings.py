"""ServerSettings: the engine's config plus the server's own, from flags or NANOSERVE_* vars.

One table of options serves both the command line (`--max-batch 8`) and the environment
(`NANOSERVE_MAX_BATCH=8`), so `litestar run` and `nanoserve serve` take the same names.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from nanoserve.api.kv_events.config import KVEventsConfig
from nanoserve.core.kv_cache_dtype import KvCacheDtypeError, parse_kv_cache_dtype
from nanoserve.runtime import (
    SERVER_DEFAULTS,
    TASKS,
    EngineConfig,
    EngineConfigError,
    SpeculativeConfig,
    SpeculativeConfigError,
)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_bytes(text: str) -> int:
    """'1073741824', '512MB', '1GiB', '64M' -> bytes."""
    match = _SIZE.match(str(text))
    if not match:
        raise EngineConfigError(f"{text!r} is not a size (try 512MiB, 1GB or a number of bytes)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    base = 1024 if "i" in unit else 1000
    power = "bkmgt".index(unit[0]) if unit else 0
    return int(number * (base**power if unit and unit[0] != "b" else 1))


def parse_seconds(text: str) -> float | None:
    """'30', '2.5' -> seconds; '0', 'off' or '' -> None (no deadline)."""
    lowered = str(text).strip().lower()
    if lowered in ("", "0", "off", "none"):
        return None
    try:
        seconds = float(lowered)
    except ValueError:
        raise EngineConfigError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0 or seconds == float("inf"):
        raise EngineConfigError(f"{text!r}: a timeout must be a positive number of seconds")
    return seconds


def parse_prefill_budget(text: str) -> str | int:
    """'auto', 'off', or a positive number of prompt tokens per step while sequences decode."""
    return _word_or_count(
        text, ("auto", "off"), "tokens", "a prefill budget must be at least 1 token"
    )


def parse_task(text: str) -> str:
    """auto, generate, embed or rerank."""
    task = str(text).strip().lower()
    if task not in TASKS:
        raise EngineConfigError(f"--task must be one of {', '.join(TASKS)}, got {text!r}")
    return task


def parse_threads(text: str) -> int | str:
    """'auto' (the CPUs this process may run on) or a positive number of threads."""
    return _word_or_count(text, ("auto",), "threads", "a server needs at least 1 thread")


def parse_kv_cache_dtype_flag(text: str) -> str:
    """A --kv-cache-dtype as EngineConfig takes it, its words checked here (what `auto` is,
    and whether the model can read blocks, the engine decides)."""
    try:
        parse_kv_cache_dtype(text, torch.float16)
    except KvCacheDtypeError as error:
        raise EngineConfigError(str(error).removeprefix("--kv-cache-dtype").lstrip(": ")) from None
    return str(text).strip().lower()


def parse_checkpoints(text: str) -> int | str:
    """'auto' or a number of state checkpoints (0: a hybrid's prefix cache is off)."""
    lowered = str(text).strip().lower()
    if lowered == "0":
        return 0
    return _word_or_count(text, ("auto",), "checkpoints", "use 0 to keep none")


def _word_or_count(text: str, words: tuple[str, ...], noun: str, at_least_one: str) -> str | int:
    lowered = str(text).strip().lower()
    if lowered in words:
        return lowered
    try:
        count = int(lowered)
    except ValueError:
        raise EngineConfigError(
            f"{text!r} is not {', '.join(words)} or a number of {noun}"
        ) from None
    if count < 1:
        raise EngineConfigError(f"{text!r}: {at_least_one}")
    return count


def parse_bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise EngineConfigError(f"{text!r} is not a boolean (use 1/0, true/false)")


@dataclass(frozen=True, slots=True)
class Option:
    flag: str  # --max-batch; the variable is NANOSERVE_MAX_BATCH
    dest: str  # the field of EngineConfig or ServerSettings
    parse: Callable[[str], object]
    help: str

    @property
    def env(self) -> str:
        return "NANOSERVE_" + self.flag.removeprefix("--").replace("-", "_").upper()


OPTIONS: tuple[Option, ...] = (
    Option("--model", "model", str, "Hugging Face directory or GGUF file (default: embedded)"),
    Option(
        "--dtype",
        "dtype",
        str,
        "auto | float32 | bfloat16 (default auto: bf16 on the CPU kernels or where the CPU has"
        " it natively, else fp32)",
    ),
    Option("--device", "device", str, "cpu | cuda (default cpu)"),
    Option(
        "--quantize",
        "quantize",
        str,
        "auto | gguf | q4 | q8 | int8 | none (default auto: gguf, a GGUF's tensors each in its"
        " own blocks on nanoserve's CPU kernels; else none: the dtype)",
    ),
    Option(
        "--threads",
        "threads",
        parse_threads,
        "compute threads, the kernels' and torch's: N or auto (default auto: the CPUs this"
        " process may run on)",
    ),
    Option(
        "--task",
        "task",
        parse_task,
        "what the model serves: auto (what its files say: a sentence-transformers folder or a"
        " GGUF's pooling type embeds, a *ForSequenceClassification reranks; else generate),"
        " generate, embed or rerank",
    ),
    Option("--max-batch", "max_batch", int, "rows a step may hold (default 32)"),
    Option("--max-model-len", "max_model_len", int, "longest context served"),
    Option("--max-num-batched-tokens", "max_num_batched_tokens", int, "token budget per step"),
    Option(
        "--prefill-budget",
        "prefill_budget",
        parse_prefill_budget,
        "prompt tokens a step may carry while sequences decode: auto (measured at boot, a mixed"
        " step within 1.5x of the decode step; the default), N, or off",
    ),
    Option("--block-size", "block_size", int, "K/V slots per block (default 16)"),
    Option("--kv-budget", "kv_budget_bytes", parse_bytes, "bytes for the K/V pool (default 1GiB)"),
    Option(
        "--kv-cache-dtype",
        "kv_cache_dtype",
        parse_kv_cache_dtype_flag,
        "how the K/V pool stores values: auto (float16 under nanoserve's CPU kernels, else the"
        " model dtype), float32, bfloat16, float16, q8_0 or q4_0 (GGUF blocks, as llama.cpp's"
        " -ctk/-ctv; on the CPU kernels), or k=q8_0,v=q4_0",
    ),
    Option("--max-waiting", "max_waiting", int, "bounded waiting queue; beyond it, 429"),
    Option("--width-multiple", "width_multiple", int, "width bucket step (default 64)"),
    Option("--warm-max-rows", "warm_max_rows", int, "warm list: largest row bucket"),
    Option("--warm-max-width", "warm_max_width", int, "warm list: widest context"),
    Option("--warm-budget", "warm_budget_bytes", parse_bytes, "warm list: memory budget"),
    Option(
        "--warm-seconds",
        "warm_seconds",
        float,
        "warm list: time budget in seconds, trimmed widest first (default 30 CPU, 3 GPU)",
    ),
    Option(
        "--speculative-config",
        "speculative",
        SpeculativeConfig.parse,
        "speculative decoding: ngram (prompt lookup), off (the default), or vLLM's JSON"
        ' \'{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4,'
        ' "prompt_lookup_min": 2}\' or \'{"method": "draft_model", "model": PATH,'
        ' "num_speculative_tokens": 5}\'; greedy output is unchanged by it',
    ),
    Option(
        "--draft-model",
        "draft_model",
        str,
        "speculative decoding by a draft model with the target's tokenizer: a directory, a GGUF"
        " file, or embedded (SmolLM2-135M, for SmolLM2 targets); --speculative-config's"
        ' {"method": "draft_model", "model": PATH} in short',
    ),
    Option("--seed", "seed", int, "seed for unseeded sampling"),
    Option("--served-model-name", "served_model_name", str, "the `model` clients send"),
    Option("--batch-invariant", "batch_invariant", parse_bool, "tokens ignore batch (1/0)"),
    Option("--prefix-cache", "enable_prefix_cache", parse_bool, "prefix caching (1/0)"),
    Option(
        "--state-checkpoints",
        "state_checkpoints",
        parse_checkpoints,
        "a hybrid model's prefix cache: recurrent states kept at block boundaries, N or auto"
        " (one per --max-batch row within an eighth of --kv-budget; 0 turns its cache off)",
    ),
    Option(
        "--state-checkpoint-interval",
        "state_checkpoint_interval",
        int,
        "a hybrid model's prefix cache: a state checkpoint every N blocks, and at the end of"
        " a prompt at least that long (default 32)",
    ),
    Option(
        "--decode-mode",
        "decode_mode",
        str,
        "eager | bucketed | persistent | recorded (default eager)",
    ),
    Option("--capture", "capture", parse_bool, "recorded decode: --decode-mode recorded (1/0)"),
    Option("--warm", "warm", parse_bool, "when recorded: record the warm list at startup"),
    Option("--api-key", "api_key", str, "require Authorization: Bearer KEY"),
    Option("--max-body-bytes", "max_body_bytes", parse_bytes, "request body limit (413)"),
    Option("--grace-seconds", "grace_seconds", float, "shutdown grace for in-flight requests"),
    Option(
        "--step-timeout",
        "step_timeout",
        parse_seconds,
        "watchdog: a step running this long kills the engine; the server exits non-zero"
        " (default 120; 0 or off: none)",
    ),
    Option(
        "--request-timeout",
        "request_timeout",
        parse_seconds,
        "seconds a request may run, first byte to last; past it, an error and its blocks freed"
        " (default off)",
    ),
    Option(
        "--read-timeout",
        "read_timeout",
        parse_seconds,
        "seconds a client may take to send a request, head and body; past it, 408 and the"
        " connection closed (default 30; 0 or off: none)",
    ),
    Option(
        "--kv-events-config",
        "kv_events",
        KVEventsConfig.parse,
        "KV-cache events for llm-d's indexer, vLLM's JSON: '{\"enable_kv_cache_events\": true,"
        ' "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": ...}\'',
    ),
)
_SERVER_FIELDS = {
    "draft_model",
    "api_key",
    "max_body_bytes",
    "grace_seconds",
    "capture",
    "request_timeout",
    "read_timeout",
    "kv_events",
}


@dataclass(frozen=True, slots=True)
class ServerSettings:
    engine: EngineConfig = field(default_factory=EngineConfig)
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    grace_seconds: float = 10.0
    request_timeout: float | None = None  # seconds; None: no deadline
    read_timeout: float | None = 30.0  # seconds to send a request whole (`nanoserve serve`)
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> ServerSettings:
        engine_fields = {k: v for k, v in values.items() if k not in _SERVER_FIELDS}
        engine_fields = {**SERVER_DEFAULTS, **engine_fields}
        if values.get("capture"):
            mode = engine_fields.setdefault("decode_mode", "recorded")
            if mode != "recorded":
                raise EngineConfigError(
                    f"--capture means --decode-mode recorded; --decode-mode {mode} contradicts it"
                )
        if (draft := values.get("draft_model")) is not None:
            spec = engine_fields.get("speculative")
            engine_fields["speculative"] = (
                spec.with_draft_model(str(draft))
                if isinstance(spec, SpeculativeConfig)
                else SpeculativeConfig.draft(str(draft))
            )
        own = ("capture", "draft_model")
        server = {k: v for k, v in values.items() if k in _SERVER_FIELDS and k not in own}
        return cls(engine=EngineConfig(**engine_fields), **server)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServerSettings:
        return cls.from_values(values_from_env(os.environ if environ is None else environ))


def values_from_env(environ: Mapping[str, str]) -> dict[str, object]:
    """The NANOSERVE_* variables set in environ, parsed; a bad one is named in the error."""
    values: dict[str, object] = {}
    for option in OPTIONS:
        if option.env in environ:
            try:
                values[option.dest] = option.parse(environ[option.env])
            except (ValueError, EngineConfigError, SpeculativeConfigError) as error:
                raise EngineConfigError(f"{option.env}: {error}") from None
    return values


def add_options(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    for option in OPTIONS:
        if option.flag in skip:
            continue
        if option.parse is parse_bool:  # `--capture` alone means on; `--capture 0` off
            parser.add_argument(
                option.flag,
                dest=option.dest,
                type=parse_bool,
                nargs="?",
                const=True,
                help=option.help,
            )
        else:
            parser.add_argument(
                option.flag, dest=option.dest, type=_argument(option.parse), help=option.help
            )


def _argument(parse: Callable[[str], object]) -> Callable[[str], object]:
    """parse, its refusal worded as argparse shows it ("argument --x: <our words>")."""

    def parsed(text: str) -> object:
        try:
            return parse(text)
        except (EngineConfigError, SpeculativeConfigError) as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parsed.__name__ = getattr(parse, "__name__", "value")
    return parsed


def values_from_args(args: argparse.Namespace) -> dict[str, object]:
    """Flags given on the command line, over NANOSERVE_* variables, over defaults."""
    values = values_from_env(os.environ)
    for option in OPTIONS:
        given = getattr(args, option.dest, None)
        if given is not None:
            values[option.dest] = given
    return values

"""EngineConfig: every decision a deployment makes, in one frozen object."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from enum import Enum

import torch

from nanoserve.core import PrefillBudget
from nanoserve.core.errors import NanoserveError
from nanoserve.core.kv_cache_dtype import (
    KvCacheDtype,
    KvCacheDtypeError,
    check_kv_form,
    parse_kv_cache_dtype,
)
from nanoserve.core.state_checkpoints import DEFAULT_INTERVAL_BLOCKS
from nanoserve.runtime.engine.config.speculative_config import SpeculativeConfig
from nanoserve.runtime.kernels.cpu_features import auto_dtype
from nanoserve.runtime.loading.pooler_config import TASKS
from nanoserve.runtime.model.weight_forms import AUTO, KERNEL_FORMS, check_quantize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The warm-up's default time budget. On a GPU a recording costs ~0.1 s and the build log's
# target is a 3 s warm-up; on a CPU a frozen call costs a real forward, and 30 s of warm-up
# keeps a whole boot (load, probes, warm-up, first forward) under about a minute.
DEFAULT_WARM_SECONDS = {"cpu": 30.0, "cuda": 3.0}
DEFAULT_MAX_MODEL_LEN = 4096  # unless asked, contexts stop here even if the model goes further


class EngineConfigError(NanoserveError, ValueError):
    """A configuration value is impossible; the message names the option."""


def check_kernel_device(quantize: str | None, device: str) -> None:
    """A kernel weight form (asked for, or what "auto" resolved to) runs on a CPU only."""
    if quantize in KERNEL_FORMS and device.split(":")[0] != "cpu":
        raise EngineConfigError(
            f"quantize {quantize} runs on nanoserve's CPU kernels, not on {device}"
        )


class DecodeMode(str, Enum):
    """How a decode step runs; each mode adds one thing to the one before it.

    eager: shaped by the step's own rows; bucketed: padded to a (rows, width) bucket;
    persistent: and read from fixed input storage; recorded: and replayed from a recording
    of its shape (a CUDA graph on a GPU, a frozen call on a CPU)."""

    EAGER = "eager"
    BUCKETED = "bucketed"
    PERSISTENT = "persistent"
    RECORDED = "recorded"

    @property
    def buckets(self) -> bool:
        return self is not DecodeMode.EAGER

    @property
    def persistent(self) -> bool:
        return self in (DecodeMode.PERSISTENT, DecodeMode.RECORDED)

    @property
    def recorded(self) -> bool:
        return self is DecodeMode.RECORDED


# What a server changes of EngineConfig's defaults: EngineConfig() is the library's exact mode
# (fp32 weights, no prefill budget: the same tokens on every CPU), and `nanoserve serve` picks
# by CPU and checkpoint. The one place both sets of defaults are written.
SERVER_DEFAULTS: dict[str, str] = {
    "dtype": AUTO,
    "quantize": AUTO,
    "prefill_budget": AUTO,
    "threads": AUTO,
}


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a container's or `taskset`'s
    limit), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_threads(threads: int | str | None) -> int:
    """The compute threads an engine runs on: N; "auto", the CPUs the process may run on;
    None, torch's count as the engine finds it (the library leaves the process's setting)."""
    if threads == AUTO:
        return available_cpus()
    if threads is None:
        return torch.get_num_threads()
    return int(threads)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str | None = None  # a Hugging Face directory or a GGUF file; None: the embedded model
    # "auto": bf16 on CUDA, under nanoserve's kernels, or where the CPU has it natively; else fp32
    dtype: str = "float32"
    # "int8", "q4", "q8": quantized linears (weight_forms.py); "auto": a GGUF's own block form;
    # None or "none": the model dtype's own weights
    quantize: str | None = None
    device: str = "cpu"
    max_batch: int = 32  # rows a step may hold: the scheduler's row limit and the warm list's
    max_model_len: int | None = None  # None: the model's limit, capped at 4096
    max_num_batched_tokens: int = 512  # a step's token budget (chunked prefill)
    # Prompt tokens a step may carry while sequences decode (core/prefill_budget.py): None,
    # the token budget's rest; "auto", measured at boot so that a mixed step stays within 1.5x
    # of the decode step alone (the server's default); N, at most N; "off" is None; or a
    # PrefillBudget.
    prefill_budget: PrefillBudget | int | str | None = None
    block_size: int = 16
    kv_budget_bytes: int = 1 << 30
    max_waiting: int = 256
    enable_prefix_cache: bool = True
    # A hybrid's prefix cache: recurrent states kept at block boundaries (checkpoints), N slots
    # or "auto" (one per running sequence within an eighth of the K/V budget; 0: the cache is
    # off for it), saved every `state_checkpoint_interval` blocks and where a prompt of one
    # interval or more ends.
    state_checkpoints: int | str = AUTO
    state_checkpoint_interval: int = DEFAULT_INTERVAL_BLOCKS
    batch_invariant: bool = True  # a row's tokens ignore its batch and its bucket
    decode_mode: DecodeMode | str = DecodeMode.EAGER  # a DecodeMode or its value ("recorded")
    width_multiple: int = 64
    warm: bool = True  # when recorded: record the warm list before serving
    warm_max_rows: int | None = None  # None: max_batch
    warm_max_width: int | None = None  # None: max_model_len
    warm_budget_bytes: int | None = None  # None: the memory measured free after the pool
    warm_seconds: float | None = None  # the warm-up's time budget; None: by device (30 s CPU)
    seed: int = 0
    served_model_name: str | None = None
    # The server's watchdog: a step still running after this many seconds kills the engine
    # (AsyncEngine); generous, since a wide prefill or a first recording takes seconds on a CPU.
    step_timeout: float | None = 120.0
    # Speculative decoding (prompt lookup); None: off. Greedy output is unchanged by it.
    speculative: SpeculativeConfig | None = None
    # The kernels' and torch's intra-op threads: N; "auto", the CPUs the process may run on (the
    # server's default); None, torch's count as it is (the library's: a process's setting).
    threads: int | str | None = None
    # What the model serves: auto (what its files say: loading/pooler_config.py), generate,
    # embed (pooled embeddings) or rerank (scores of query/document pairs)
    task: str = AUTO
    # How the K/V pool stores values (core/kv_cache_dtype.py): auto (float16 under nanoserve's
    # kernels, else the model dtype), float32, bfloat16, float16, q8_0, q4_0 or k=<form>,v=<form>
    kv_cache_dtype: str = AUTO

    def __post_init__(self) -> None:
        """Refuse what no model could make possible; change nothing (resolve() decides)."""
        try:
            DecodeMode(self.decode_mode)
        except ValueError:
            modes = ", ".join(m.value for m in DecodeMode)
            raise EngineConfigError(
                f"decode_mode must be one of {modes}, got {self.decode_mode!r}"
            ) from None
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise EngineConfigError(f"device must be cpu or cuda, got {self.device!r}")
        quantize = None if self.quantize == "none" else self.quantize
        try:
            check_quantize(quantize, allow_auto=True)
        except ValueError as error:
            raise EngineConfigError(str(error)) from None
        if self.dtype not in DTYPES and self.dtype != AUTO:
            choices = ", ".join([AUTO, *sorted(DTYPES)])
            raise EngineConfigError(f"dtype must be one of {choices}, got {self.dtype!r}")
        check_kernel_device(quantize, self.device)
        checkpoints = self.state_checkpoints
        if checkpoints != AUTO and (
            isinstance(checkpoints, bool) or not isinstance(checkpoints, int) or checkpoints < 0
        ):
            raise EngineConfigError(
                f"state_checkpoints must be auto or an integer >= 0, got {checkpoints!r}"
            )
        for name in (
            "max_batch",
            "max_num_batched_tokens",
            "block_size",
            "width_multiple",
            "state_checkpoint_interval",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise EngineConfigError(f"{name} must be a positive integer, got {value!r}")
        budget = self.prefill_budget
        if not (
            budget is None
            or budget in (AUTO, "off")
            or isinstance(budget, PrefillBudget)
            or (isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1)
        ):
            raise EngineConfigError(
                f"prefill_budget must be 'auto', a positive number of tokens or unset, got {budget!r}"
            )
        threads = self.threads
        if (
            threads is not None
            and threads != AUTO
            and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1)
        ):
            raise EngineConfigError(f"threads must be a positive integer or auto, got {threads!r}")
        try:
            kv = parse_kv_cache_dtype(self.kv_cache_dtype, torch.float16)
            if self.device.startswith("cuda"):  # no kernels there, whatever the weights
                check_kv_form(kv, kernels=False, device=self.device)
        except KvCacheDtypeError as error:
            raise EngineConfigError(str(error)) from None
        if self.task not in TASKS:
            raise EngineConfigError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        for name in ("max_model_len", "warm_max_rows", "warm_max_width", "max_waiting"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise EngineConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("kv_budget_bytes", "warm_budget_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise EngineConfigError(f"{name} must be a positive number of bytes, got {value!r}")
        for name in ("step_timeout", "warm_seconds"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value < float("inf")
            ):
                raise EngineConfigError(
                    f"{name} must be a positive number of seconds, got {value!r}"
                )

    def resolve(self, *, model_max_len: int, auto_quantize: str | None = None) -> ResolvedConfig:
        """Every choice made, for a model of `model_max_len` positions whose weights serve as
        `auto_quantize` where quantize is "auto" (what the checkpoint holds, or what the model
        was built with). Called once: by build_engine, or by Engine.from_config."""
        quantize = None if self.quantize == "none" else self.quantize
        if quantize == AUTO:
            quantize = auto_quantize
        check_kernel_device(quantize, self.device)
        dtype = self.dtype
        if dtype == AUTO:
            dtype = auto_dtype(self.device, quantize in KERNEL_FORMS)
        max_len = self.max_model_len or min(model_max_len, DEFAULT_MAX_MODEL_LEN)
        if max_len > model_max_len:
            raise EngineConfigError(
                f"max_model_len {max_len} exceeds the model's {model_max_len} positions"
            )
        return ResolvedConfig(
            model=self.model,
            dtype=dtype,
            quantize=quantize,
            device=self.device,
            max_batch=self.max_batch,
            max_model_len=max_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            prefill_budget=None if self.prefill_budget == "off" else self.prefill_budget,
            block_size=self.block_size,
            kv_budget_bytes=self.kv_budget_bytes,
            max_waiting=self.max_waiting,
            enable_prefix_cache=self.enable_prefix_cache,
            state_checkpoints=self.state_checkpoints,
            state_checkpoint_interval=self.state_checkpoint_interval,
            batch_invariant=self.batch_invariant,
            decode_mode=DecodeMode(self.decode_mode),
            width_multiple=self.width_multiple,
            warm=self.warm,
            warm_max_rows=self.warm_max_rows or self.max_batch,
            warm_max_width=min(self.warm_max_width or max_len, max_len),
            warm_budget_bytes=self.warm_budget_bytes,
            warm_seconds=self.warm_seconds or DEFAULT_WARM_SECONDS[self.device.split(":")[0]],
            seed=self.seed,
            served_model_name=self.served_model_name,
            step_timeout=self.step_timeout,
            speculative=self.speculative,
            threads=resolve_threads(self.threads),
            task=self.task,
            kv_cache_dtype=self._kv_cache_dtype(quantize),
        )

    def _kv_cache_dtype(self, quantize: str | None) -> KvCacheDtype | None:
        if self.kv_cache_dtype.strip().lower() in ("", AUTO):
            return None
        kv = parse_kv_cache_dtype(self.kv_cache_dtype, torch.float16)
        try:
            check_kv_form(kv, kernels=quantize in KERNEL_FORMS, device=self.device)
        except KvCacheDtypeError as error:
            raise EngineConfigError(str(error)) from None
        return kv

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """An EngineConfig with every choice made (EngineConfig.resolve): no "auto", no limit left
    unset. What the engine, its runner and the server read."""

    model: str | None
    dtype: str  # float32, bfloat16 or float16
    quantize: str | None  # a weight form; None: the model dtype's own weights
    device: str
    max_batch: int
    max_model_len: int
    max_num_batched_tokens: int
    prefill_budget: PrefillBudget | int | str | None  # "auto": measured at the engine's start
    block_size: int
    kv_budget_bytes: int
    max_waiting: int | None  # None: the waiting queue is unbounded
    enable_prefix_cache: bool
    state_checkpoints: int | str  # "auto": priced by the engine against its state's bytes
    state_checkpoint_interval: int  # blocks
    batch_invariant: bool
    decode_mode: DecodeMode
    width_multiple: int
    warm: bool
    warm_max_rows: int
    warm_max_width: int
    warm_budget_bytes: int | None  # None: the memory measured free when a recording is gated
    warm_seconds: float
    seed: int
    served_model_name: str | None
    step_timeout: float | None  # None: no watchdog
    speculative: SpeculativeConfig | None  # None: no speculation
    threads: int  # the kernels' and torch's intra-op threads
    task: str  # auto, generate, embed or rerank: the engine's pooler decides "auto"
    kv_cache_dtype: KvCacheDtype | None = None  # None: the model's own (float16 on the kernels)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def without_decoding(config: ResolvedConfig, task: str) -> ResolvedConfig:
    """`config` for a model that never decodes (a BERT-family encoder, EmbeddingGemma: whole
    inputs, one step each, serving `task`): no decode steps recorded or warmed, no step timings
    to price a prefill budget from (the token budget alone batches its inputs). Generation and
    speculation are refused: there is nothing to decode or draft."""
    if task == "generate":
        raise EngineConfigError(
            "a model with bidirectional attention embeds or scores, it does not generate"
            " (--task embed or --task rerank)"
        )
    if config.speculative is not None:
        raise EngineConfigError(
            "a model with bidirectional attention does not generate: it takes no"
            " --speculative-config"
        )
    return replace(config, decode_mode=DecodeMode.EAGER, warm=False, prefill_budget=None)

"""Fault injection, for tests only: `NANOSERVE_FAULT=<kind>@<n>` makes one thing fail, once.

Off unless the variable is set (the README's section for developers lists it). Kinds:

- `forward@N`: the model forward of engine step N raises;
- `sampler@N`: the sampler of step N raises;
- `alloc@N`: step N's K/V block allocation fails (raised where the step is planned);
- `hang@N`: step N sleeps an hour, for the watchdog (`--step-timeout`) to find;
- `tokenizer@N`: the N-th prompt the server tokenizes fails, for that request alone.

Steps and prompts count from 1; the boot's one real forward (build.py's `first_forward`) is step 1.
With the variable set, build_engine makes a `FaultyEngine`: the production `Engine` reads no
variable and has no hook; this subclass wraps the phases of its step.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from nanoserve.core.errors import NanoserveError
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.sampler import SampleResult
from nanoserve.runtime.engine.scheduler import SchedulerOutput
from nanoserve.runtime.engine.verify import RowGroup
from nanoserve.runtime.text.tokenizer import Tokenizer

ENV = "NANOSERVE_FAULT"
KINDS = ("forward", "sampler", "alloc", "hang", "tokenizer")
HANG_SECONDS = 3600.0


class InjectedFault(NanoserveError, RuntimeError):
    """The failure NANOSERVE_FAULT asked for."""


class FaultSpecError(NanoserveError, ValueError):
    """NANOSERVE_FAULT is not `<kind>@<n>`."""


@dataclass(frozen=True, slots=True)
class FaultPlan:
    kind: str
    at: int

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> FaultPlan | None:
        text = (os.environ if environ is None else environ).get(ENV, "").strip()
        if not text:
            return None
        kind, _, at = text.partition("@")
        if kind not in KINDS or not at.isdigit() or int(at) < 1:
            raise FaultSpecError(
                f"{ENV}={text!r}: expected <kind>@<n>, kind one of {', '.join(KINDS)}, n >= 1"
            )
        return cls(kind, int(at))

    def hit(self, kind: str, count: int) -> None:
        """Fail here if this is the planned kind and count."""
        if kind != self.kind or count != self.at:
            return
        if kind == "hang":
            time.sleep(HANG_SECONDS)
        raise InjectedFault(f"injected fault: {kind} at {count} ({ENV})")


class FaultyTokenizer(Tokenizer):
    """A tokenizer whose N-th `encode` fails (NANOSERVE_FAULT=tokenizer@N); the same
    vocabulary otherwise."""

    __slots__ = ("_calls", "_faults")

    def __init__(self, tokenizer: Tokenizer, faults: FaultPlan) -> None:
        super().__init__(
            tokenizer.backend,
            eos_token_ids=tokenizer.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,
        )
        self._faults = faults
        self._calls = 0

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        self._calls += 1
        self._faults.hit("tokenizer", self._calls)
        return super().encode(text, add_special_tokens=add_special_tokens)


class FaultyEngine(Engine):
    """An Engine that fails as its FaultPlan says; build_engine makes one when NANOSERVE_FAULT
    is set. The production Engine carries no fault code: this wraps its step's phases.

    Steps are counted as begun (a step that plans nothing counts too); prompts as tokenized
    (the server encodes through `tokenizer`, which the engine itself never encodes with)."""

    def __init__(self, *args: Any, faults: FaultPlan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = faults
        self.num_attempts = 0
        if faults.kind == "tokenizer":
            self.tokenizer = FaultyTokenizer(self.tokenizer, faults)

    def _plan(self) -> SchedulerOutput:
        self.num_attempts += 1
        self.faults.hit("alloc", self.num_attempts)
        return super()._plan()

    def _execute(self, out: SchedulerOutput) -> torch.Tensor:
        self.faults.hit("forward", self.num_attempts)
        self.faults.hit("hang", self.num_attempts)
        return super()._execute(out)

    def _sample(
        self, out: SchedulerOutput, logits: torch.Tensor
    ) -> tuple[list[RowGroup], SampleResult]:
        self.faults.hit("sampler", self.num_attempts)
        return super()._sample(out, logits)

"""Fault injection, for tests: `NANOSERVE_FAULT=<kind>@<n>` makes one thing fail, once.

`python -m tests.faults serve ...` is `nanoserve serve` with the engine this module makes
(the README's section for developers lists it); the production boot reads no such variable.
Kinds:

- `forward@N`: the model forward of engine step N raises;
- `sampler@N`: the sampler of step N raises;
- `alloc@N`: step N's K/V block allocation fails (raised where the step is planned);
- `hang@N`: step N sleeps an hour, for the watchdog (`--step-timeout`) to find;
- `tokenizer@N`: the N-th prompt the server tokenizes fails, for that request alone.

Steps and prompts count from 1; the boot's one real forward (build.py's `first_forward`) is step 1.
With the variable set, the launcher hands build_engine a `FaultyEngine` to build: the
production `Engine` has no hook; this subclass wraps the phases of its step.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from nanoserve.core.errors import NanoserveError
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.step.runner import Executed
from nanoserve.runtime.engine.step.sampler import SampleResult
from nanoserve.runtime.engine.step.scheduler import SchedulerOutput
from nanoserve.runtime.engine.step.verify import RowGroup
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

    def _execute(self, out: SchedulerOutput) -> Executed:
        self.faults.hit("forward", self.num_attempts)
        self.faults.hit("hang", self.num_attempts)
        return super()._execute(out)

    def _sample(
        self, out: SchedulerOutput, logits: torch.Tensor
    ) -> tuple[list[RowGroup], SampleResult]:
        self.faults.hit("sampler", self.num_attempts)
        return super()._sample(out, logits)


def main(argv: list[str] | None = None) -> int:
    """`nanoserve` (its `serve` command) with the engine NANOSERVE_FAULT asks for: a bad spec is
    one line and exit 1, as the server's own bad input."""
    from nanoserve.api import cli
    from nanoserve.api.server.engine_client import build_async_engine

    try:
        faults = FaultPlan.from_env()
    except FaultSpecError as error:
        print(f"nanoserve: {error}", file=sys.stderr)
        return 1
    engine_type = Engine if faults is None else partial(FaultyEngine, faults=faults)
    factory = partial(build_async_engine, engine_type=engine_type)
    return cli.main(sys.argv[1:] if argv is None else argv, engine_factory=factory)


if __name__ == "__main__":
    sys.exit(main())

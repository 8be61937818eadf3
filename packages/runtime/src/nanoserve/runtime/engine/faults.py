"""Fault injection, for tests only: `NANOSERVE_FAULT=<kind>@<n>` makes one thing fail, once.

Off unless the variable is set (the README's section for developers lists it). Kinds:

- `forward@N`: the model forward of engine step N raises;
- `sampler@N`: the sampler of step N raises;
- `alloc@N`: step N's K/V block allocation fails (raised where the step is planned);
- `hang@N`: step N sleeps an hour, for the watchdog (`--step-timeout`) to find;
- `tokenizer@N`: the N-th prompt the server tokenizes fails, for that request alone.

Steps and prompts count from 1; the boot's one real forward (build.py's `first_forward`) is step 1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nanoserve.core.errors import NanoserveError
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


class FaultyTokenizer:
    """The engine's tokenizer, whose N-th `encode` fails (NANOSERVE_FAULT=tokenizer@N)."""

    def __init__(self, tokenizer: Tokenizer, faults: FaultPlan) -> None:
        self._tokenizer = tokenizer
        self._faults = faults
        self._calls = 0

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        self._calls += 1
        self._faults.hit("tokenizer", self._calls)
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

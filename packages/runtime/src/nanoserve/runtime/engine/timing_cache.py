"""StepTimings and TimingCache: the boot's measured step times, remembered per machine and model.

The prefill budget is priced from three padding forwards timed at boot (prefill_timing.py):
about a second of a 1.5B's ready time, as much as packing its weights. A later boot of the same
weights, in the same forms, on the same CPU, kernels and threads, timing the same shapes, reads
them back: one small JSON file per key in $NANOSERVE_TIMING_CACHE (else
$XDG_CACHE_HOME/nanoserve/timings, beside the kernel builds; "off": nothing is remembered).

A remembered timing is trusted only when two boots have timed all three (each boot's the
fastest of its runs, the file the fastest of both: interference only ever adds time, and one
boot's bad moment must not price every later boot), and only after a check: the boot still
times the cheapest of the three, the 1-row decode step, and unless it is within `TOLERANCE` of
the remembered one the machine is not as it was (busier, freer, a governor the key cannot see)
and all three are timed again, starting the file over. A file that cannot be read or written is
the same as none: the boot times, and says nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nanoserve.runtime.loading.convert import default_cache_dir

TOLERANCE = 1.25  # a re-timed 1-row step within 1/1.25x-1.25x of the remembered one: trusted
TRUSTED_AFTER = 2  # boots that timed every shape before a later boot skips them
_VERSION = 2  # of the file's layout


@dataclass(frozen=True, slots=True)
class StepTimings:
    """Fastest-of-runs seconds of a decode step of 1 row and of `rows` rows, and of a prompt
    chunk of `tokens` tokens."""

    one_row_s: float
    rows: int
    rows_s: float
    tokens: int
    tokens_s: float
    boots: int = 1  # how many boots' timings these are the fastest of
    remembered: Path | None = None  # the file they were read from; None: timed at this boot

    def agrees(self, one_row_s: float) -> bool:
        """Whether a 1-row step just timed says the machine is as it was when these were."""
        return self.one_row_s / TOLERANCE <= one_row_s <= self.one_row_s * TOLERANCE

    @property
    def trusted(self) -> bool:
        return self.boots >= TRUSTED_AFTER

    def fastest_with(self, earlier: StepTimings) -> StepTimings:
        """These and an earlier boot's of the same shapes, each the faster of the two."""
        return StepTimings(
            one_row_s=min(self.one_row_s, earlier.one_row_s),
            rows=self.rows,
            rows_s=min(self.rows_s, earlier.rows_s),
            tokens=self.tokens,
            tokens_s=min(self.tokens_s, earlier.tokens_s),
            boots=self.boots + earlier.boots,
        )


@dataclass(frozen=True, slots=True)
class TimingCache:
    root: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TimingCache | None:
        env = os.environ if environ is None else environ
        chosen = env.get("NANOSERVE_TIMING_CACHE", "")
        if chosen == "off":
            return None
        return cls(Path(chosen) if chosen else default_cache_dir(env) / "timings")

    def path(self, key: Mapping[str, object]) -> Path:
        text = json.dumps(key, sort_keys=True, default=str)
        return self.root / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"

    def load(self, key: Mapping[str, object]) -> StepTimings | None:
        path = self.path(key)
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            if saved.get("version") != _VERSION or saved.get("key") != _plain(key):
                return None
            fields = {f.name for f in dataclasses.fields(StepTimings)} - {"remembered"}
            return StepTimings(**{name: saved["timings"][name] for name in fields}, remembered=path)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, key: Mapping[str, object], timings: StepTimings) -> None:
        path = self.path(key)
        values = dataclasses.asdict(timings)
        values.pop("remembered")
        text = json.dumps({"version": _VERSION, "key": _plain(key), "timings": values}, indent=1)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_suffix(f".{os.getpid()}.tmp")
            temp.write_text(text, encoding="utf-8")
            os.replace(temp, path)  # a reader sees the old file or the new one, never half
        except OSError:
            pass


def file_identity(source: Path) -> list[list[object]]:
    """What says a weights' file (or each file of a directory) is unchanged: its resolved path,
    size and modification time; a rewritten file is another key."""
    source = source.resolve()
    files = sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir() else [source]
    out: list[list[object]] = []
    for file in files:
        stat = file.stat()
        out.append([str(file), stat.st_size, stat.st_mtime_ns])
    return out


def _plain(key: Mapping[str, object]) -> object:
    """The key as JSON reads it back (tuples become lists), to compare a file's key with."""
    return json.loads(json.dumps(key, sort_keys=True, default=str))

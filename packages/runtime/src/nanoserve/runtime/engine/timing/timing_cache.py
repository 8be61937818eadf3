"""StepTimings and TimingCache: the boot's measured step times, remembered per machine and model.

The prefill budget is priced from three padding forwards timed at boot (step_timing.py):
about a second of a 1.5B's ready time, as much as packing its weights. A later boot of the same
weights, in the same forms, on the same CPU, kernels, code and threads, timing the same shapes,
reads them back: one small JSON file per key in $NANOSERVE_TIMING_CACHE (else
$XDG_CACHE_HOME/nanoserve/timings or ~/.cache/nanoserve/timings; "off": nothing is remembered).
Files are small and never pruned; deleting the folder only costs the next boots their timing.

A remembered timing is trusted only when two boots have timed all three (the file keeps the
faster of the boots' runs: interference only ever adds time, and one boot's bad moment must not
price every later boot), and only after a check: the boot still times the cheapest of the three,
the 1-row decode step, and unless it is within `TOLERANCE` of the remembered one the machine is
not as it was (busier, freer, a governor the key cannot see) and all three are timed again,
starting the file over. A file that cannot be read, or says anything but timings of the key's
shapes, is the same as none; one that cannot be written is no cache (the boot times as if
nothing were remembered).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nanoserve.runtime.loading.convert import default_cache_dir

# A re-timed 1-row step within 1/1.5x-1.5x of the remembered one: trusted. A memory-bound 1-row
# step varies by a quarter from boot to boot on one idle VM; at 1.25x a third of the boots
# started their file over (RESULTS.md, 2026-12-04).
TOLERANCE = 1.5
TRUSTED_AFTER = 2  # boots that timed every shape before a later boot skips them
_VERSION = 2  # of the file's layout
_SECONDS = ("one_row_s", "rows_s", "tokens_s")
_COUNTS = ("rows", "tokens", "boots")


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
    remembered: Path | None = None  # the file some of them came from; None: all timed here

    def agrees(self, one_row_s: float) -> bool:
        """Whether a 1-row step just timed says the machine is as it was when these were."""
        return self.one_row_s / TOLERANCE <= one_row_s <= self.one_row_s * TOLERANCE

    @property
    def trusted(self) -> bool:
        """Timed by enough boots to be taken without timing the wide shapes again."""
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
            remembered=earlier.remembered,
        )

    def values(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in (*_SECONDS, *_COUNTS)}


@dataclass(frozen=True, slots=True)
class TimingCache:
    """A folder of timing files, one per key (a JSON object naming what the timings depend on)."""

    root: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TimingCache | None:
        """The configured cache, or None where it is off or cannot be written."""
        env = os.environ if environ is None else environ
        chosen = env.get("NANOSERVE_TIMING_CACHE", "")
        if chosen == "off":
            return None
        try:
            root = Path(chosen) if chosen else default_cache_dir(env) / "timings"
            root.mkdir(parents=True, exist_ok=True)
        except (OSError, RuntimeError):  # RuntimeError: no home directory to default to
            return None
        return cls(root) if os.access(root, os.W_OK) else None

    def path(self, key: Mapping[str, object]) -> Path:
        text = json.dumps(key, sort_keys=True, default=str)
        return self.root / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"

    def load(self, key: Mapping[str, object]) -> StepTimings | None:
        """The timings stored under `key`, or None where there are none it can vouch for."""
        path = self.path(key)
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(saved, dict) or saved.get("version") != _VERSION:
            return None
        if saved.get("key") != _plain(key) or not isinstance(timings := saved.get("timings"), dict):
            return None
        seconds = [timings.get(name) for name in _SECONDS]
        counts = [timings.get(name) for name in _COUNTS]
        if not all(_positive(v, float) for v in seconds) or not all(
            _positive(v, int) for v in counts
        ):
            return None
        loaded = StepTimings(**{n: timings[n] for n in (*_SECONDS, *_COUNTS)}, remembered=path)
        shapes = key.get("shapes")  # what was timed must be what is asked for
        if shapes is not None and list(shapes) != [loaded.rows, loaded.tokens]:  # type: ignore[call-overload]
            return None
        return loaded

    def store(self, key: Mapping[str, object], timings: StepTimings) -> bool:
        """Write (atomically: a reader sees the old file or the new one); False if it could not."""
        text = json.dumps(
            {"version": _VERSION, "key": _plain(key), "timings": timings.values()}, indent=1
        )
        temp = None
        try:
            fd, temp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(text)
            os.replace(temp, self.path(key))
        except OSError:
            if temp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
            return False
        return True


def file_identity(source: Path) -> list[list[object]] | None:
    """What says a weights' file (or each file of a directory, not its subfolders) is
    unchanged: resolved path, size and modification time; None where it cannot be read."""
    try:
        source = source.resolve()
        files = sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir() else [source]
        return [[str(f), (st := f.stat()).st_size, st.st_mtime_ns] for f in files]
    except OSError:
        return None


def _positive(value: object, kind: type) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind is int and not isinstance(value, int):
        return False
    return math.isfinite(value) and value > 0


def _plain(key: Mapping[str, object]) -> object:
    """The key as JSON reads it back (tuples become lists), to compare a file's key with."""
    return json.loads(json.dumps(key, sort_keys=True, default=str))

"""freeze_boot_heap and thaw_boot_heap: a server's boot objects kept out of the collector's scans.

A server's boot leaves hundreds of thousands of tracked objects behind (the imports', the
model's, the tokenizer's), none of them garbage, and each full collection while serving
rescanned them all, in front of a step: every stream's next token late by as much. Collected
once and moved into the permanent generation (gc.freeze, as vLLM does after its boot), they
are never scanned again, and a full collection scans only what serving made.

gc.freeze is process-wide, so freezes are counted: every engine that froze thaws once at its
shutdown, and the heap is thawed (gc.unfreeze) when the last one has, so one engine's shutdown
does not bring the pauses back to another still serving in the same process (tests run several).
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_holders = 0  # engines that froze and have not thawed


def freeze_boot_heap() -> None:
    """Collect, then freeze everything alive (this engine's boot objects among them)."""
    global _holders
    with _lock:
        gc.collect()
        gc.freeze()
        _holders += 1


def thaw_boot_heap() -> None:
    """One engine's freeze released; the last release gives the objects back to the collector."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()


def boot_heap_holders() -> int:
    return _holders

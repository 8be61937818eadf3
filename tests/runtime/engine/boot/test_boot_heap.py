"""The boot heap's freezes are counted: the heap thaws when the last engine that froze it has."""

from __future__ import annotations

import gc

from nanoserve.runtime.engine.boot.boot_heap import (
    boot_heap_holders,
    freeze_boot_heap,
    thaw_boot_heap,
)


def test_the_last_thaw_gives_the_heap_back() -> None:
    assert boot_heap_holders() == 0 and gc.get_freeze_count() == 0
    freeze_boot_heap()
    freeze_boot_heap()  # a second engine in the same process
    assert boot_heap_holders() == 2 and gc.get_freeze_count() > 0
    thaw_boot_heap()  # the first one's shutdown: the second still serves frozen
    assert boot_heap_holders() == 1 and gc.get_freeze_count() > 0
    thaw_boot_heap()
    assert boot_heap_holders() == 0 and gc.get_freeze_count() == 0
    thaw_boot_heap()  # an engine that never froze: nothing to give back
    assert boot_heap_holders() == 0

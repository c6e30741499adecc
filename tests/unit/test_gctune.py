"""The agent's collector settings (runtime/gctune.py): set once at start-up."""

from __future__ import annotations

import gc

from swarm.runtime.gctune import THRESHOLDS, tune_gc


def test_tune_gc_freezes_start_up_objects_and_sets_the_thresholds() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == THRESHOLDS
        assert gc.get_freeze_count() > 0
        # the young generation still collects cycles: a cycle made now is found
        a: list[object] = []
        a.append(a)
        del a
        assert gc.collect(0) >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

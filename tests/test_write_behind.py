"""``core.write_behind.WriteBehind``: work in order in a thread, failures raised to the
caller, and no thread left behind by an abandoned writer."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from dfit_mlir.core.write_behind import WriteBehind


def test_items_are_consumed_in_order() -> None:
    seen: list[int] = []
    with WriteBehind(seen.append, depth=2) as behind:
        for item in range(100):
            behind.write(item)
    assert seen == list(range(100))


def test_a_failure_is_raised_by_close_and_later_items_are_dropped() -> None:
    seen: list[int] = []

    def consume(item: int) -> None:
        if item == 3:
            raise OSError("No space left on device")
        seen.append(item)

    behind = WriteBehind(consume, depth=1)
    with pytest.raises(OSError, match="No space left"):
        for item in range(10):
            behind.write(item)
            time.sleep(0.001)
        behind.close()
    with pytest.raises(OSError):
        behind.close()
    assert seen == [0, 1, 2]


def test_the_callers_error_wins_on_exit() -> None:
    def consume(item: int) -> None:
        raise OSError("ours")

    with pytest.raises(KeyError), WriteBehind(consume) as behind:
        behind.write(1)
        raise KeyError("the caller's")


def test_an_abandoned_writer_ends_its_thread() -> None:
    before = threading.active_count()
    behind = WriteBehind(lambda item: None, name="dfit-abandoned")
    behind.write(1)
    del behind
    gc.collect()
    for _ in range(200):
        if threading.active_count() == before:
            break
        time.sleep(0.01)
    assert not any(thread.name == "dfit-abandoned" for thread in threading.enumerate())

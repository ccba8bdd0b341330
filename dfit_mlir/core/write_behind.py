"""Work handed to a thread of its own, in order, so that the caller goes on: the
writers' output (a file's bytes, a Parquet file's batches) is written while the next
batch is made. What the thread does (file writes, Parquet encoding and zstd) releases
the GIL, so on two cores the two overlap."""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any


class WriteBehind:
    """``consume(item)`` for each item :meth:`write` is given, in order, in a thread;
    at most ``depth`` items wait (the caller blocks past that, so memory stays bounded).
    A failure is raised by the next :meth:`write` or by :meth:`close`, and the items
    after it are dropped. The thread ends at :meth:`close`, or when this object is
    collected unclosed (a writer abandoned by an error elsewhere)."""

    def __init__(self, consume: Callable[[Any], Any], *, depth: int = 4, name: str = "dfit-write-behind"):
        self._pending: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._failure: list[BaseException] = []
        # The thread holds the queue and the failure list, not this object.
        self._thread = threading.Thread(target=_drain, args=(self._pending, consume, self._failure), name=name,
                                        daemon=True)
        self._thread.start()
        self._closed = False
        weakref.finalize(self, self._pending.put, None)

    def write(self, item: Any) -> int:
        if self._failure:
            raise self._failure[0]
        self._pending.put(item)
        return len(item) if hasattr(item, "__len__") else 0

    def close(self) -> None:
        """Wait for every item to be consumed; raise the failure, if any."""
        self._stop()
        if self._failure:
            raise self._failure[0]

    def _stop(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending.put(None)
            self._thread.join()

    def __enter__(self) -> WriteBehind:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:  # the caller's error is the one to see: wait, but raise nothing of ours
            self._stop()


def _drain(pending: queue.Queue[Any], consume: Callable[[Any], Any], failure: list[BaseException]) -> None:
    while (item := pending.get()) is not None:
        if not failure:
            try:
                consume(item)
            except BaseException as error:  # raised in the writing thread
                failure.append(error)

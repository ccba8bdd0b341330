"""A progress bar for long runs, on a terminal only: a run reading and writing millions
of events shows that it is doing so; in a pipe, a log or a test it prints nothing.

How long is left is the bar's own estimate (:meth:`Progress.left`), not click's
``show_eta``: click measures its pace only once a second has passed and prints whole
seconds rounded down, and a run writes its events fast (the 840,000 records of 30,000
invocations of the demo in 1.3 s), so its ETA appeared at 60-75 % and read 00:00:00 to
the end.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import IO, Any, Callable

#: Set (to anything) to keep the bar off on a terminal too.
QUIET_ENV = "DFIT_NO_PROGRESS"
#: Seconds of work before the bar says how long is left: a window or two says little of
#: the pace.
ESTIMATE_AFTER_SECONDS = 0.5


class Progress:
    """``with Progress(label, total) as bar: bar.update(n)``. Shown when ``file`` (stderr
    by default) is a terminal, ``DFIT_NO_PROGRESS`` is unset and ``total`` reaches
    ``threshold`` (short runs finish before a bar would say anything). ``clock``: seconds,
    for the estimate of what is left (tests give their own)."""

    def __init__(self, label: str, total: int, *, threshold: int = 0, file: IO[str] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.file = file if file is not None else sys.stderr
        self.shown = total >= threshold and not os.environ.get(QUIET_ENV) and _is_terminal(self.file)
        self.total, self.done = total, 0
        self._clock = clock
        self._started = clock()
        self._bar: Any = None
        if self.shown:
            import click

            self._bar = click.progressbar(length=total, label=label, file=self.file, show_eta=False,
                                          item_show_func=lambda _: self.left())

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def update(self, count: int) -> None:
        self.done += count
        if self._bar is not None:
            self._bar.update(count)

    def left(self) -> str | None:
        """``about N s left`` at the pace so far, rounded up (the last second reads
        ``1 s``, not nothing); None before :data:`ESTIMATE_AFTER_SECONDS` and once done.
        A run's dispatch records come first and cost about twice its other records, so
        the estimate runs high at first and falls (3 s said for 1 s left at 19 %)."""
        elapsed = self._clock() - self._started
        if elapsed < ESTIMATE_AFTER_SECONDS or not 0 < self.done < self.total:
            return None
        return f"about {_duration(math.ceil(elapsed * (self.total - self.done) / self.done))} left"

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def _duration(seconds: int) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes:02} min"
    return f"{minutes} min {seconds:02} s" if minutes else f"{seconds} s"


def announce(message: str, *, file: IO[str] | None = None) -> bool:
    """Print ``message`` on a terminal (as :class:`Progress` would show a bar): for a
    phase whose progress cannot be counted, such as the profiled run itself."""
    file = file if file is not None else sys.stderr
    if os.environ.get(QUIET_ENV) or not _is_terminal(file):
        return False
    print(message, file=file, flush=True)
    return True


def _is_terminal(file: IO[str]) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False

"""A progress bar for long runs, on a terminal only: a run reading and writing millions
of events shows that it is doing so; in a pipe, a log or a test it prints nothing."""

from __future__ import annotations

import os
import sys
from typing import IO, Any

#: Set (to anything) to keep the bar off on a terminal too.
QUIET_ENV = "DFIT_NO_PROGRESS"


class Progress:
    """``with Progress(label, total) as bar: bar.update(n)``. Shown when ``file`` (stderr
    by default) is a terminal, ``DFIT_NO_PROGRESS`` is unset and ``total`` reaches
    ``threshold`` (short runs finish before a bar would say anything)."""

    def __init__(self, label: str, total: int, *, threshold: int = 0, file: IO[str] | None = None):
        self.file = file if file is not None else sys.stderr
        self.shown = total >= threshold and not os.environ.get(QUIET_ENV) and _is_terminal(self.file)
        self._bar: Any = None
        if self.shown:
            import click

            self._bar = click.progressbar(length=total, label=label, file=self.file, show_eta=True)

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def update(self, count: int) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


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

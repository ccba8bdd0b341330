"""Child processes that do not outlive dfit.

A SIGKILLed ``dfit`` (or one the out-of-memory killer took, or a crash) runs no
``finally`` and no signal handler, so nothing kills its children: an
``iree-benchmark-module`` of a long run went on profiling, reparented to init, filling
``$TMPDIR`` with a profile nobody would read. On Linux a child asks the kernel for SIGKILL
when its parent dies (``prctl(PR_SET_PDEATHSIG)``), set between ``fork`` and ``exec``
(:func:`tied_to_dfit`, a ``preexec_fn``) or by a Python child itself
(:func:`die_with_parent`). Elsewhere nothing changes.

The signal comes when the *thread* that forked the child ends, not the process: only a
child started from the main thread (which lives as long as dfit) is tied; one started
from another thread is left as before.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from typing import Any, Callable

#: ``<linux/prctl.h>``: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1
#: Exit status of a child whose parent died before it could ask to die with it.
ORPHANED_EXIT = 1


def tied_to_dfit() -> Callable[[], None] | None:
    """``subprocess``'s ``preexec_fn`` for a child that must die with this process
    (:func:`die_with_parent` in the child), or None where that cannot be asked: not
    Linux, or not the main thread (module docstring)."""
    if _prctl() is None or threading.current_thread() is not threading.main_thread():
        return None
    # Read before the fork: in the child, os.getpid() is the child's own.
    return functools.partial(die_with_parent, os.getpid())


def die_with_parent(parent_pid: int) -> None:
    """In a child of ``parent_pid``: be SIGKILLed when that parent dies. The parent may
    have died already, between the fork and this call (the kernel would then never send
    the signal): the child then exits at once. Between fork and exec it imports nothing
    (another thread may have held an import lock at the fork)."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # reparented: the parent is gone
        os._exit(ORPHANED_EXIT)


@functools.cache
def _prctl() -> Any:
    """libc's ``prctl`` (loaded once, in the parent: the child of a fork calls it without
    loading anything), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # a libc without prctl (a static or unusual runtime)
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl

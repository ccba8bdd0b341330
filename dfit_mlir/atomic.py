"""Atomic output: write next to the target, fsync, rename. A reader never sees a
half-written file, and a failed or interrupted run leaves whatever was there before
untouched and no temporary file behind.

Ownership (``dfit_mlir.outputs``): a directory written here carries a marker naming its
``kind``, and an existing target is replaced only if it is a dfit output of that kind (or
empty, or the user passed ``--force``); a file written with a ``kind`` is recorded as
dfit's and an existing one is replaced on the same terms.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from dfit_mlir.errors import OutputRefusedError

#: Temporary files and directories of writes in progress; the CLI removes what is left
#: of them when a signal ends the process in a way ``finally`` cannot see.
LIVE_TEMPORARIES: set[Path] = set()


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], kind: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it replaces ``target``.
    ``kind``: a user-named output (``vmfb``, ``manifest``, ``mlir``, ...): an existing
    ``target`` dfit did not write is refused, and the new one is recorded as dfit's."""
    from dfit_mlir import outputs

    target = outputs.resolve(target) if kind is not None else Path(target)
    if kind is not None:
        _require(target, kind, directory=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    LIVE_TEMPORARIES.add(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        LIVE_TEMPORARIES.discard(tmp)
    if kind is not None:
        outputs.record_file(target, kind)


def write_text(target: str | os.PathLike[str], text: str, kind: str | None = None) -> None:
    with atomic_path(target, kind) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(target: str | os.PathLike[str], data: bytes, kind: str | None = None) -> None:
    with atomic_path(target, kind) as tmp:
        tmp.write_bytes(data)


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike[str], kind: str = "output") -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; on success it becomes
    ``target``, with a ``kind`` marker inside. An existing ``target`` is replaced only
    if it is empty or a dfit ``kind`` output holding nothing but dfit's files (else
    :class:`OutputRefusedError`); it is moved aside first and removed only once the new
    one is in place. On failure or interrupt the temporary directory is removed and
    ``target`` is left as it was."""
    from dfit_mlir import outputs

    target = outputs.resolve(target)  # `-o .` names the directory itself, not "" in it
    _require(target, kind, directory=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    LIVE_TEMPORARIES.add(tmp)
    old: Path | None = None
    try:
        yield tmp
        outputs.write_marker(tmp, kind)
        os.chmod(tmp, 0o777 & ~_umask())
        _require(target, kind, directory=True)  # again: something may have appeared meanwhile
        if target.exists() or target.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            LIVE_TEMPORARIES.add(old)
            os.replace(target, old / target.name)
        try:
            os.replace(tmp, target)
        except BaseException:
            if old is not None and not target.exists():
                os.replace(old / target.name, target)  # put the previous output back
            raise
    finally:
        for leftover in (tmp, old):
            if leftover is not None:
                shutil.rmtree(leftover, ignore_errors=True)
                LIVE_TEMPORARIES.discard(leftover)


def remove_temporaries() -> None:
    """Remove every temporary of a write still in progress (signal handlers, atexit)."""
    for path in list(LIVE_TEMPORARIES):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        LIVE_TEMPORARIES.discard(path)


def _require(target: Path, kind: str, *, directory: bool) -> None:
    from dfit_mlir import outputs

    reason = outputs.refusal(target, kind, directory=directory)
    if reason is not None:
        raise OutputRefusedError(f"{target}: refusing to overwrite: {reason} (use --force to replace it)")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

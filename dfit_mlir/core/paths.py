"""Names of the places dfit reads and writes that several layers share: the cache
directory's environment variable, where a compile's manifest sits beside its vmfb, and
private folders and files (the traceback folder: mode 0700, owner checked, files opened
``O_EXCL|O_NOFOLLOW``).
It imports nothing of dfit's, so the file-writing layers (``atomic``, ``outputs``,
``manifest``) can all depend on it without depending on one another."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Overrides where dfit caches calibrations, its ledger of outputs and tracebacks.
CACHE_DIR_ENV = "DFIT_CACHE_DIR"


def manifest_path(vmfb: str | Path) -> Path:
    """``out/model.vmfb`` → ``out/model.manifest.json``."""
    vmfb = Path(vmfb)
    return vmfb.with_name(vmfb.stem + ".manifest.json")


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a folder only this user can use: created with mode 0700 where missing;
    an existing one must be a real directory (not a symlink) owned by this user, and is
    closed to group and others (mode 0700) if it was not. Anything else raises
    PermissionError (someone else could have planted it: ``$TMPDIR/dfit-UID`` is a
    predictable name)."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"{path}: not a directory of this user's (a symlink or a file)")
    if info.st_uid != os.getuid():
        raise PermissionError(f"{path}: owned by uid {info.st_uid}, not by this user")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours (checked above), made by an older dfit: closed now
    return path


def write_private(folder: Path, name: str, text: str) -> Path:
    """A new file ``folder/name`` (mode 0600) with ``text``: never through a symlink, never
    over an existing file (``O_EXCL|O_NOFOLLOW``: FileExistsError/OSError instead)."""
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return path

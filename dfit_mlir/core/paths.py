"""Names of the places dfit reads and writes that several layers share: the cache
directory's environment variable, where a compile's manifest sits beside its vmfb,
private folders and files (the traceback folder: mode 0700, owner checked, files opened
``O_EXCL|O_NOFOLLOW``), and the temporary folders named after the process that made them,
so that a later dfit removes what a killed one left (compile and run alike).
It imports nothing of dfit's, so the file-writing layers (``atomic``, ``outputs``,
``manifest``) can all depend on it without depending on one another."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Iterator, Sequence

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


def private_prefix(prefix: str) -> str:
    """``mkdtemp``'s prefix for one of this process's temporary folders:
    ``prefix<pid>@<host>-`` (the PID tells a later dfit whether the folder's maker is gone,
    :func:`remove_stale_folders`, where :func:`host_token` says the PID is one it can see;
    ``prefix<pid>-`` without a ``/proc``)."""
    token = host_token()
    return f"{prefix}{os.getpid()}@{token}-" if token else f"{prefix}{os.getpid()}-"


@functools.cache
def host_token() -> str:
    """Eight hex digits naming this machine's boot and this process's PID namespace
    (``""`` without a ``/proc``): a PID in a folder's name is one this process can look up
    only where the token is its own. A container sharing ``/tmp`` with others, or machines
    sharing a network folder, see other processes (or none) under the same numbers, and
    would take a live folder for a dead one's."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except (OSError, UnicodeDecodeError):
        return ""
    return hashlib.sha256(f"{boot} {namespace}".encode()).hexdigest()[:8]


def remove_stale_folders(place: Path, prefixes: Sequence[str], suffix: str = "", *, files: bool = False) -> list[Path]:
    """Remove the temporary folders in ``place`` of dfit processes that are gone (SIGKILL,
    a crash, the out-of-memory killer: no ``finally`` ran): a folder named
    ``<prefix><pid>[@<host>]-…<suffix>`` for one of ``prefixes`` (:func:`private_prefix`),
    owned by this user, whose process no longer exists (``files``: regular files so named,
    in place of folders). One of a live process, of another user, of another machine or
    PID namespace (:func:`host_token`), a symlink, or one named without a PID (dfit before
    this rule) is left alone. What was removed."""
    removed = []
    for entry, _, info in _stale_entries(place, prefixes, suffix):
        if not (stat.S_ISREG(info.st_mode) if files else stat.S_ISDIR(info.st_mode)):
            continue
        if files:
            try:
                os.unlink(entry.path)
            except OSError:
                continue
        else:
            shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def remove_stale_notes(place: Path, prefix: str) -> list[Path]:
    """Remove what gone dfit processes were writing elsewhere, as their notes in ``place``
    say: a note is a file ``<prefix><pid>[@<host>]-…`` (:func:`private_prefix`) holding the
    path of a temporary folder its process made beside an output, ``.<name>.<pid>[@<host>]-….tmp``, which
    :func:`remove_stale_folders` of ``place`` cannot see. A note of a dead process owned
    by this user is removed, and the folder it names with it if that folder is named so
    for the same PID (and host), is a folder (not a symlink) and is this user's. What was
    removed (the folders)."""
    removed = []
    for entry, maker, info in _stale_entries(place, (prefix,)):
        try:
            if not stat.S_ISREG(info.st_mode):
                continue
            folder = Path(Path(entry.path).read_text(encoding="utf-8"))
            os.unlink(entry.path)
            found = folder.lstat()
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if re.fullmatch(rf"\..+\.{re.escape(maker)}-[^/]*\.tmp", folder.name) and stat.S_ISDIR(found.st_mode) \
                and found.st_uid == os.getuid():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _stale_entries(place: Path, prefixes: Sequence[str],
                   suffix: str = "") -> Iterator[tuple[os.DirEntry[str], str, os.stat_result]]:
    """(entry, its maker as named: ``<pid>[@<host>]``, its ``lstat``) of each entry of
    ``place`` named ``<prefix><pid>[@<host>]-…<suffix>`` for one of ``prefixes``, made on
    this machine in this PID namespace (or named before the host was), owned by this user,
    whose process is gone."""
    try:
        entries = list(os.scandir(place))
    except OSError:
        return
    for entry in entries:
        maker = _maker(entry.name, prefixes) if entry.name.endswith(suffix) else None
        if maker is None:
            continue
        pid_text, _, host = maker.partition("@")
        pid = int(pid_text)
        if (host and host != host_token()) or pid == os.getpid() or process_alive(pid):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid == os.getuid():
            yield entry, maker, info


def _maker(name: str, prefixes: Sequence[str]) -> str | None:
    """``<pid>[@<host>]`` of ``<prefix><pid>[@<host>]-…``, or None for a name of another form."""
    for prefix in prefixes:
        if name.startswith(prefix):
            found = re.match(r"([0-9]+(?:@[0-9a-f]{8})?)-", name[len(prefix):])
            if found:
                return found.group(1)
    return None


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts: it may be ours
    reused; a zombie counts until it is reaped)."""
    if pid <= 0:
        return True  # not a PID a process has: leave the folder alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True

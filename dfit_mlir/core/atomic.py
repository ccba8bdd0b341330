"""Atomic output: write next to the target, fsync, rename. A reader never sees a
half-written file, and a failed or interrupted run leaves whatever was there before
untouched and no temporary file behind.

Ownership (``dfit_mlir.core.outputs``): a directory written here carries a marker naming its
``kind``, and an existing target is replaced only if it is a dfit output of that kind (or
empty, or the user passed ``--force``); a file written with a ``kind`` is recorded as
dfit's and an existing one is replaced on the same terms.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from dfit_mlir.core import children, outputs, paths
from dfit_mlir.core.errors import InvalidInputError, OutputRefusedError

#: Temporary files and directories of writes in progress; the CLI removes what is left
#: of them when a signal ends the process in a way ``finally`` cannot see.
LIVE_TEMPORARIES: set[Path] = set()


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], kind: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it replaces ``target``.
    ``kind``: a user-named output (``vmfb``, ``manifest``, ``mlir``, ...): an existing
    ``target`` dfit did not write is refused, and the new one is recorded as dfit's."""
    target = outputs.resolve(target) if kind is not None else Path(target)
    if kind is not None:
        _require(target, kind, directory=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    # ``.<name>.<pid>-<random>.tmp``: what a dfit killed while writing ``target`` left
    # beside it (a vmfb half-written) is removed by the next write of it.
    prefix = f".{target.name}."
    paths.remove_stale_folders(target.parent, (prefix,), suffix=".tmp", files=True)
    with signals_held():
        fd, tmp_name = tempfile.mkstemp(prefix=paths.private_prefix(prefix), suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        LIVE_TEMPORARIES.add(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        if kind is not None:
            # Recorded first: the moment the file appears it is known as dfit's (another
            # dfit writing the same path concurrently must not take it for the user's).
            outputs.record_file(target, kind, content=tmp)
        check_not_interrupted()
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        LIVE_TEMPORARIES.discard(tmp)


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
    target = outputs.resolve(target)  # `-o .` names the directory itself, not "" in it
    _require(target, kind, directory=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    # ``.<name>.<pid>-<random>.tmp``: what a dfit killed while writing ``target`` left
    # beside it (a bundle half-written: MBs) is removed by the next write of it.
    prefix = f".{target.name}."
    paths.remove_stale_folders(target.parent, (prefix,), suffix=".tmp")
    with signals_held():
        tmp = Path(tempfile.mkdtemp(prefix=paths.private_prefix(prefix), suffix=".tmp", dir=target.parent))
        LIVE_TEMPORARIES.add(tmp)
        # And a note of it in $TMPDIR, so that the next dfit, whatever it writes, removes it
        # if a SIGKILL leaves it (remove_stale_scratch): a full run's bundle is written
        # while its tool runs, for minutes.
        note = _note_of(tmp)
        LIVE_TEMPORARIES.add(note)
    old: Path | None = None
    try:
        yield tmp
        outputs.write_marker(tmp, kind)
        os.chmod(tmp, 0o777 & ~_umask())
        _require(target, kind, directory=True)  # again: something may have appeared meanwhile
        with signals_held():  # the swap is not interrupted half-way
            check_not_interrupted()
            old = _swap_in(tmp, target)
    finally:
        for leftover in (tmp, old):
            if leftover is not None:
                shutil.rmtree(leftover, ignore_errors=True)
                LIVE_TEMPORARIES.discard(leftover)
        note.unlink(missing_ok=True)
        LIVE_TEMPORARIES.discard(note)


#: The notes of the output folders being written (:func:`atomic_directory`), in ``$TMPDIR``.
OUTPUT_NOTE_PREFIX = "dfit-writing-"


def _note_of(folder: Path) -> Path:
    """A note in ``$TMPDIR`` (``dfit-writing-<pid>-…``) naming ``folder``, a temporary
    folder of this process's beside an output (:func:`paths.remove_stale_notes`)."""
    fd, name = tempfile.mkstemp(prefix=paths.private_prefix(OUTPUT_NOTE_PREFIX))
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(str(folder.resolve()))
    return Path(name)


#: The kinds of scratch folder dfit makes in ``$TMPDIR`` (:func:`scratch_directory`): a
#: run's inputs and profile (which can take GBs), a profile of its own, the trace plan's
#: summarised invocations, the compile's target probe, the driver's family questions.
SCRATCH_PREFIXES = ("dfit-run-", "dfit-profile-", "dfit-trace-plan-", "dfit-preflight-", "dfit-ask-")


@contextlib.contextmanager
def scratch_directory(prefix: str) -> Iterator[Path]:
    """A temporary working folder, ``$TMPDIR/<prefix><pid>-<random>`` (``prefix``: one of
    :data:`SCRATCH_PREFIXES`), removed on exit, on an exception and on SIGINT/SIGTERM: it
    is registered before any signal can arrive (they are held back while it is created),
    so no interrupt leaves it behind. What a SIGKILL leaves, the next run or compile
    removes (:func:`remove_stale_scratch`)."""
    if prefix not in SCRATCH_PREFIXES:  # a folder of a kind no one would ever clean up
        raise ValueError(f"scratch prefix {prefix!r} is not one of SCRATCH_PREFIXES")
    with signals_held():
        path = Path(tempfile.mkdtemp(prefix=paths.private_prefix(prefix)))
        LIVE_TEMPORARIES.add(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        LIVE_TEMPORARIES.discard(path)


#: The variables that name the temporary folder, in the order Python's ``tempfile`` reads
#: them (an empty one counts as unset).
TEMP_DIR_VARIABLES = ("TMPDIR", "TEMP", "TMP")


def require_usable_temp_dir() -> None:
    """Refuse (:class:`InvalidInputError`, exit 2) a ``$TMPDIR`` that names no folder this
    user can write: ``tempfile`` passes over it in silence for ``/tmp``, and a run's
    profile (GBs) filled the disk the user had pointed ``TMPDIR`` away from."""
    name = next((name for name in TEMP_DIR_VARIABLES if os.environ.get(name)), None)
    if name is None:
        return
    value = os.environ[name]
    problem = _temp_dir_problem(value)
    if problem is not None:
        shown = value if value.isprintable() else repr(value)  # one line, whatever the variable holds
        raise InvalidInputError(f"{name}={shown}: {problem}; dfit writes its scratch there (a run's profile: GBs): "
                                f"set {name} to a writable folder with room, or unset it")


def _temp_dir_problem(value: str) -> str | None:
    """What keeps ``value`` from being the temporary folder, or None. Writable is tried,
    as ``tempfile`` tries it (a file made and removed): permission bits do not bind
    root, and a folder such as ``/proc`` says it is writable and is not."""
    if not os.path.exists(value):
        return "no such directory"
    if not os.path.isdir(value):
        return "not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".dfit-probe-", dir=value)
    except OSError as error:
        return f"no file can be made there ({error.strerror or type(error).__name__})"
    os.close(fd)
    os.unlink(probe)
    return None


def remove_stale_scratch() -> list[Path]:
    """Remove the scratch folders (:func:`scratch_directory`) that dfit processes killed
    before this one left in ``$TMPDIR`` (a SIGKILL, a crash: no ``finally`` ran), those
    of this user whose process is gone (:func:`paths.remove_stale_folders`), and the
    output folders they were writing (:func:`atomic_directory`'s, beside their targets,
    named in notes in ``$TMPDIR``: :func:`paths.remove_stale_notes`)."""
    place = Path(tempfile.gettempdir())
    return [*paths.remove_stale_folders(place, SCRATCH_PREFIXES), *paths.remove_stale_notes(place, OUTPUT_NOTE_PREFIX)]


#: Depth of the sections that must not be interrupted half-way, and a signal that
#: arrived meanwhile (raised when the outermost section ends).
_held = 0
_pending: int | None = None
#: The first SIGINT/SIGTERM this process received. The handler's exception can be lost:
#: a signal handled while Python runs a finalizer (``__del__``, a weakref callback) has
#: its exception printed and dropped, and the command would run on to exit 0. Every
#: output checks this before it is put in place (:func:`check_not_interrupted`).
_received: int | None = None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Defer SIGINT/SIGTERM (as routed by :func:`on_signal`) to the end of the block: a
    temporary is then created *and* registered, or not created. Blocking the signals
    with a thread mask would not do: another thread (pyarrow's, numpy's) takes them."""
    global _held, _pending
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _pending is not None:
            signum, _pending = _pending, None
            _raise_for(signum)


#: How often a wait on a child checks for a signal whose exception was lost (see
#: :data:`_received`): the check before an output is written comes only after a long
#: run's last invocation (a `dfit run` once went on for over 120 s after its SIGINT).
LOST_SIGNAL_CHECK_SECONDS = 0.25


def run_process(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True)``, the child started with
    the signals held (:func:`start_process`) and waited for (:func:`finish_process`)."""
    return finish_process(start_process(command), command)


def start_process(command: Sequence[str]) -> subprocess.Popen[str]:
    """``command`` started, its output piped, with the signals held (:func:`signals_held`):
    ``Popen`` returns once the child has called ``exec``, and a SIGINT/SIGTERM raised while
    it waits would leave a running child that nothing holds to kill (an
    ``iree-benchmark-module`` outlived a SIGTERMed ``dfit run``). Held, the signal is
    raised once the child is held, and the child is killed and reaped. A SIGKILL no
    handler sees kills the child too (:func:`children.tied_to_dfit`). The caller
    :func:`finish_process`-es it, or :func:`kill_process`-es it where it cannot."""
    child: subprocess.Popen[str] | None = None
    try:
        with signals_held():
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=children.tied_to_dfit())
    except BaseException:
        if child is not None:
            kill_process(child)
        raise
    return child


def finish_process(child: subprocess.Popen[str], command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Wait for ``child`` (:func:`start_process`), its output read; interrupted, it is
    killed and reaped."""
    try:
        while True:
            try:
                stdout, stderr = child.communicate(timeout=LOST_SIGNAL_CHECK_SECONDS)
                break
            except subprocess.TimeoutExpired:  # retried without losing output (subprocess's contract)
                check_not_interrupted()
    except BaseException:
        kill_process(child)
        raise
    return subprocess.CompletedProcess(list(command), child.returncode, stdout, stderr)


def kill_process(child: subprocess.Popen[str]) -> None:
    """Kill ``child`` and reap it, its pipes closed (nothing if it was reaped already)."""
    if child.returncode is None:
        child.kill()
    with child:  # closes its pipes and reaps it
        pass


def on_signal(signum: int, frame: object) -> None:
    """The CLI's SIGINT and SIGTERM handler: raise at once, or when the section that
    creates or swaps an output ends."""
    global _pending, _received
    if _received is None:
        _received = signum
    if _held:
        _pending = signum
        return
    _raise_for(signum)


def forget_caught_interrupt() -> None:
    """Clear CPython's record of a KeyboardInterrupt that was raised and then caught.

    A KeyboardInterrupt that propagates out of an ``eval``/``exec`` of a string sets the
    interpreter's "unhandled KeyboardInterrupt" flag even when a caller catches it, and
    under ``python -m`` Python then ends by killing itself with SIGINT instead of exiting
    with the status dfit chose (CPython 3.11: ``run_eval_code_obj``). The stdlib evaluates
    strings at import time (``collections.namedtuple``), so a SIGINT landing in an import
    made ``dfit run`` print "interrupted" and die by SIGINT (status -2, not 130) in 5 of
    40 tries. Evaluating a string that completes resets the flag.
    """
    exec("None")  # noqa: S102 — a constant string: its only effect is the reset above


def check_not_interrupted() -> None:
    """Raise the interrupt of a signal this process received whose exception was lost
    (see :data:`_received`): an output is not put in place after SIGINT/SIGTERM."""
    if _received is not None:
        _raise_for(_received)


def forget_signals() -> None:
    """Start a command afresh (the CLI's tests run many commands in one process)."""
    global _received, _pending
    _received = _pending = None


def _raise_for(signum: int) -> None:
    import signal

    from dfit_mlir.core.errors import Interrupted

    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(f"signal {signum}")


def _swap_in(tmp: Path, target: Path, attempts: int = 5) -> Path | None:
    """Rename ``tmp`` to ``target``, moving a previous ``target`` aside first; returns
    the folder holding the previous one (removed by the caller). Several dfit processes
    writing one output race here: a target that vanished or reappeared meanwhile is
    retried, and the last writer's output stands, complete."""
    old: Path | None = None
    for attempt in range(attempts):
        if target.exists() or target.is_symlink():
            if old is None:
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
                LIVE_TEMPORARIES.add(old)
            aside = old / f"{target.name}.{attempt}"
            try:
                os.replace(target, aside)
            except FileNotFoundError:
                pass  # another writer moved it first
        try:
            os.replace(tmp, target)
            return old
        except OSError as error:
            if attempt == attempts - 1 or not (target.exists() or target.is_symlink()):
                _restore(old, target)
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
                    LIVE_TEMPORARIES.discard(old)
                raise OutputRefusedError(f"{target}: cannot put the new output in place: {error.strerror}") from None
    return old


def _restore(old: Path | None, target: Path) -> None:
    """Put the most recent previous output back where the new one could not go."""
    if old is None or target.exists():
        return
    previous = sorted(old.iterdir(), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    if previous:
        os.replace(previous[-1], target)


def remove_temporaries() -> None:
    """Remove every temporary of a write still in progress (signal handlers, atexit)."""
    for path in list(LIVE_TEMPORARIES):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        LIVE_TEMPORARIES.discard(path)


def _require(target: Path, kind: str, *, directory: bool) -> None:
    reason = outputs.refusal(target, kind, directory=directory)
    if reason is not None:
        raise OutputRefusedError(f"{target}: refusing to overwrite: {reason} (use --force to replace it)")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

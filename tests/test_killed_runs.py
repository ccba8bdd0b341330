"""A ``dfit run`` killed outright (SIGKILL, the out-of-memory killer, a crash: no
``finally`` and no handler runs) leaves nothing running and nothing for good:

* its child (the ``iree-benchmark-module`` of a ``full`` run, the spawned Python of an
  in-process one) dies with it (``prctl(PR_SET_PDEATHSIG)``, :mod:`dfit_mlir.core.children`);
* its scratch folder, ``$TMPDIR/dfit-run-<pid>-…`` (a long run's profile: GBs), is
  removed by the next ``dfit run``: only a folder whose PID is no longer a process and
  which this user owns (:func:`dfit_mlir.core.atomic.remove_stale_scratch`; the compile
  side's folders: tests/test_pass_dumps.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

from dfit_mlir.core import atomic, children, paths
from tests.conftest import CONVNET

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")

#: Seconds a killed dfit's child may take to be gone (the kernel signals it at once).
CHILD_GONE_SECONDS = 5


def _dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _made(pid: int) -> str:
    """How dfit names its temporaries' maker ``pid`` on this machine (:func:`paths.private_prefix`)."""
    return f"{pid}@{paths.host_token()}"


def _parent_and_state(pid: int) -> tuple[int, str] | None:
    """``(ppid, state)`` of a process from ``/proc/PID/stat``, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat.rpartition(")")[2].split()[:2]  # the name in parentheses may hold spaces
    return int(ppid), state


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (_parent_and_state(int(entry.name)) or (0, ""))[0] == pid:
            found.append(int(entry.name))
    return found


def _program(pid: int) -> str:
    try:
        return Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()).name
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Not gone and not a zombie (a reparented child is reaped by whatever PID 1 is)."""
    found = _parent_and_state(pid)
    return found is not None and found[1] != "Z"


def _wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def vmfb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dfit_mlir.passes.instrumented_compile import compile_instrumented

    return compile_instrumented(CONVNET, tmp_path_factory.mktemp("killed-runs") / "convnet.vmfb", mode="full").vmfb


def _started_run(vmfb: Path, mode: str, scratch: Path, work: Path) -> subprocess.Popen[bytes]:
    """``dfit run`` of a million invocations (it would run for minutes) in a child."""
    return subprocess.Popen([sys.executable, "-m", "dfit_mlir", "run", str(vmfb), "--mode", mode,
                             "--repeat", "1000000", "-o", str(work / "bundle")], cwd=work,
                            env={**os.environ, "TMPDIR": str(scratch)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


#: What shows that a run's module is running, by mode: the profiling tool has started
#: (full), the spawned Python has begun its invocations (its progress file, ids).
_RUNNING = {
    "full": lambda pid, folder: any(_program(c) == "iree-benchmark-module" for c in _children(pid)),
    "ids": lambda pid, folder: (folder / "progress").exists(),
}


@pytest.mark.parametrize("mode", sorted(_RUNNING))
def test_a_killed_run_leaves_no_child_and_the_next_run_removes_its_folder(vmfb: Path, mode: str,
                                                                        tmp_path: Path) -> None:
    scratch, work = tmp_path / "scratch", tmp_path / "work"
    scratch.mkdir()
    work.mkdir()
    dfit = _started_run(vmfb, mode, scratch, work)
    try:
        _wait_for(lambda: any(scratch.glob(f"dfit-run-{_made(dfit.pid)}-*")), 60, "the run's scratch folder")
        folder = next(scratch.glob(f"dfit-run-{_made(dfit.pid)}-*"))
        _wait_for(lambda: _RUNNING[mode](dfit.pid, folder) or dfit.poll() is not None, 60, "the module to run")
        if mode == "full":  # its bundle is being written as the tool runs: beside the output
            _wait_for(lambda: any(work.glob(f".bundle.{_made(dfit.pid)}-*.tmp")), 60, "the bundle's folder")
        assert dfit.poll() is None, "dfit ended before it could be killed"
        running = [pid for pid in _children(dfit.pid) if _running(pid)]
        assert running, "dfit has no child running the module"
    finally:
        dfit.kill()
        dfit.wait()
    try:
        _wait_for(lambda: not any(_running(pid) for pid in running), CHILD_GONE_SECONDS, "dfit's children to die")
    finally:
        for pid in running:  # not left burning a core for the rest of the suite
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
    assert folder.is_dir()  # what SIGKILL leaves: no finally ran
    writing = list(work.glob(f".bundle.{_made(dfit.pid)}-*.tmp"))
    assert len(writing) == (mode == "full")

    live = scratch / f"dfit-run-{_made(os.getpid())}-alive"  # a run still going (this process)
    other = scratch / f"not-dfit-{dfit.pid}-mine"  # the user's, with a dead PID in its name
    for kept in (live, other):
        kept.mkdir()
    next_run = subprocess.run([sys.executable, "-m", "dfit_mlir", "run", str(vmfb), "--mode", "none",
                               "-o", str(work / "next")], cwd=work, env={**os.environ, "TMPDIR": str(scratch)},
                              capture_output=True, text=True, timeout=240)
    assert next_run.returncode == 0, next_run.stderr
    assert not folder.exists() and not any(path.exists() for path in writing)  # (another output written)
    assert not list(scratch.glob(f"{atomic.OUTPUT_NOTE_PREFIX}*"))
    assert live.is_dir() and other.is_dir()


#: ``dfit run`` with SIGTERM sent to it inside ``Thread.start`` of the thread that follows
#: the profile (after the thread runs, before ``start`` returns): where a loaded machine's
#: signal can land.
_TERM_INSIDE_THE_FOLLOWERS_START = """
import os, signal, sys, threading, time
start = threading.Thread.start
def started(thread):
    start(thread)
    if thread.name == "dfit-follow":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs here, inside start
threading.Thread.start = started
from dfit_mlir.__main__ import main
sys.argv = ["dfit", *sys.argv[1:]]
main()
"""


def test_a_sigterm_while_the_follower_starts_is_exit_130_not_a_hang(vmfb: Path, tmp_path: Path) -> None:
    """An interrupt inside the follower's ``start`` left it waiting for ever for the end of
    a run it would never be told of, and the interpreter waited for it at exit: ``dfit run``
    said "interrupted" and hung (1 of 40 SIGTERMs on two busy cores)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    child = subprocess.run([sys.executable, "-c", _TERM_INSIDE_THE_FOLLOWERS_START, "run", str(vmfb), "--mode",
                            "full", "--repeat", "20000", "-o", str(tmp_path / "bundle")],
                           env={**os.environ, "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=120)
    assert (child.returncode, child.stderr.strip()) == (130, "dfit run: interrupted")
    assert not (tmp_path / "bundle").exists() and not list(scratch.iterdir())


def test_the_output_folders_of_dead_processes_are_removed_as_their_notes_say(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An output folder being written (``.<name>.<pid>-….tmp`` beside its target) is noted
    in ``$TMPDIR`` (``dfit-writing-<pid>-…``) while it is written; the next ``dfit run``
    removes a dead process's and its note. A live process's note, a note naming a folder
    of another PID or of another form, a symlink, or a file: the folder stays."""
    scratch, outputs = tmp_path / "tmp", tmp_path / "out"
    scratch.mkdir()
    outputs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with atomic.atomic_directory(outputs / "b", "bundle") as writing:
        notes = list(scratch.glob(f"{atomic.OUTPUT_NOTE_PREFIX}{_made(os.getpid())}-*"))
        assert len(notes) == 1 and notes[0].read_text() == str(writing.resolve())
        assert atomic.remove_stale_scratch() == [] and writing.is_dir()  # this process's: alive
    assert not notes[0].exists()
    dead, other_dead = _dead_pid(), _dead_pid()

    def noted(maker: str, folder: Path, name: str) -> Path:
        (scratch / f"{atomic.OUTPUT_NOTE_PREFIX}{maker}-{name}").write_text(str(folder))
        return folder

    stale = [noted(_made(dead), outputs / f".b.{_made(dead)}-abc.tmp", "1"),
             noted(str(other_dead), outputs / f".b.{other_dead}-abc.tmp", "7")]  # named by a dfit before the host
    for folder in stale:
        folder.mkdir()
        (folder / "events.parquet").write_bytes(b"\0" * 64)
    other_host = "0" * 8 if paths.host_token() != "0" * 8 else "1" * 8
    kept = [noted(_made(os.getppid()), outputs / f".b.{_made(os.getppid())}-abc.tmp", "2"),
            noted(_made(dead), outputs / f".b.{_made(other_dead)}-abc.tmp", "3"),
            noted(_made(dead), outputs / f".b.{dead}-abc.tmp", "8"),
            noted(_made(dead), outputs / "not-a-temporary", "4")]
    for folder in kept:
        folder.mkdir()
    elsewhere = noted(f"{dead}@{other_host}", outputs / f".b.{dead}@{other_host}-abc.tmp", "9")
    elsewhere.mkdir()  # another container's or machine's: its PID is not one to look up here
    link = noted(_made(dead), outputs / f".l.{_made(dead)}-abc.tmp", "5")
    link.symlink_to(outputs / "not-a-temporary")
    file = noted(_made(dead), outputs / f".f.{_made(dead)}-abc.tmp", "6")
    file.write_bytes(b"")
    assert sorted(atomic.remove_stale_scratch()) == sorted(stale)
    assert not any(folder.exists() for folder in stale)
    assert all(folder.is_dir() for folder in kept) and elsewhere.is_dir() and link.is_symlink() and file.is_file()
    assert sorted(note.name for note in scratch.iterdir()) == sorted([
        f"{atomic.OUTPUT_NOTE_PREFIX}{_made(os.getppid())}-2", f"{atomic.OUTPUT_NOTE_PREFIX}{dead}@{other_host}-9"])


def test_stale_scratch_of_dead_processes_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scratch prefix, named as dfit names them now and as it did before the host
    was in the name; a live PID, another machine's or PID namespace's, another name, no
    PID, a symlink: left."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _dead_pid()
    stale = [tmp_path / f"{prefix}{maker}-abc123" for prefix in atomic.SCRATCH_PREFIXES for maker in (_made(dead), dead)]
    other_host = "0" * 8 if paths.host_token() != "0" * 8 else "1" * 8
    kept = [tmp_path / f"dfit-run-{_made(os.getpid())}-abc123", tmp_path / f"dfit-run-{_made(os.getppid())}-abc123",
            tmp_path / f"dfit-run-{dead}@{other_host}-abc123", tmp_path / f"dfit-run-{dead}@{other_host[:4]}-abc123",
            tmp_path / "dfit-run-abc123", tmp_path / f"dfit-other-{dead}-abc123", tmp_path / "elsewhere"]
    for folder in stale + kept:
        (folder / "paged").mkdir(parents=True)
        (folder / "profile.ireeprof").write_bytes(b"\0" * 64)
    link = tmp_path / f"dfit-run-{dead}-link"
    link.symlink_to(tmp_path / "elsewhere")
    assert sorted(atomic.remove_stale_scratch()) == sorted(stale)
    assert not any(folder.exists() for folder in stale)
    assert all(folder.is_dir() for folder in kept)
    assert link.is_symlink() and (link / "profile.ireeprof").exists()


_IN_ANOTHER_PID_NAMESPACE = ("import json, sys; from dfit_mlir.core import atomic, paths; "
                             "print(json.dumps([paths.process_alive(int(sys.argv[1])), "
                             "[str(path) for path in atomic.remove_stale_scratch()]]))")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1) here")
def test_a_dfit_in_another_pid_namespace_leaves_a_live_folder_alone(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A dfit in a container of its own sharing ``$TMPDIR`` (a real PID namespace:
    ``unshare --pid``) cannot see this process, and leaves its scratch folder and the note
    of its output being written alone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with atomic.scratch_directory("dfit-run-") as live, atomic.atomic_directory(tmp_path / "b", "bundle") as writing:
        found = None
        for isolate in (["--pid"], ["--user", "--map-root-user", "--pid"]):  # as root, or as a user where allowed
            child = subprocess.run(["unshare", *isolate, "--fork", "--mount-proc", sys.executable, "-c",
                                    _IN_ANOTHER_PID_NAMESPACE, str(os.getpid())],
                                   env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
                                   timeout=120)
            if child.returncode == 0:
                found = json.loads(child.stdout)
                break
        if found is None:
            pytest.skip(f"no PID namespace can be made here: {child.stderr.strip()[-200:]}")
        assert found == [False, []]  # this process is not one it can see, and it removed nothing
        assert live.is_dir() and writing.is_dir() and list(tmp_path.glob(f"{atomic.OUTPUT_NOTE_PREFIX}*"))


def test_scratch_folders_carry_their_makers_pid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with atomic.scratch_directory("dfit-run-") as folder:
        assert folder.parent == tmp_path and folder.name.startswith(f"dfit-run-{_made(os.getpid())}-")
        assert atomic.remove_stale_scratch() == []  # this process's own: alive
    assert not folder.exists()
    with pytest.raises(ValueError, match="SCRATCH_PREFIXES"), atomic.scratch_directory("dfit-unlisted-"):
        pass


def test_a_spark_session_removes_the_scratch_a_killed_dfit_left(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's warehouse and shuffle folder (``$TMPDIR/dfit-spark-<pid>-…``, removed at
    exit, so left by a SIGKILL) is named after its process; the next one removes a dead
    process's, not a live one's (no Spark started: the folder is made before it)."""
    from dfit_mlir.fleet.store import engines

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(engines, "_SPARK_SCRATCH", None)
    stale, live = tmp_path / f"dfit-spark-{_made(_dead_pid())}-abc", tmp_path / f"dfit-spark-{_made(os.getppid())}-abc"
    for folder in (stale, live):
        (folder / "local").mkdir(parents=True)
    scratch = engines._spark_scratch()
    assert scratch.parent == tmp_path and scratch.name.startswith(f"dfit-spark-{_made(os.getpid())}-")
    assert not stale.exists() and live.is_dir()


def test_a_bundle_half_written_by_a_killed_dfit_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """The temporary folder beside an output (``.<name>.<pid>-<random>.tmp``: a bundle
    being written, MBs) that a SIGKILL left is removed when the output is next written;
    a live process's, another name's (``.bundle.notes``, a ``.tmp`` without a PID) stay."""
    target = tmp_path / "bundle"
    stale = tmp_path / f".bundle.{_made(_dead_pid())}-abc.tmp"
    kept = [tmp_path / f".bundle.{_made(os.getppid())}-abc.tmp", tmp_path / ".bundle.notes", tmp_path / ".bundle.abc.tmp",
            tmp_path / f".other.{_dead_pid()}-abc.tmp"]
    for folder in (stale, *kept):
        (folder / "events.parquet").parent.mkdir(parents=True)
        (folder / "events.parquet").write_bytes(b"\0" * 64)
    with atomic.atomic_directory(target, "bundle") as writing:
        assert writing.name.startswith(f".bundle.{_made(os.getpid())}-") and writing.name.endswith(".tmp")
        (writing / "summary.json").write_text("{}")
    assert (target / "summary.json").is_file() and not stale.exists()
    assert all(folder.is_dir() for folder in kept)


def test_a_file_half_written_by_a_killed_dfit_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """The same for a file output (``.m.vmfb.<pid>-<random>.tmp``: a vmfb half-written):
    a dead process's removed, a live one's, a folder so named and other names kept."""
    target = tmp_path / "m.vmfb"
    stale = tmp_path / f".m.vmfb.{_made(_dead_pid())}-abc.tmp"
    kept = [tmp_path / f".m.vmfb.{_made(os.getppid())}-abc.tmp", tmp_path / ".m.vmfb.abc.tmp", tmp_path / "m.vmfb.notes"]
    for path in (stale, *kept):
        path.write_bytes(b"\0" * 64)
    folder = tmp_path / f".m.vmfb.{_made(_dead_pid())}-dir.tmp"
    folder.mkdir()
    atomic.write_bytes(target, b"vmfb")
    assert target.read_bytes() == b"vmfb" and not stale.exists()
    assert all(path.is_file() for path in kept) and folder.is_dir()
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(f".m.vmfb.{_made(os.getpid())}-")]


_PDEATHSIG = ("import ctypes; libc = ctypes.CDLL(None); found = ctypes.c_int(-1); "
              "libc.prctl(2, ctypes.byref(found), 0, 0, 0); print(found.value)")  # PR_GET_PDEATHSIG


def test_a_tool_child_asks_to_die_with_dfit() -> None:
    started = subprocess.run([sys.executable, "-c", _PDEATHSIG], capture_output=True, text=True, check=True,
                             preexec_fn=children.tied_to_dfit())
    assert started.stdout.strip() == str(int(signal.SIGKILL))
    plain = subprocess.run([sys.executable, "-c", _PDEATHSIG], capture_output=True, text=True, check=True)
    assert plain.stdout.strip() == "0"


def test_a_child_whose_parent_died_before_it_asked_exits() -> None:
    """The race: dfit killed between the fork and the prctl (the kernel would never send
    the signal, the child is already reparented): the child's parent is not the one it
    was started by, and it exits at once."""
    orphan = subprocess.run([sys.executable, "-c", "from dfit_mlir.core.children import die_with_parent; "
                             f"die_with_parent({_dead_pid()}); print('still running')"],
                            capture_output=True, text=True)
    assert orphan.returncode == children.ORPHANED_EXIT and "still running" not in orphan.stdout

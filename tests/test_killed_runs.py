"""A ``dfit run`` killed outright (SIGKILL, the out-of-memory killer, a crash: no
``finally`` and no handler runs) leaves its scratch folder, ``$TMPDIR/dfit-run-<pid>-…``
(a long run's profile: GBs); the next ``dfit run`` removes it: only a folder whose PID is
no longer a process and which this user owns
(:func:`dfit_mlir.core.atomic.remove_stale_scratch`; the compile side's folders:
tests/test_pass_dumps.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dfit_mlir.core import atomic


def _dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_scratch_of_dead_processes_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scratch prefix; a live PID, another name, no PID, a symlink: left."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _dead_pid()
    stale = [tmp_path / f"{prefix}{dead}-abc123" for prefix in atomic.SCRATCH_PREFIXES]
    kept = [tmp_path / f"dfit-run-{os.getpid()}-abc123", tmp_path / f"dfit-run-{os.getppid()}-abc123",
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


def test_scratch_folders_carry_their_makers_pid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with atomic.scratch_directory("dfit-run-") as folder:
        assert folder.parent == tmp_path and folder.name.startswith(f"dfit-run-{os.getpid()}-")
        assert atomic.remove_stale_scratch() == []  # this process's own: alive
    assert not folder.exists()
    with pytest.raises(ValueError, match="SCRATCH_PREFIXES"), atomic.scratch_directory("dfit-unlisted-"):
        pass

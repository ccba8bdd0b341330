"""A ``$TMPDIR`` dfit cannot use is refused, never passed over: Python's ``tempfile``
skips a TMPDIR that does not exist, is not a directory or is not writable and takes
``/tmp``, so a run's profile (GBs) filled the disk the user had pointed TMPDIR away
from. Every command refuses it first, with one line naming the variable, its value and
what is wrong (exit 2) and nothing written (:func:`dfit_mlir.core.atomic.require_usable_temp_dir`).
``dfit run --help`` says what a run writes there and how much.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dfit_mlir.cli.app import main
from dfit_mlir.core.errors import EXIT_INVALID_INPUT
from tests.conftest import CONVNET


def _unusable(kind: str, tmp_path: Path) -> Path:
    """A TMPDIR value of ``kind``: missing, a file, a folder without write permission,
    one whose permissions say writable where no file can be made (``/proc``, root or
    not), a missing one whose name holds a newline."""
    if kind == "proc":
        return Path("/proc")
    path = tmp_path / ("tmp\nnewline" if kind == "newline" else f"tmp-{kind}")
    if kind == "file":
        path.write_text("not a folder\n")
    elif kind == "read-only":
        path.mkdir()
        path.chmod(0o555)
    return path


_PROBLEMS = {"missing": "no such directory", "file": "not a directory", "read-only": "no file can be made there (",
             "proc": "no file can be made there (", "newline": "no such directory"}
_COMMANDS = {
    "run": lambda work: ["run", str(work / "m.vmfb"), "--mode", "none", "-o", str(work / "bundle")],
    "compile": lambda work: ["compile", str(CONVNET), "--dfit-tag", "-o", str(work / "m.vmfb")],
}


@pytest.mark.parametrize("command", sorted(_COMMANDS))
@pytest.mark.parametrize("kind", sorted(_PROBLEMS))
def test_an_unusable_tmpdir_is_refused(kind: str, command: str, tmp_path: Path) -> None:
    value = _unusable(kind, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "m.vmfb").write_bytes(b"not looked at: TMPDIR is refused first")
    before = sorted(work.iterdir())
    if kind == "read-only" and os.access(value, os.W_OK):
        pytest.skip("permissions do not bind this user (root): a folder of mode 0555 is writable to it")
    if kind == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    result = CliRunner().invoke(main, _COMMANDS[command](work), env={"TMPDIR": str(value)}, prog_name="dfit")
    assert result.exit_code == EXIT_INVALID_INPUT, result.output
    lines = result.output.strip().splitlines()
    shown = str(value) if str(value).isprintable() else repr(str(value))  # one line whatever the value holds
    assert len(lines) == 1 and lines[0].startswith(f"dfit: TMPDIR={shown}: {_PROBLEMS[kind]}"), result.output
    assert sorted(work.iterdir()) == before


def test_the_first_variable_set_is_the_one_checked(tmp_path: Path) -> None:
    """TMPDIR unset or empty: TEMP, as ``tempfile`` reads them; an empty one is unset."""
    missing = tmp_path / "missing"
    result = CliRunner().invoke(main, ["backends"], env={"TMPDIR": "", "TEMP": str(missing)}, prog_name="dfit")
    assert result.exit_code == EXIT_INVALID_INPUT
    assert result.output.startswith(f"dfit: TEMP={missing}: no such directory;"), result.output
    fine = CliRunner().invoke(main, ["backends"], env={"TMPDIR": str(tmp_path), "TEMP": str(missing)},
                              prog_name="dfit")
    assert fine.exit_code == 0, fine.output


def test_run_help_says_where_its_scratch_goes_and_how_much() -> None:
    shown = " ".join(CliRunner().invoke(main, ["run", "--help"], prog_name="dfit").output.split())
    assert "$TMPDIR, in a dfit-run-* folder removed when the run ends" in shown
    assert "a few KB an invocation" in shown and "set TMPDIR to a folder with room" in shown

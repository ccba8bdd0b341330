"""Issue 26, pass dumps (``--lineage passes``): a dump iree-compile could not write is
never a silently incomplete history, and the temporary folders of a killed compile are
removed by the next one.

* iree-compile does not fail when it cannot create a dump (a full ``/dev/shm``, no inodes
  left): it prints ``Error while creating directory …`` / ``Error opening output file …``
  and goes on. dfit reads those lines (:func:`pass_history.dump_write_failure`): dumps in
  memory that failed are written again on disk, with a note; dumps on disk that failed
  give exit 3 with the reason. The full file system is simulated without root tricks: the
  dump folder is a regular file, so every dump under it fails to be created.
* ``$TMPDIR/dfit-phases-<pid>-…`` and ``/dev/shm/dfit-pass-dumps-<pid>-…`` of a process
  that is gone are removed when the next compile starts its driver; those of a live
  process, of another naming or through a symlink are left
  (:func:`phases.remove_stale_folders`, by :func:`dfit_mlir.core.paths.remove_stale_folders`,
  which the run side shares: tests/test_killed_runs.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.core import paths, toolchain
from dfit_mlir.core.errors import CompileError
from dfit_mlir.passes import pass_history, phases
from dfit_mlir.passes.instrumented_compile import compile_instrumented

#: A small linalg module: a few dispatches, a few hundred pass runs, seconds to compile.
MODULE = """\
func.func @main(%a: tensor<8x16xf32>, %b: tensor<16x4xf32>) -> tensor<8x4xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<8x4xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%empty : tensor<8x4xf32>) -> tensor<8x4xf32>
  %mm = linalg.matmul ins(%a, %b : tensor<8x16xf32>, tensor<16x4xf32>) outs(%fill : tensor<8x4xf32>) -> tensor<8x4xf32>
  %relu = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                          iterator_types = ["parallel", "parallel"]}
      ins(%mm : tensor<8x4xf32>) outs(%empty : tensor<8x4xf32>) {
  ^bb0(%x: f32, %out: f32):
    %y = arith.maximumf %x, %zero : f32
    linalg.yield %y : f32
  } -> tensor<8x4xf32>
  return %relu : tensor<8x4xf32>
}
"""


def _dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ----------------------------------------------------------------------- stale folders

def _plant(place: Path, prefix: str, dead: int) -> dict[str, Path]:
    planted = {
        "dead": place / f"{prefix}{dead}-abc123",
        "live-self": place / f"{prefix}{os.getpid()}-abc123",
        "live-parent": place / f"{prefix}{os.getppid()}-abc123",
        "no-pid": place / f"{prefix}abc123",  # dfit before the PID was in the name
    }
    for folder in planted.values():
        folder.mkdir()
        (folder / "passes-flow").mkdir()
        (folder / "passes-flow" / "1_canonicalize.mlir").write_text("module {}\n")
    keep = place / "kept-by-someone"
    keep.mkdir(exist_ok=True)
    (keep / "precious.txt").write_text("keep me\n")
    planted["dead-symlink"] = place / f"{prefix}{dead}-link"
    planted["dead-symlink"].symlink_to(keep)
    return planted


def test_stale_folders_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = _dead_pid()
    places = [(tmp_path / "tmp", phases.WORKDIR_PREFIX), (tmp_path / "shm", phases.DUMPS_PREFIX)]
    planted = {}
    for place, prefix in places:
        place.mkdir()
        planted[place] = _plant(place, prefix, dead)
    removed = [found for place, prefix in places for found in paths.remove_stale_folders(place, (prefix,))]
    assert sorted(removed) == sorted(found["dead"] for found in planted.values())
    for found in planted.values():
        assert not found["dead"].exists()
        assert all(found[name].exists() for name in ("live-self", "live-parent", "no-pid"))
        assert found["dead-symlink"].is_symlink()
        assert (found["dead-symlink"] / "precious.txt").read_text() == "keep me\n"


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm on this machine")
def test_the_next_compile_removes_what_a_killed_one_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real driver start (what every compile does) with stale folders in ``$TMPDIR``
    and in the real ``/dev/shm``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _dead_pid()
    stale = [tmp_path / f"{phases.WORKDIR_PREFIX}{dead}-zz", Path("/dev/shm") / f"{phases.DUMPS_PREFIX}{dead}-zz"]
    live = [tmp_path / f"{phases.WORKDIR_PREFIX}{os.getpid()}-zz",
            Path("/dev/shm") / f"{phases.DUMPS_PREFIX}{os.getpid()}-zz"]
    try:
        for folder in stale + live:
            (folder / "passes-hal").mkdir(parents=True)
        driver = phases.SubprocessDriver(list(phases.DEFAULT_TARGET_FLAGS))
        try:
            assert driver.workdir.name.startswith(paths.private_prefix(phases.WORKDIR_PREFIX))
            assert driver.workdir.parent == tmp_path
        finally:
            driver.close()
        assert not any(folder.exists() for folder in stale)
        assert all(folder.exists() for folder in live)
    finally:
        for folder in stale + live:
            subprocess.run(["rm", "-rf", str(folder)], check=True)


# ----------------------------------------------------------------------- failed writes

def test_dump_write_failures_are_read_from_iree_compiles_stderr() -> None:
    tree = Path("/dev/shm/dfit-pass-dumps-1-x/passes-flow")
    lines = {
        f"Error while creating directory {tree}/builtin_module_no-symbol-name: No space left on device": True,
        f"Error opening output file {tree}/builtin_module/3_cse.mlir: cannot open output file: Too many open files": True,
        "LLVM ERROR: IO failure on output stream: No space left on device": True,
        "Error opening output file /elsewhere/x.mlir: No space left on device": False,  # not a dump of ours
        "warning: something about the model": False,
    }
    for line, failed in lines.items():
        assert (pass_history.dump_write_failure(f"warning: x\n{line}\n", tree) is not None) == failed, line
    assert pass_history.dump_write_failure("", tree) is None


def _compile(tmp_path: Path, name: str) -> dict[str, Any]:
    source = tmp_path / "m.mlir"
    source.write_text(MODULE)
    return compile_instrumented(source, tmp_path / f"{name}.vmfb", mode="full", lineage_detail="passes").manifest


def _full_file_system(workdir: Path) -> Path:
    """A dump root where nothing can be created (a regular file), as a full one."""
    blocked = workdir / "full"
    blocked.write_text("")
    return blocked


def test_dumps_that_fail_in_memory_are_written_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    expected = _compile(tmp_path, "plain")["pass_history"]
    monkeypatch.setattr(pass_history, "dump_root", _full_file_system)
    got = _compile(tmp_path, "full")["pass_history"]
    note = capsys.readouterr().err
    assert "dfit: note: iree-compile could not write the pass dumps of phase" in note
    assert "Not a directory" in note and "writing them to" in note
    assert got["pass_runs"] == expected["pass_runs"] and got["rows"] == expected["rows"]


def test_dumps_that_fail_on_disk_are_exit_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def on_full_disk(workdir: Path) -> Path:
        for phase in toolchain.IREE_PHASES:
            (workdir / f"passes-{phase}").write_text("")  # each phase's dump tree cannot be made
        return workdir

    monkeypatch.setattr(pass_history, "dump_root", on_full_disk)
    with pytest.raises(CompileError, match="could not write the pass dumps of phase .*incomplete") as raised:
        _compile(tmp_path, "m")
    assert raised.value.exit_code == 3
    assert not (tmp_path / "m.vmfb").exists() and not (tmp_path / "m.manifest.json").exists()

"""The bad-input suite: every ``dfit`` command given hostile but realistic input
(tests/badinput_cases.py builds each from the suite's real artifacts). Each case asserts
the documented exit status, no traceback, a message naming the input at fault, and that
every file and folder that existed before is byte-identical afterwards (nothing written
at all on an error)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.badinput_cases import Artifacts, Case, all_cases, owned_elsewhere
from tests.conftest import CONVNET, vendor_fixture

CASES = all_cases()
#: Cases whose fix another part of dfit owns: expected to pass once that work is merged.
ELSEWHERE = [pytest.param(case, id=case.id, marks=[pytest.mark.xfail(strict=False, reason=f"owned by {owner}"),
                                                   *([pytest.mark.slow] if owner == "join" else [])])
             for case, owner in owned_elsewhere()]


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """The convnet compiled (full) and run once (ids), and a reconstructed Edge TPU dump."""
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.reconstruct import reconstruct_bundle
    from dfit_mlir.runtime_hooks.run import run_bundle

    root = tmp_path_factory.mktemp("badinput-art")
    compiled = compile_instrumented(CONVNET, root / "convnet.vmfb", mode="full")
    bundle = run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="ids", repeat=2).bundle
    dump = vendor_fixture("edgetpu/franco_fc_v15")
    edgetpu = root / "edgetpu"
    reconstruct_bundle([dump], edgetpu)
    return Artifacts(CONVNET, compiled.vmfb, compiled.manifest_path, bundle, dump, edgetpu)


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` → sha256 of a file, ``dir``, or ``-> target`` of a link."""
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                found[key] = "dir"
            else:
                found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def invoke(argv: list[str], cwd: Path) -> tuple[int, str, str, BaseException | None]:
    from dfit_mlir import outputs
    from dfit_mlir.cli import main

    outputs._FORCED.clear()  # per process in real use; one pytest process runs every case
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, argv, catch_exceptions=True, prog_name="dfit")
    finally:
        os.chdir(previous)
    escaped = result.exception if not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.stdout, result.stderr, escaped


def invoke_child(argv: list[str], cwd: Path) -> tuple[int, str, str, BaseException | None]:
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-m", "dfit_mlir.cli", *argv], cwd=cwd, capture_output=True,
                              text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return -1, "", "dfit did not finish in 240 s", None
    return done.returncode, done.stdout, done.stderr, None


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES] + ELSEWHERE)
def test_bad_input(case: Case, art: Artifacts, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    argv = case.build(work, art)
    # Files outside the working folder the case names (`-o ..`) are checked as well.
    watched = tmp_path
    before = tree(watched)
    status, stdout, stderr, escaped = (invoke_child if case.isolated else invoke)(argv, work)
    after = tree(watched)
    shown = f"dfit {' '.join(argv)[:300]}\nexit {status}\nstdout: {stdout[-1500:]}\nstderr: {stderr[-3000:]}"
    assert escaped is None, f"an exception escaped the CLI: {escaped!r}\n{shown}"
    expected = case.exit if isinstance(case.exit, frozenset) else frozenset({case.exit})
    assert status in expected, shown
    assert "Traceback" not in stdout + stderr, shown
    assert "internal error" not in stderr, shown
    if status != 0:
        first = stderr.strip().splitlines()[0] if stderr.strip() else ""
        assert first.startswith("dfit"), shown
        if case.names is not None:
            assert case.names in stderr, shown
        assert after == before, f"the tree changed: {sorted(set(after.items()) ^ set(before.items()))[:6]}\n{shown}"
    else:
        replaced = [f"work/{r}" for r in case.replaces]
        kept = {k: v for k, v in before.items() if not any(k == r or k.startswith(r + "/") for r in replaced)}
        assert {k: after.get(k) for k in kept} == kept, shown
    leftovers = [k for k in after if k.endswith((".tmp", ".old")) or "/." in "/" + k and ".tmp" in k]
    assert not leftovers, shown


def test_the_suite_is_large_enough() -> None:
    commands = {c.build.__name__ for c in CASES}
    assert len(CASES) >= 250 and commands

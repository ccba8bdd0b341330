"""Issue 26, the front door's exits: a model file's code cannot end ``dfit compile`` or
move its outputs. ``sys.exit``/``os._exit`` at the file's import, in its factory, inside
``forward()`` during the export or from an ``atexit`` handler give exit 3 and one line
naming the model's file and line, with nothing written; a model that changes the working
folder or closes ``sys.stdout`` does not move or break the outputs; one that closes file
descriptor 1 gets exit 3 and leaves no ``m.mlir``. The rules are in
``dfit_mlir/frontends/model_file.py``. Each case runs the real CLI in a child process
(the harness of ``tests/test_hostile_inputs.py``) on a tiny PyTorch model written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_hostile_inputs import _run_dfit, _tree_hash

pytest.importorskip("torch", reason="the model files are PyTorch")

#: The tiny model every case edits: line numbers below are this text's.
MODEL = """\
import atexit, os, sys
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return x * 2
def make_model():
    return M(), (torch.ones(2),)
"""
#: What the working folder may hold after a failed case besides the model (the harness's).
SCRATCH = (".tmp", ".cache")


def _edit(line: int, text: str) -> str:
    """MODEL with its ``line`` (1-based) replaced by ``text`` (same indent)."""
    lines = MODEL.splitlines()
    old = lines[line - 1]
    lines[line - 1] = old[:len(old) - len(old.lstrip())] + text
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Door:
    id: str
    model: str
    exit: int = 3
    says: str = ""  # a fragment of the one `dfit:` line ("model.py:N" is its file and line)


DOORS = [
    Door("import-sys-exit", MODEL + "sys.exit(0)\n", says="model.py:8: running the file called sys.exit(0)"),
    Door("import-os-exit", MODEL + "os._exit(0)\n", says="model.py:8: running the file called os._exit(0)"),
    Door("factory-sys-exit", _edit(7, "sys.exit(0)"), says="model.py:7: make_model() called sys.exit(0)"),
    Door("factory-os-exit", _edit(7, "os._exit(0)"), says="model.py:7: make_model() called os._exit(0)"),
    Door("forward-sys-exit", _edit(5, "sys.exit(0)"), says="model.py:5: exporting the model called sys.exit(0)"),
    Door("forward-os-exit", _edit(5, "os._exit(0)"), says="model.py:5: exporting the model called os._exit(0)"),
    Door("forward-sys-exit-1", _edit(5, "sys.exit(1)"), says="model.py:5: exporting the model called sys.exit(1)"),
    Door("atexit-handler-sys-exit", MODEL + "def bye():\n    sys.exit(0)\natexit.register(bye)\n",
         says="model.py:9: the atexit handler registered at"),
    Door("atexit-handler-os-exit", MODEL + "@atexit.register\ndef bye():\n    os._exit(0)\n",
         says="model.py:10: the atexit handler registered at"),
    Door("atexit-registers-os-exit", MODEL + "atexit.register(os._exit, 0)\n",
         says="the atexit handler registered at"),
    Door("atexit-raises", MODEL + "atexit.register(int, 'x')\n", says="the atexit handler registered here raised"),
    # A failing model whose atexit handler would turn dfit's exit 3 into 0.
    Door("atexit-after-failure", _edit(7, "raise ValueError('boom')") + "def bye():\n    os._exit(0)\n"
         "atexit.register(bye)\n", says="model.py:7: make_model() raised ValueError: boom"),
    Door("closes-fd-1", _edit(7, "os.close(1); return M(), (torch.ones(2),)"),
         says="model.py: the model's code closed dfit's standard output"),
    # What the model may do and dfit still succeeds, its outputs where they were asked for.
    Door("closes-sys-stdout", MODEL + "sys.stdout.close()\n", exit=0),
    Door("changes-folder", MODEL + "os.chdir(os.path.join(os.path.dirname(__file__), 'elsewhere'))\n", exit=0),
    Door("changes-folder-in-forward", _edit(5, "os.chdir('elsewhere'); return x * 2"), exit=0),
]


@pytest.mark.parametrize("door", [pytest.param(door, id=door.id) for door in DOORS])
def test_model_code_cannot_leave_by_the_front_door(door: Door, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "elsewhere").mkdir(parents=True)
    (work / "model.py").write_text(door.model)
    before = _tree_hash(work, SCRATCH)
    status, stdout, stderr, _ = _run_dfit(["compile", "model.py", "-o", "m.vmfb"], work, timeout=300)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status == door.exit, f"exit {status}, expected {door.exit}: {stderr[-2000:]}"
    assert not any((work / "elsewhere").iterdir()), "an output followed the model's os.chdir"
    if door.exit == 0:
        assert (work / "m.mlir").is_file() and (work / "m.vmfb").is_file()
        assert f"wrote {work / 'm.mlir'}" in stdout
        return
    assert len(lines) == 1 and lines[0].startswith("dfit: "), stderr[-2000:]
    assert "Traceback" not in stderr and "internal error" not in stderr
    assert door.says in lines[0] and str(work / "model.py") in lines[0], lines[0]
    assert _tree_hash(work, SCRATCH) == before, "a failed compile left files behind"


def test_outputs_are_resolved_before_the_model_runs(tmp_path: Path) -> None:
    """``-o sub/m.vmfb`` given relative, model changing the folder at import: the outputs
    land in ``work/sub``, not under the folder the model moved to."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "elsewhere" / "sub").mkdir(parents=True)
    (work / "model.py").write_text(MODEL + "os.chdir(os.path.join(os.path.dirname(__file__), 'elsewhere'))\n")
    status, _, stderr, _ = _run_dfit(["compile", "model.py", "-o", "sub/m.vmfb"], work, timeout=300)
    assert status == 0, stderr[-2000:]
    assert sorted(p.name for p in (work / "sub").iterdir()) == ["m.mlir", "m.vmfb"]
    assert not any((work / "elsewhere" / "sub").iterdir())

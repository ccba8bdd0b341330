"""``torch.utils.checkpoint`` and the ``recompute`` phase (issue 28): what PyTorch's export
path can express, shown on real modules.

JAX's rematerialised ops are ``recompute`` (tests/test_recompute_phase.py). PyTorch's are
not, because no graph dfit can export from PyTorch holds them:

* ``torch.export`` (dfit's path) traces the forward pass; a checkpointed block is inlined
  once, with no trace of the checkpoint in the nodes' meta (its frames are filtered out)
  and nothing recomputed. dfit now says so in a note, and every op is ``forward``.
* a training step (gradients computed in ``forward``) does not export at all (torch 2.13:
  ``AssertionError: Unexpected key …``); dfit's error now says why, in one line.
* torch's own joint forward-backward export (``_export_forward_backward``) keeps the
  checkpointed activations instead of recomputing them: each forward op appears once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e .[frontends])")

pytestmark = pytest.mark.frontends


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.lin(x))


class Checkpointed(torch.nn.Module):
    """Two blocks, each run under ``torch.utils.checkpoint`` (non-reentrant, the default)."""

    def __init__(self) -> None:
        super().__init__()
        self.b0, self.b1 = Block(), Block()

    def forward(self, x: Any) -> Any:
        # Imported by name (bound here, not looked up in torch.utils.checkpoint): the
        # spelling dfit must still see.
        from torch.utils.checkpoint import checkpoint

        x = checkpoint(self.b0, x, use_reentrant=False)
        x = checkpoint(self.b1, x, use_reentrant=False)
        return (x * x).sum()


STEP_FILE = '''import torch
import torch.utils.checkpoint


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Step(torch.nn.Module):
    """A training step: forward, loss, gradients, SGD update."""

    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        loss = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False).square().sum()
        grads = torch.autograd.grad(loss, list(self.block.parameters()))
        return [p - 0.1 * g for p, g in zip(self.block.parameters(), grads)]


def make_model():
    return Step(), (torch.ones(4, 16),)
'''


@pytest.mark.slow
def test_checkpointed_blocks_are_forward_once_and_said_so(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from dfit_mlir.core import manifest as manifest_io
    from dfit_mlir.frontends import torch as torch_frontend

    result = torch_frontend.compile(Checkpointed(), (torch.ones(4, 16),), output=tmp_path / "m.vmfb", mode="ids",
                                    quiet=True)
    notes = [line for line in capfd.readouterr().err.splitlines() if "torch.utils.checkpoint" in line]
    assert len(notes) == 1, notes
    assert "Checkpointed ran 2 torch.utils.checkpoint region(s) (Block)" in notes[0]
    assert "recomputes nothing" in notes[0] and "jax.checkpoint" in notes[0]
    operators = manifest_io.load(result.manifest_path)["operators"]
    linears = [op for op in operators if op["op"] == "torch.aten.linear"]
    # Each block's Linear once: nothing runs again, so nothing is recompute (nor backward).
    assert sorted(op["module_path"] for op in linears) == ["b0.lin", "b1.lin"]
    assert {op["phase"] for op in operators if op.get("phase")} <= {"forward", "initializer"}


def test_a_training_step_says_why_it_cannot_export(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    source = tmp_path / "step.py"
    source.write_text(STEP_FILE)
    result = CliRunner().invoke(main, ["compile", str(source), "-o", str(tmp_path / "step.vmfb")])
    assert result.exit_code == 3, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith("dfit: torch.export failed on Step: its forward computes gradients "
                               "(torch.autograd.grad)")
    assert "no op is `backward` or `recompute`" in lines[0] and "jax.checkpoint" in lines[0]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch's own pytree deprecation, inside the joint export
def test_torch_joint_export_keeps_activations_instead_of_recomputing() -> None:
    """The finding behind the note: even torch's joint forward-backward graph of a
    checkpointed model runs each forward op once (the backward reads the saved
    activations), so no export holds recomputed ops for dfit to mark."""
    from torch.export.experimental import _export_forward_backward

    program = torch.export.export(Checkpointed(), (torch.ones(4, 16),)).run_decompositions()
    joint = _export_forward_backward(program)
    targets = [node.target for node in joint.graph.nodes if node.op == "call_function"]
    aten = torch.ops.aten
    assert targets.count(aten.addmm.default) == 2  # each block's forward matmul, once
    assert targets.count(aten.tanh.default) == 2   # each activation, once: saved, not recomputed
    # The gradient matmuls, so the backward is there: both weights' and b1's input's (x
    # needs no gradient).
    assert targets.count(aten.mm.default) == 3

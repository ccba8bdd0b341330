"""A Python scalar argument baked into a PyTorch graph says so (issue 28).

``torch.export`` reads an ``int``/``float``/``bool`` example argument once while tracing
and folds its value into the ops; the compiled function has no input for it and always
computes with that value. dfit used to compile such a model in silence. Each baked
argument now gets one warning line on stderr naming it, its value, and the fix (a 0-d
tensor), and the warning matches what was compiled: the function's inputs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e .[frontends])")

pytestmark = pytest.mark.frontends


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: Any, scale: Any, steps: int, negate: bool = False) -> Any:
        y = self.linear(x) * scale
        for _ in range(steps):
            y = torch.tanh(y)
        return -y if negate else y


def _main_inputs(text: str) -> list[str]:
    """The argument types of the exported function ``main``."""
    signature = re.search(r"func\.func @main\((.*?)\) ->", text)
    assert signature, text[:500]
    return re.findall(r"%arg\d+: (!torch\.vtensor<\[[\d,]*\],\w+>)", signature.group(1))


def test_scalar_arguments_warn_once_each(capfd: pytest.CaptureFixture[str]) -> None:
    from dfit_mlir.frontends.torch import export_mlir

    text = export_mlir(Scaled(), (torch.ones(2, 8), 0.5, 2), {"negate": True})
    warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("dfit: warning:")]
    assert len(warnings) == 3, warnings
    by_name = {re.search(r"argument '(\w+)'", line).group(1): line for line in warnings}  # type: ignore[union-attr]
    assert set(by_name) == {"scale", "steps", "negate"}
    assert "= 0.5 (a Python float) is baked into the compiled graph" in by_name["scale"]
    assert "= 2 (a Python int)" in by_name["steps"] and "torch.tensor(2)" in by_name["steps"]
    assert "= True (a Python bool)" in by_name["negate"]
    assert all("Scaled" in line and "0-d tensor" in line for line in warnings)
    # What the warning says is what was compiled: the function takes x and nothing else,
    # and 0.5 is a constant of the graph.
    assert _main_inputs(text) == ["!torch.vtensor<[2,8],f32>"]
    assert "5.000000e-01" in text


def test_a_tensor_scale_is_an_input_and_no_warning(capfd: pytest.CaptureFixture[str]) -> None:
    from dfit_mlir.frontends.torch import export_mlir

    text = export_mlir(Scaled(), (torch.ones(2, 8), torch.tensor(0.5), 0))
    warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("dfit: warning:")]
    # ``steps`` is still a Python int (a loop count: it must be a constant) and says so.
    assert len(warnings) == 1 and "'steps' = 0" in warnings[0]
    assert _main_inputs(text) == ["!torch.vtensor<[2,8],f32>", "!torch.vtensor<[],f32>"]


def test_model_file_warns_on_the_command_line(tmp_path: Path) -> None:
    """``dfit compile model.py`` (the CLI's export of a model file) prints the warning."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    model = tmp_path / "scaled.py"
    model.write_text("import torch\n\n\nclass Halve(torch.nn.Module):\n    def forward(self, x, factor):\n"
                     "        return x * factor\n\n\ndef make_model():\n    return Halve(), (torch.ones(4), 0.5)\n")
    result = CliRunner().invoke(main, ["compile", str(model), "-o", str(tmp_path / "scaled.vmfb")])
    assert result.exit_code == 0, result.output
    assert "dfit: warning: Halve argument 'factor' = 0.5 (a Python float) is baked into the compiled graph" \
        in result.stderr

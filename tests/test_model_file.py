"""How ``dfit compile FILE.py`` tells a PyTorch file from a JAX file
(:mod:`dfit_mlir.frontends.model_file`): by the factory's name, then by what it returns.
SYNTHETIC model files, written by the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.frontends.model_file import default_factory


@pytest.mark.parametrize(("text", "expected"), [
    ("def make_model():\n    pass\n", "make_model"),
    ("def make_step():\n    pass\n", "make_step"),
    ("def make_step():\n    pass\n\ndef make_model():\n    pass\n", "make_model"),
])
def test_the_factory_name_is_read_before_the_file_runs(tmp_path: Path, text: str, expected: str) -> None:
    source = tmp_path / "model.py"
    source.write_text("raise SystemExit('the file must not run to be classified')\n" + text)
    assert default_factory(source) == expected


def test_a_file_with_neither_factory_runs_as_a_pytorch_file(tmp_path: Path) -> None:
    """The factory may be made at run time; the file runs and the loader names what is missing."""
    source = tmp_path / "model.py"
    source.write_text("def build():\n    pass\n\nmake_step = build\n")
    assert default_factory(source) == "make_step"
    source.write_text("def build():\n    pass\n")
    assert default_factory(source) == "make_model"


def test_a_syntax_error_names_its_line(tmp_path: Path) -> None:
    source = tmp_path / "model.py"
    source.write_text("def make_step(:\n")
    with pytest.raises(InvalidInputError, match=r"model\.py:1: "):
        default_factory(source)


@pytest.mark.frontends
def test_jax_file_from_the_shell_with_a_custom_factory(tmp_path: Path) -> None:
    """``--model-factory`` names any function; a plain callable is lowered with JAX and
    compiled with the same per-phase summary as the other routes."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main
    from dfit_mlir.core.manifest import load

    source = tmp_path / "step.py"
    source.write_text("import jax\nimport jax.numpy as jnp\n\n"
                      "def double_then_sum(x):\n"
                      "    with jax.named_scope('scale'):\n"
                      "        y = x * 2.0\n"
                      "    return jnp.sum(jnp.tanh(y))\n\n"
                      "def build():\n"
                      "    return double_then_sum, (jnp.ones((4, 4)),)\n")
    result = CliRunner().invoke(main, ["compile", str(source), "--model-factory", "build", "--dfit-tag",
                                       "--mode", "ids", "-o", str(tmp_path / "step.vmfb")])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'step.mlir'}" in result.output and "dispatches: " in result.output
    manifest = load(tmp_path / "step.manifest.json")
    assert manifest["input"]["frontend"] == "jax"
    assert {"scale"} <= {op["module_path"] for op in manifest["operators"]}

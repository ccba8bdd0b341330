"""iree-compile's errors cut to the model's frames (issue 28).

A JAX model file lowered by ``dfit compile model.py`` keeps every Python frame of the
trace in its locations: below the model's line, dfit's frontend, its CLI, click and the
interpreter's launcher. An op IREE rejects (``stablehlo.fft`` of an ``rfft2``: IREE 3.13
does not legalize it) used to print all of them, ~2,000 characters per location and a
``called from`` note per frame. The message now keeps the model's file and line, says how
many frames were cut and whose they were, and names no dfit or click file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="JAX is not installed (pip install -e .[frontends])")

pytestmark = [pytest.mark.slow, pytest.mark.frontends]

MODEL = '''import jax.numpy as jnp


def make_step():
    def step(x):
        y = jnp.tanh(x @ x.T)
        return jnp.abs(jnp.fft.rfft2(y))
    return step, (jnp.ones((4, 4)),)
'''
#: The line of ``rfft2`` in MODEL: the op IREE rejects.
REJECTED_LINE = 7


@pytest.mark.parametrize("how", [["--dfit-tag", "--mode", "ids", "--driver", "in-process"],
                                 ["--dfit-tag", "--mode", "ids", "--driver", "subprocess"],
                                 []], ids=["in-process", "subprocess", "plain"])
def test_rejected_op_message_keeps_the_models_frames(tmp_path: Path, how: list[str]) -> None:
    model = tmp_path / "fft_model.py"
    model.write_text(MODEL)
    # The CLI as a user runs it (a child interpreter): its frames are dfit's __main__,
    # click's and the standard library's runpy, all below the model's line.
    result = subprocess.run([sys.executable, "-m", "dfit_mlir", "compile", str(model), *how,
                             "-o", str(tmp_path / "out.vmfb")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 3, result.stderr
    message = result.stderr
    assert "failed to legalize operation 'stablehlo.fft'" in message
    assert f"{model}:{REJECTED_LINE}:" in message
    assert "frames of dfit" in message and " cut" in message
    assert "click" in message.split("frames of dfit", 1)[1].splitlines()[0]  # whose frames went
    assert "/click/" not in message and "/dfit_mlir/" not in message and "runpy" not in message
    # Every Python file the message names is the model's (its .mlir export is no frame).
    assert set(re.findall(r"(/[^\s:\"]+\.py)\b", message)) == {str(model)}
    assert "Traceback" not in message
    # Before: 1,892 (in-process), 2,826 (subprocess), 2,255 (plain) characters, with a
    # short temporary path; the op's own text (printed twice) is most of what is left.
    assert len(message) < 1500, message

"""Runs the golden IR tests (lit + filecheck) under pytest, so `make test` covers them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIT_DIR = Path(__file__).parent / "lit"


def test_golden_ir_tests_pass() -> None:
    lit = Path(sys.executable).parent / "lit"
    result = subprocess.run([sys.executable, str(lit), "-v", str(LIT_DIR)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Failed" not in result.stdout
    assert "Passed" in result.stdout

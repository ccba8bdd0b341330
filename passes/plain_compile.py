"""``dfit compile`` without ``--dfit-tag``: exactly ``iree-compile``, for side-by-side
comparisons (benchmarks, the observational-compile test)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Sequence

from dfit_mlir import atomic
from dfit_mlir.errors import CompileError, InvalidInputError
from dfit_mlir.passes.phases import with_default_target


def plain_compile(source: Path, output: Path, flags: Sequence[str]) -> None:
    from iree.compiler.tools.binaries import find_tool

    if not source.is_file():
        raise InvalidInputError(f"{source}: no such file")
    with atomic.atomic_path(output, kind="vmfb") as tmp:
        command = [find_tool("iree-compile"), str(source), "-o", str(tmp), *with_default_target(flags)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(f"iree-compile failed:\n{result.stderr.strip()}")

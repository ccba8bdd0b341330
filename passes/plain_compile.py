"""``dfit compile`` without ``--dfit-tag``: exactly ``iree-compile``, for side-by-side
comparisons (benchmarks, the observational-compile test)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Sequence

from dfit_mlir.core import atomic
from dfit_mlir.core.errors import CompileError, InvalidInputError
from dfit_mlir.passes.phases import (
    compiler_context,
    parse_file,
    require_functions,
    toolchain_failure,
    trim_diagnostics,
    with_default_target,
)


def plain_compile(source: Path, output: Path, flags: Sequence[str]) -> None:
    """Input errors (unparsable or empty MLIR) exit 2 with the MLIR diagnostics; a
    compiler failure on a valid module exits 3 with iree-compile's own diagnostics."""
    from iree.compiler.tools.binaries import find_tool

    if not source.is_file():
        raise InvalidInputError(f"{source}: no such file")
    session, context = compiler_context()
    try:
        try:  # the compiler's own flag parser: an unknown flag is a usage error, not a failed compile
            session.set_flags(*with_default_target(flags))
        except ValueError as error:
            raise InvalidInputError(f"iree-compile rejected the flags: {' '.join(str(error).split())}") from None
        require_functions(parse_file(context, source), source)
    finally:
        session.close()
    with atomic.atomic_path(output, kind="vmfb") as tmp:
        command = [find_tool("iree-compile"), str(source), "-o", str(tmp), *with_default_target(flags)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(f"iree-compile {toolchain_failure(result.returncode)} on {source}:\n"
                               f"{trim_diagnostics(result.stderr)}")

"""User-facing errors: one clear line (or an MLIR diagnostic) and an exit status, never a
traceback."""

from __future__ import annotations

#: Exit status for invalid input (MLIR parse or verify errors, bad manifests, bad flags).
EXIT_INVALID_INPUT = 2
#: Exit status for a failure inside the compiler after the input was accepted.
EXIT_COMPILE_FAILED = 1


class DfitError(Exception):
    """An error a user can act on; ``str(error)`` is the whole message."""

    exit_code = EXIT_INVALID_INPUT


class InvalidInputError(DfitError):
    """The input file is missing, unreadable or not valid MLIR / JSON."""


class ToolchainError(DfitError):
    """The installed toolchain is not the pinned one, or lacks an entry point we need."""


class CompileError(DfitError):
    """IREE rejected or failed on an input it parsed."""

    exit_code = EXIT_COMPILE_FAILED


class UnresolvedRecordError(DfitError):
    """A runtime record (dispatch, probe call, traced tensor) that the manifest does not
    explain; the message shows the record and the candidates. Never dropped silently."""

"""User-facing errors: one clear line (or an MLIR diagnostic) and an exit status, never a
traceback.

The exit-status table, the same for every ``dfit`` command:

====  =====================================================================
0     success
2     bad input or usage: a file, flag, option or environment variable (TMPDIR)
      dfit refuses (it names it)
3     the toolchain or the model failed: IREE rejected the input, the module
      faulted at run time, a vendor tool or a child process died
70    internal error: a bug in dfit (the traceback is written to a file whose
      path is printed)
130   interrupted (SIGINT / SIGTERM); nothing partial is left behind
====  =====================================================================
"""

from __future__ import annotations

EXIT_OK = 0
#: Exit status for invalid input (MLIR parse or verify errors, bad manifests, bad flags).
EXIT_INVALID_INPUT = 2
#: Exit status for a failure of the toolchain or the model after dfit accepted the input.
EXIT_TOOLCHAIN_FAILED = 3
#: Kept for callers of the old name; compile failures are toolchain failures.
EXIT_COMPILE_FAILED = EXIT_TOOLCHAIN_FAILED
#: Exit status for a bug in dfit itself (EX_SOFTWARE).
EXIT_INTERNAL_ERROR = 70
#: Exit status after SIGINT or SIGTERM (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


class DfitError(Exception):
    """An error a user can act on; ``str(error)`` is the whole message."""

    exit_code = EXIT_INVALID_INPUT


class InvalidInputError(DfitError):
    """The input file is missing, unreadable or not valid MLIR / JSON."""


class ToolchainError(DfitError):
    """The installed toolchain is not the pinned one, or lacks an entry point we need."""

    exit_code = EXIT_TOOLCHAIN_FAILED


class CompileError(DfitError):
    """IREE rejected or failed on an input it parsed."""

    exit_code = EXIT_TOOLCHAIN_FAILED


class ModuleFaultError(DfitError):
    """The compiled module or an IREE runtime tool died (a signal, an abort, a non-zero
    exit): the message names the module, the function, the invocation, the signal and
    where the inputs used were saved."""

    exit_code = EXIT_TOOLCHAIN_FAILED


class UnresolvedRecordError(DfitError):
    """A runtime record (dispatch, probe call, traced tensor) that the manifest does not
    explain; the message shows the record and the candidates. Never dropped silently."""


class QueryError(DfitError):
    """The SQL did not run (syntax, unknown column, a statement the query policy
    refuses): bad input."""

    exit_code = 2


class OutputRefusedError(DfitError):
    """An output path dfit will not write: it is, contains or lies inside one of the
    command's inputs, or it exists and dfit did not write it (``--force`` overrides the
    latter only)."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like SIGINT's KeyboardInterrupt so that every
    ``finally`` (temporary files and directories) runs before dfit exits 130."""


#: The exit-status table as (status, meaning) rows: ``dfit --help`` and the README show it.
EXIT_TABLE = (
    (EXIT_OK, "success"),
    (EXIT_INVALID_INPUT, "bad input or usage: a file, flag, option or environment variable (TMPDIR) dfit refuses "
                         "(the message names it)"),
    (EXIT_TOOLCHAIN_FAILED, "the toolchain or the model failed: IREE rejected the input, the module faulted, "
                            "a vendor tool or a child process died (its diagnostics follow the dfit: line)"),
    (EXIT_INTERNAL_ERROR, "internal error: a bug in dfit (the traceback is written to a file whose path is printed)"),
    (EXIT_INTERRUPTED, "interrupted (SIGINT / SIGTERM); nothing partial is left behind"),
)

"""The ``dfit`` console script: imports the command line inside the exit-status contract.

Importing :mod:`dfit_mlir.cli` and what it pulls in takes a few hundred milliseconds, during
which no dfit handler is installed yet: a Ctrl-C there would end Python with a
KeyboardInterrupt traceback and death by SIGINT instead of exit 130 (a short ``dfit store
compact`` spends most of its life importing). This module imports nothing heavy itself.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from dfit_mlir.cli.app import main as cli_main
    except KeyboardInterrupt:
        print("dfit: interrupted", file=sys.stderr)
        sys.exit(130)  # errors.EXIT_INTERRUPTED (not imported: it may be what was interrupted)
    cli_main()


if __name__ == "__main__":
    main()

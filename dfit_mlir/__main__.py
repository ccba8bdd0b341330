"""The ``dfit`` console script: imports the command line inside the exit-status contract.

Importing :mod:`dfit_mlir.cli` and what it pulls in takes a few hundred milliseconds, during
which no dfit handler is installed yet: a Ctrl-C there would end Python with a
KeyboardInterrupt traceback and death by SIGINT instead of exit 130 (a short ``dfit store
compact`` spends most of its life importing). This module imports nothing heavy itself.
"""

from __future__ import annotations

import os
import sys

#: Arrow's allocator for the ``dfit`` process, unless the user chose one. glibc's, not
#: the bundled mimalloc: what a long run's batches free goes back to the system between
#: batches (``core.perf.release_freed_memory``), where mimalloc held on to it. A 660k-event
#: ``dfit run``, the same code: 296 MiB / 14.3 s under mimalloc, 286 MiB / 13.1 s under
#: this; ``dfit view`` of a 5M-event bundle: 295 MiB / 18.7 s and 229 MiB / 18.1 s (issue 29).
ARROW_MEMORY_POOL = "system"


def main() -> None:
    # Read by Arrow when it first allocates, so set before anything imports it.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_MEMORY_POOL)
    try:
        from dfit_mlir.core.perf import fix_mmap_threshold

        fix_mmap_threshold()  # before the first large allocation
        from dfit_mlir.cli.app import main as cli_main
    except KeyboardInterrupt:
        exec("None")  # noqa: S102 — forgets the caught interrupt, as core.atomic.forget_caught_interrupt
        print("dfit: interrupted", file=sys.stderr)
        sys.exit(130)  # errors.EXIT_INTERRUPTED (not imported: it may be what was interrupted)
    cli_main()


if __name__ == "__main__":
    main()

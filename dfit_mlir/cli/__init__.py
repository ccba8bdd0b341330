"""The ``dfit`` command line: the group in ``app``, its commands by family, the shared
contract (exit statuses, one-line errors, bounded options) in ``contract``.

Imports nothing itself: :mod:`dfit_mlir.__main__` must start fast."""

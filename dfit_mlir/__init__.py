"""dfit-mlir: stable semantic IDs, lineage and manifests for ML compilers.

``dfit_mlir.instrument(vmfb, mode="lite")`` runs an instrumented module from your own
program (``runtime_hooks/instrument.py``); everything else is the ``dfit`` command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from dfit_mlir.runtime_hooks.instrument import InstrumentedModule


def instrument(*args: Any, **kwargs: Any) -> InstrumentedModule:
    """See :func:`dfit_mlir.runtime_hooks.instrument.instrument` (imported on first use:
    ``import dfit_mlir`` stays cheap)."""
    from dfit_mlir.runtime_hooks.instrument import instrument as _instrument

    return _instrument(*args, **kwargs)

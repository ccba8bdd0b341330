"""The Edge TPU backend: reconstruction path.

``edgetpu_compiler`` leaves a compiled ``*_edgetpu.tflite`` (the mapped part of the graph
folded into ``edgetpu-custom-op``s, the rest as ordinary TFLite ops for the CPU), an
operation log (``*_edgetpu.log``: op counts per type and mapping status) and a console
summary (parameter memory, subgraphs, op split). Together with the original ``.tflite``
they give back every op, where it runs, and the parameter memory; the executable inside
a custom op stays opaque and nothing is timed per op.

Readers, one per format (most specific first in :data:`READERS`):

* :class:`~.tflite_model.TFLiteModelReader` (``tflite``): original or compiled model;
* :class:`~.oplog.OperationLogReader` (``edgetpu-oplog``): the operation log;
* :class:`~.console.ConsoleSummaryReader` (``edgetpu-console``): captured stdout.

:func:`reconstruct` reads any mix of those files (or directories of them) and matches
them (see :mod:`.matching`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dfit_mlir.adapters.recovery import Recovery

from .console import ConsoleSummaryReader
from .matching import READERS
from .matching import reconstruct as match_and_merge
from .oplog import OperationLogReader
from .tflite_model import TFLiteModelReader

BACKEND = "edgetpu"



def capabilities() -> dict[str, Any]:
    """Capability descriptor of the Edge TPU backend (reconstruction path)."""
    return {
        "backend": BACKEND,
        "path": "reconstruction",
        "exposes": {
            "compiler_ir": "none",
            "lineage": "per original op to its Edge TPU custom op or the CPU (original + compiled .tflite)",
            "source_locations": "tensor names only",
            "tensor_shapes": "full (every TFLite tensor)",
            "partitions": "edgetpu-custom-op partitions and the CPU remainder; per-type mapping status",
            "static_cost": "MACs of CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED from shapes; op bytes",
            "per_op_timing": "none",
            "per_partition_timing": "none",
            "per_program_timing": "none",
            "memory": "on-chip cached / off-chip streamed parameter bytes per model (console summary)",
        },
    }


def reconstruct(paths: Sequence[Path | str]) -> Recovery:
    """Read every recognised file among ``paths`` (directories recursively), match the
    original model, compiled model, operation log and console summary of each model, and
    return one :class:`Recovery`; unrecognised files are listed in
    ``attributes["ignored_files"]``."""
    return match_and_merge(paths)


__all__ = [
    "READERS",
    "ConsoleSummaryReader",
    "OperationLogReader",
    "TFLiteModelReader",
    "capabilities",
    "reconstruct",
]

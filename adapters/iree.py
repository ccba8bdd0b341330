"""The IREE backend: compiler-visible path. Its capability descriptor says what an IREE
compile and run expose, at which fidelity."""

from __future__ import annotations

from typing import Any


def capabilities() -> dict[str, Any]:
    """Capability descriptor of the IREE backend (compile side)."""
    return {
        "backend": "iree",
        "path": "compiler-visible",
        "exposes": {
            "compiler_ir": "full",
            "lineage": "per-op, every phase",
            "source_locations": "file:line:col, name and call-site locations",
            "tensor_shapes": "full",
            "partitions": "dispatches (exports and call sites)",
            "static_cost": "derived from op types",
            "per_op_timing": "per dispatch (HAL host-execution profiling)",
            "memory": "tensor sizes (static)",
        },
    }

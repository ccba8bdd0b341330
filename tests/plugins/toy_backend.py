"""A toy reconstruction backend (test plugin): recognises ``*.toylog`` files whose first
line is ``TOY``; every further line ``<op> <ms>`` is one operator with a timing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.adapters.base import ReconstructionAdapter, expand
from dfit_mlir.adapters.recovery import (
    Coverage,
    CoverageNote,
    Measurement,
    RecoveredOperator,
    Recovery,
    source_artifact,
)


class ToyLogReader:
    format: ClassVar[str] = "toy-log"

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return path.suffix == ".toylog" and head.startswith(b"TOY")

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> Recovery:
        operators, measurements = [], []
        for number, line in enumerate(self.path.read_text().splitlines()[1:], start=2):
            op, ms = line.split()
            op_id = f"toy/{op}#{len(operators)}"
            operators.append(RecoveredOperator(id=op_id, op=f"toy.{op}", index=number))
            measurements.append(Measurement("metric", "op_time", float(ms) / 1e3, "s", ids=(op_id,),
                                            origin=f"{self.path}:{number}"))
        return Recovery("toy", (source_artifact(self.path, self.format),), tuple(operators),
                        measurements=tuple(measurements),
                        coverage=(CoverageNote("per_op_timing", Coverage.RECOVERED, "one line per op"),))


READERS = (ToyLogReader,)


def capabilities() -> dict[str, Any]:
    return {"backend": "toy", "path": "reconstruction", "exposes": {"per_op_timing": "per op"}}


def reconstruct(paths: Sequence[Path]) -> Recovery:
    (path,) = [p for p in expand(paths) if ToyLogReader.recognises(p, p.read_bytes()[:8])]
    return ToyLogReader(path).read()


class ToyAdapter(ReconstructionAdapter):
    name = "toy"
    module = "tests.plugins.toy_backend"


class NotAnAdapter:
    pass

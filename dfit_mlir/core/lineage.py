"""Per-stage lineage of source IDs, engine-neutral.

A *stage snapshot* is what one walk over the IR after a compiler phase saw: for every op,
its kind and the source IDs its location names (see :func:`dfit_mlir.core.locations.dfit_ids`),
plus the dispatch structure where the stage has one. From it we classify each source ID:

* ``preserved`` (1→1): exactly one op carries the ID, and no other ID;
* ``fused`` (n→1): exactly one op carries the ID, together with other source IDs;
* ``split`` (1→n): more than one op carries the ID;
* ``erased``: no op carries it.

Ops carrying no source ID are *compiler-materialised* and counted by kind. Coverage is
reported over non-constant ops (constants are re-materialised freely by every phase and
carry data, not computation) and the untagged ones are listed by kind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from dfit_mlir.core.ids import op_name_of

CLASSES = ("preserved", "fused", "split", "erased")
#: ``class_counts`` also splits the erased IDs of constants out: phases fold constants
#: into globals and initializers all the time, and mixing them in hides real erasures.
ERASED_CONSTANTS = "erased_constants"
CLASS_LETTERS = {"preserved": "p", "fused": "f", "split": "s", "erased": "e"}

#: Name segments of op kinds that hold data rather than computation (left out of the
#: coverage ratio): constants (``arith.constant``, ``tosa.const``, ``vm.const.i32``,
#: ``llvm.mlir.constant``, ``tosa.const_shape``) and global declarations
#: (``util.global``, ``llvm.mlir.global``; loads and stores of them do count).
CONSTANT_SEGMENTS = frozenset({"constant", "const", "const_shape", "constantofshape"})
#: Containers that only hold other ops; neither counted nor classified.
CONTAINER_KINDS = frozenset({"builtin.module"})


def is_constant(kind: str) -> bool:
    segments = kind.lower().split(".")[1:]
    return bool(segments) and (segments[-1] == "global" or not CONSTANT_SEGMENTS.isdisjoint(segments))


@dataclass(frozen=True, slots=True)
class DispatchRegion:
    """A dispatch region before outlining (``flow.dispatch.workgroups``), in program order."""

    function: str
    root_ids: tuple[str, ...]
    ids: tuple[str, ...]
    #: What its ops compute and what crosses its boundary (``passes/region_costs.py``'s
    #: ``RegionCost``); None where not counted.
    cost: Any = None


@dataclass(frozen=True, slots=True)
class Export:
    executable: str
    name: str
    ordinal: int | None
    ids: tuple[str, ...]
    body_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DispatchSite:
    function: str
    executable: str
    export: str
    ids: tuple[str, ...]


@dataclass
class StageFigures:
    stage: str
    ops: int = 0
    tagged_ops: int = 0
    non_constant_ops: int = 0
    non_constant_tagged: int = 0
    non_constant_inherited: int = 0
    """Untagged non-constant ops nested in a tagged non-symbol op (a terminator in a
    tagged ``linalg.generic``, a load inside a dispatch region): attributable to it."""
    untagged_by_kind: Counter = field(default_factory=Counter)
    carriers: dict[str, int] = field(default_factory=dict)
    fused_ids: set[str] = field(default_factory=set)
    regions: list[DispatchRegion] = field(default_factory=list)
    exports: list[Export] = field(default_factory=list)
    sites: list[DispatchSite] = field(default_factory=list)
    time_s: float = 0.0

    def add(self, kind: str, ids: tuple[str, ...], enclosed_by_tagged: bool = False) -> None:
        if kind in CONTAINER_KINDS:
            return
        self.ops += 1
        constant = is_constant(kind)
        if not constant:
            self.non_constant_ops += 1
        if not ids:
            self.untagged_by_kind[kind] += 1
            if enclosed_by_tagged and not constant:
                self.non_constant_inherited += 1
            return
        self.tagged_ops += 1
        if not constant:
            self.non_constant_tagged += 1
        for item in ids:
            self.carriers[item] = self.carriers.get(item, 0) + 1
        if len(ids) > 1:
            self.fused_ids.update(ids)

    @property
    def coverage(self) -> float:
        """Share of non-constant ops that carry a source ID."""
        return self.non_constant_tagged / self.non_constant_ops if self.non_constant_ops else 1.0

    @property
    def attributed(self) -> float:
        """Share of non-constant ops that carry a source ID or sit inside an op that does."""
        if not self.non_constant_ops:
            return 1.0
        return (self.non_constant_tagged + self.non_constant_inherited) / self.non_constant_ops

    def classify(self, source_id: str) -> str:
        count = self.carriers.get(source_id, 0)
        if count == 0:
            return "erased"
        if count > 1:
            return "split"
        return "fused" if source_id in self.fused_ids else "preserved"

    def class_counts(self, source_ids: Iterable[str]) -> dict[str, int]:
        """Source IDs per class; ``erased`` counts non-constant ops only, the constants
        are in ``erased_constants``."""
        counts = dict.fromkeys((*CLASSES, ERASED_CONSTANTS), 0)
        for source_id in source_ids:
            kind = self.classify(source_id)
            if kind == "erased" and is_constant(op_name_of(source_id) or ""):
                kind = ERASED_CONSTANTS
            counts[kind] += 1
        return counts

    def materialised_by_kind(self) -> dict[str, int]:
        return dict(sorted(self.untagged_by_kind.items(), key=lambda kv: (-kv[1], kv[0])))

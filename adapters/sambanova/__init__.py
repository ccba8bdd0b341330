"""The SambaNova backend: reconstruction path.

SambaFlow compiles to a PEF and shows nothing of its IR; what a user keeps is console
output. The readers here recover what those logs say (partitions, graph-level compiler
estimates, operators named in warnings with their module paths and shapes, the PEF,
step losses and times, throughput, SambaTune's pipeline, a pyinstrument host profile),
and :func:`reconstruct` merges the files of one dump, matching compile, run and profile
through the PEF they name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dfit_mlir.adapters.coverage import assess, graded
from dfit_mlir.adapters.recovery import (
    Coverage,
    CoverageNote,
    Measurement,
    RecoveredOperator,
    RecoveredPartition,
    Recovery,
    files_of,
    readers_of,
)

from .compile_log import BACKEND, SambaFlowCompileLogReader
from .pyinstrument_profile import PyinstrumentProfileReader
from .run_log import SambaFlowRunLogReader
from .sambatune import SambaTuneLogReader

__all__ = [
    "READERS",
    "PyinstrumentProfileReader",
    "SambaFlowCompileLogReader",
    "SambaFlowRunLogReader",
    "SambaTuneLogReader",
    "capabilities",
    "reconstruct",
]

#: Most specific first. A SambaFlow job log may hold a compile, a run or both (a SLURM
#: output of ``compile`` then ``run``; the ALCF job scripts print the same header before
#: either), so every reader that recognises a file reads it and those that find nothing
#: of theirs are dropped.
READERS = (
    PyinstrumentProfileReader,
    SambaTuneLogReader,
    SambaFlowCompileLogReader,
    SambaFlowRunLogReader,
)


def capabilities() -> dict[str, Any]:
    """Capability descriptor of the SambaNova backend (reconstruction from logs)."""
    return {
        "backend": BACKEND,
        "path": "reconstruction",
        "exposes": {
            "compiler_ir": "none",
            "lineage": "none",
            "source_locations": (
                "module paths encoded in operator names; file:line only for a failing op's traceback"
            ),
            "tensor_shapes": "partial: NamedTensor shapes and tensor types printed in compiler warnings",
            "partitions": "partitions (rail compile lines) and the Plasma units grouping them",
            "static_cost": (
                "graph-level amortized PCUs, PMUs, projected latency, FLOP rate, DDR bandwidth (estimates)"
            ),
            "per_op_timing": "none",
            "per_partition_timing": "none",
            "per_program_timing": (
                "per-step loss and tqdm step time, run throughput summary; host call tree (pyinstrument)"
            ),
            "memory": "none",
        },
    }



def _holds_records(part: Recovery) -> bool:
    return bool(
        part.operators or part.partitions or part.measurements or part.tensors or part.attributes
    )


def _labels(paths: list[str]) -> list[str]:
    """Short unique scopes for files whose IDs would collide: the file stem, widened by
    parent folders until unique."""
    depth = 0
    while True:
        labels = [".".join(Path(p).parts[-1 - depth : -1] + (Path(p).stem,)) for p in paths]
        if len(set(labels)) == len(labels) or depth > 8:
            return (
                labels
                if len(set(labels)) == len(labels)
                else [f"{label}#{i}" for i, label in enumerate(labels)]
            )
        depth += 1


def _scoped(part: Recovery, label: str) -> Recovery:
    """The part with every operator and partition ID prefixed by ``label``."""

    def scope(identifier: str | None) -> str | None:
        return None if identifier is None else f"{label}/{identifier}"

    operators = tuple(
        replace(o, id=f"{label}/{o.id}", partition=scope(o.partition)) for o in part.operators
    )
    partitions = tuple(
        replace(p, id=f"{label}/{p.id}", operator_ids=tuple(f"{label}/{i}" for i in p.operator_ids))
        for p in part.partitions
    )
    measurements = tuple(
        replace(m, partition=scope(m.partition), ids=tuple(f"{label}/{i}" for i in m.ids))
        for m in part.measurements
    )
    return replace(part, operators=operators, partitions=partitions, measurements=measurements)


def _pef_names(part: Recovery) -> set[str]:
    names = {part.attributes["pef_name"]} if part.attributes.get("pef_name") else set()
    names.update(part.attributes.get("pef_names", ()))
    names.update(
        str(m.attributes["pef_name"]) for m in part.measurements if m.attributes.get("pef_name")
    )
    return names


def _pef_matches(parts: list[Recovery]) -> list[dict[str, Any]]:
    """Artifacts of the dump that name the same PEF: a compile that wrote
    ``.../bertlrg.pef`` and a run started with ``--pef=.../bertlrg.pef``."""
    by_name: dict[str, list[dict[str, str]]] = {}
    for part in parts:
        for name in sorted(_pef_names(part)):
            source = part.sources[0]
            by_name.setdefault(name, []).append(
                {
                    "path": source.path,
                    "format": source.format,
                    "pef_path": str(part.attributes.get("pef_path", "")),
                }
            )
    # Matched by name: the compile host and the run host often see the PEF under
    # different directories (another user's copy, a relative ``pef/x/x.pef``).
    return [
        {
            "pef_name": name,
            "artifacts": artifacts,
            "same_path": len({a["pef_path"].replace("//", "/") for a in artifacts}) == 1,
        }
        for name, artifacts in sorted(by_name.items())
        if len({a["format"] for a in artifacts}) > 1
    ]


def reconstruct(paths: Sequence[Path]) -> Recovery:
    """Read every recognised file of a SambaNova dump (files or folders, recursively) and
    merge them into one Recovery. Files no reader recognises, or in which the readers
    that recognised them found nothing of theirs, are listed in
    ``attributes["ignored_files"]``; each read file's own facts stay apart, under
    ``attributes["artifacts"]``, so two logs' ``pef_path`` cannot overwrite each other."""
    parts: list[Recovery] = []
    ignored: list[str] = []
    for path in files_of(paths, READERS):
        found = [reader(path).read() for reader in readers_of(READERS, path)]
        kept = [part for part in found if _holds_records(part) and not part.attributes.get("job_script_only")]
        if not kept:
            # A job log whose compile step was skipped: its job facts, when that is all.
            kept = [part for part in found if part.attributes.get("job_script_only")][:1]
        if not kept:
            ignored.append(str(path))
        parts.extend(kept)

    # Two compile logs both have a ``partition_0_0`` and a ``graph/linear#0``.
    with_ids = [i for i, part in enumerate(parts) if part.operators or part.partitions]
    if len(with_ids) > 1:
        labels = _labels([parts[i].sources[0].path for i in with_ids])
        for i, label in zip(with_ids, labels, strict=True):
            parts[i] = _scoped(parts[i], label)

    matches = _pef_matches(parts)
    operators = tuple(o for p in parts for o in p.operators)
    partitions = tuple(x for p in parts for x in p.partitions)
    measurements = tuple(m for p in parts for m in p.measurements)
    coverage = _coverage(parts, operators, partitions, measurements, matches)
    return Recovery(
        backend=BACKEND,
        sources=tuple(s for p in parts for s in p.sources),
        operators=operators,
        tensors=tuple(t for p in parts for t in p.tensors),
        partitions=partitions,
        measurements=measurements,
        coverage=coverage,
        attributes={
            "artifacts": [
                {
                    "path": p.sources[0].path,
                    "format": p.sources[0].format,
                    "attributes": dict(p.attributes),
                }
                for p in parts
            ],
            "pef_matches": matches,
            "ignored_files": ignored,
        },
    )


_ASPECTS = (
    "compiler_ir",
    "lineage",
    "source_locations",
    "tensor_shapes",
    "operators",
    "partitions",
    "static_cost",
    "per_op_timing",
    "per_partition_timing",
    "per_program_timing",
    "memory",
    "matching",
)


def _coverage(
    parts: list[Recovery],
    operators: tuple[RecoveredOperator, ...],
    partitions: tuple[RecoveredPartition, ...],
    measurements: tuple[Measurement, ...],
    matches: list[dict[str, Any]],
) -> tuple[CoverageNote, ...]:
    counted = _Counted.of(operators, partitions, measurements, matches)
    return assess(counted, _RULES) + _reader_notes(parts)


@dataclass(frozen=True)
class _Counted:
    """What the coverage notes of a SambaNova dump count, over its merged records."""

    operators: int
    #: Operators with shapes (printed NamedTensors or types in warnings).
    shaped: int
    #: Operators with a module path decoded from their name.
    pathed: int
    #: Operators with a file:line (a failing op's traceback).
    located: int
    #: Operators tied to a partition through rail's buffer-context names.
    placed: int
    #: Partitions from rail's compile lines, and the Plasma units grouping them.
    rail: int
    sections: int
    #: Graph-level "Amortized resources" figures (compiler estimates).
    estimates: int
    #: Measurements by name (``loss``, ``run.phase``, ...) and by kind (``function``).
    names: Counter[str]
    kinds: Counter[str]
    #: Run-summary figures (measured throughput).
    summary: int
    matches: list[dict[str, Any]]

    @classmethod
    def of(
        cls,
        operators: tuple[RecoveredOperator, ...],
        partitions: tuple[RecoveredPartition, ...],
        measurements: tuple[Measurement, ...],
        matches: list[dict[str, Any]],
    ) -> _Counted:
        return cls(
            operators=len(operators),
            shaped=sum(1 for o in operators if o.inputs or o.outputs),
            pathed=sum(1 for o in operators if o.module_path),
            located=sum(1 for o in operators if o.source is not None),
            placed=sum(1 for o in operators if o.partition is not None),
            rail=sum(1 for p in partitions if p.kind == "partition"),
            sections=sum(1 for p in partitions if p.kind == "section"),
            estimates=sum(1 for m in measurements if m.name.startswith("amortized.")),
            names=Counter(m.name for m in measurements),
            kinds=Counter(m.kind for m in measurements),
            summary=sum(1 for m in measurements if m.attributes.get("what") == "run summary"),
            matches=matches,
        )


def _source_locations(counted: _Counted) -> CoverageNote:
    return graded(
        "source_locations",
        f"module paths for {counted.pathed} operators (decoded from their names), no file:line; "
        f"file:line for {counted.located} failing operators from a traceback",
        partial=bool(counted.pathed or counted.located),
    )


def _tensor_shapes(counted: _Counted) -> CoverageNote:
    return graded(
        "tensor_shapes",
        f"shapes of {counted.shaped} of {counted.operators} operators, "
        "only where warnings print NamedTensors or types",
        partial=bool(counted.shaped),
    )


def _operators(counted: _Counted) -> CoverageNote:
    return graded(
        "operators",
        f"{counted.operators} operators named in warnings, rail contexts or tracebacks; "
        "the graph is not logged; "
        f"{counted.placed} tied to a partition through rail's buffer-context names",
        partial=bool(counted.operators),
    )


def _partitions(counted: _Counted) -> CoverageNote:
    return graded(
        "partitions",
        f"{counted.rail} partitions from 'Compilation succeeded for partition_N_M_' lines, "
        f"{counted.sections} Plasma units ('sections_A_B') grouping them",
        recovered=bool(counted.rail),
        partial=bool(counted.sections),
    )


def _static_cost(counted: _Counted) -> CoverageNote:
    return graded(
        "static_cost",
        f"{counted.estimates} graph-level 'Amortized resources' figures: compiler estimates, not measurements",
        partial=bool(counted.estimates),
    )


def _per_program_timing(counted: _Counted) -> CoverageNote:
    steps, host, phases = counted.names["loss"], counted.kinds["function"], counted.names["run.phase"]
    return graded(
        "per_program_timing",
        f"{steps} step losses with tqdm step times and {counted.summary} run-summary figures "
        "(measured throughput); "
        f"{phases} per-task phases between the app's milestone lines; "
        f"{host} host call-tree frames from pyinstrument",
        recovered=bool(steps or counted.summary),
        partial=bool(host or counted.names["test_accuracy"] or phases),
    )


def _matching(counted: _Counted) -> CoverageNote:
    matched = ", ".join(
        f"{m['pef_name']} ({len(m['artifacts'])} artifacts, "
        f"{'same path' if m['same_path'] else 'different directories'})"
        for m in counted.matches
    )
    return graded(
        "matching",
        "artifacts matched by the name of the PEF they name "
        "(compile output, run --pef, profiled program): " + (matched or "none in common"),
        recovered=bool(counted.matches),
    )


#: The aspects of :data:`_ASPECTS` in report order: what SambaFlow's logs never show is
#: a fixed note, the rest is counted.
_RULES = (
    CoverageNote(
        "compiler_ir",
        Coverage.NOT_EXPOSED,
        "SambaFlow keeps its IR inside the compiler and the PEF; logs show none",
    ),
    CoverageNote(
        "lineage",
        Coverage.NOT_EXPOSED,
        "no pass-by-pass op lineage in the logs; operator names carry module paths only",
    ),
    _source_locations,
    _tensor_shapes,
    _operators,
    _partitions,
    _static_cost,
    CoverageNote("per_op_timing", Coverage.NOT_EXPOSED, "no per-operator timing in SambaFlow console output"),
    CoverageNote(
        "per_partition_timing",
        Coverage.NOT_EXPOSED,
        "per-partition figures appear only as compiler estimates (projected latency), "
        "recorded as estimates; "
        "measured section latencies live in SambaTune/snprof reports, not in console logs",
    ),
    _per_program_timing,
    CoverageNote(
        "memory",
        Coverage.NOT_EXPOSED,
        "PMU counts only; no byte sizes of tensors or buffers in the logs",
    ),
    _matching,
)


def _reader_notes(parts: Iterable[Recovery]) -> tuple[CoverageNote, ...]:
    """Notes of individual readers about aspects the merged notes do not cover (a
    failed compile, a log with no output of a reader's kind)."""
    return tuple(n for p in parts for n in p.coverage if n.aspect not in _ASPECTS)

"""The Cerebras backend: reconstruction path. A Cerebras run exposes no IR hooks and no
per-op timing; what it leaves behind is read back: the console log, the run's JSON
reports, the compiler's ``compile_report.txt`` and, when the compile directory is
kept, its CIRH MLIR dumps. :func:`reconstruct` reads a dump directory (or files) and
joins what the files share: the log's ``Compile hash is: cs_<hash>`` names the compile
directory ``cs_<hash>/`` of the CIRH dump and the compile report; a CIRH op's
``cs.kernel`` names the compile report's kernel row; a ``summary.json`` run's
``artifact_dir`` names the ``cerebras_logs/<run>/`` of the executors' reports; wsjob
and workflow ids link the log and ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfit_mlir.adapters.cerebras.cirh import CirhReader
from dfit_mlir.adapters.cerebras.logs import BACKEND, ConsoleLogReader
from dfit_mlir.adapters.cerebras.reports import (
    CompileReportReader,
    PerformanceJsonReader,
    RunSummaryReader,
    TrackJsonReader,
    compile_hash_of,
)
from dfit_mlir.adapters.coverage import assess, graded
from dfit_mlir.adapters.recovery import (
    Coverage,
    CoverageNote,
    Measurement,
    RecoveredPartition,
    Recovery,
    files_of,
    readers_of,
)
from dfit_mlir.core.perf import paused_gc

__all__ = [
    "BACKEND",
    "READERS",
    "CirhReader",
    "CompileReportReader",
    "ConsoleLogReader",
    "PerformanceJsonReader",
    "RunSummaryReader",
    "TrackJsonReader",
    "capabilities",
    "reconstruct",
]

#: Most specific first: the JSON readers go by file name, the CIRH reader by name or
#: content, the compile report and the log by content.
READERS = (
    PerformanceJsonReader,
    TrackJsonReader,
    RunSummaryReader,
    CirhReader,
    CompileReportReader,
    ConsoleLogReader,
)


def capabilities() -> dict[str, Any]:
    """Capability descriptor of the Cerebras backend (reconstruction path)."""
    return {
        "backend": BACKEND,
        "path": "reconstruction",
        "exposes": {
            "compiler_ir": "CIRH MLIR dumps of the compile directory, when kept (cs_<hash>/cirh*.mlir)",
            "lineage": "op → model module path and phase (forward/backward/optimizer) from CIRH locations",
            "source_locations": "file:line:col and call-site chains from CIRH locations",
            "tensor_shapes": "full, from CIRH types",
            "partitions": "kernels: CIRH ops' cs.kernel joined to compile_report.txt rows",
            "static_cost": "compiler estimates (samples/s, active PEs, utilization; overall and per kernel); "
            "matmul MACs from CIRH shapes",
            "per_op_timing": "none",
            "per_partition_timing": "none",
            "per_program_timing": "per logging window of training steps (log timestamps, Rate/GlobalRate); "
            "run totals (performance.json, 'Processed N samples in T seconds')",
            "memory": "none",
        },
    }



@paused_gc()
def reconstruct(paths: Sequence[Path]) -> Recovery:
    """One merged :class:`Recovery` of every file under ``paths`` a reader recognises;
    the others are listed in ``attributes["ignored_files"]``."""
    parts: list[tuple[type, Path, Recovery]] = []
    ignored: list[str] = []
    for path in files_of(paths, READERS):
        reader = next(iter(readers_of(READERS, path)), None)
        if reader is None:
            ignored.append(str(path))
            continue
        parts.append((reader, path, reader(path).read()))
    _separate_colliding_scopes(parts)
    return _merge(parts, ignored)


def _separate_colliding_scopes(parts: list[tuple[type, Path, Recovery]]) -> None:
    """Two CIRH dumps whose functions share a name (a train and an eval compile both
    holding ``forward``) would give the same op IDs: the later one is read again with
    its compile directory and file name in front of the function name."""
    seen: set[str] = set()
    for index, (reader, path, part) in enumerate(parts):
        if reader is not CirhReader:
            continue
        ids = {op.id for op in part.operators}
        if ids & seen:
            part = CirhReader(path, scope_prefix=f"{path.parent.name}/{path.stem}/").read()
            parts[index] = (reader, path, part)
            ids = {op.id for op in part.operators}
        seen |= ids


def _union(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(value for value in values if value))


def _merge(parts: list[tuple[type, Path, Recovery]], ignored: list[str]) -> Recovery:
    recoveries = [part for _, _, part in parts]
    cirh = _read_by(CirhReader, parts)
    logs = _read_by(ConsoleLogReader, parts)
    reports = _read_by(CompileReportReader, parts)
    summaries = [part for _, part in _read_by(RunSummaryReader, parts)]
    report_hashes = {compile_hash_of(path) for path, _ in reports} - {None}
    partitions, kernel_joins = _join_kernels(recoveries)
    measurements, compile_joins = _join_compiles(recoveries, cirh, logs, report_hashes)
    measurements, run_joins = _join_runs(summaries, measurements)
    joins = [*kernel_joins, *compile_joins, *run_joins, *_shared_id_joins(parts)]
    merged = Recovery(
        backend=BACKEND,
        sources=tuple(source for part in recoveries for source in part.sources),
        operators=tuple(op for _, part in cirh for op in part.operators),
        tensors=tuple(tensor for _, part in cirh for tensor in part.tensors),
        partitions=tuple(partitions),
        measurements=tuple(measurements),
        attributes=_attributes(parts, logs, cirh, report_hashes, joins, ignored),
    )
    return dataclasses.replace(merged, coverage=_coverage(merged, cirh, reports))


def _read_by(reader: type, parts: list[tuple[type, Path, Recovery]]) -> list[tuple[Path, Recovery]]:
    return [(path, part) for read_by, path, part in parts if read_by is reader]


def _join_kernels(recoveries: list[Recovery]) -> tuple[list[RecoveredPartition], list[dict[str, Any]]]:
    """Kernels: a CIRH kernel and the compile report row of the same name and compile
    become one partition."""
    partitions: dict[str, RecoveredPartition] = {}
    joined = 0
    for partition in (partition for part in recoveries for partition in part.partitions):
        found = partitions.get(partition.id)
        if found is None:
            partitions[partition.id] = partition
            continue
        joined += 1
        partitions[partition.id] = RecoveredPartition(
            id=partition.id,
            kind=partition.kind,
            operator_ids=found.operator_ids + partition.operator_ids,
            attributes={**found.attributes, **partition.attributes, "joined": True},
        )
    joins = [{"join": "cirh cs.kernel = compile_report kernel row", "kernels": joined}] if joined else []
    return list(partitions.values()), joins


def _join_compiles(
    recoveries: list[Recovery],
    cirh: list[tuple[Path, Recovery]],
    logs: list[tuple[Path, Recovery]],
    report_hashes: set[str | None],
) -> tuple[list[Measurement], list[dict[str, Any]]]:
    """Compiles: the log's compile hash names the directory of the CIRH dump and report;
    a whole compile's measurement gets the IDs of the ops of its CIRH dump."""
    op_ids = _op_ids_by_compile(cirh)
    measurements = [_with_compile_ops(m, op_ids) for part in recoveries for m in part.measurements]
    joins = []
    for path, part in logs:
        for compile_hash in part.attributes.get("compile_hashes", []):
            files = [str(p) for p, _ in cirh if compile_hash_of(p) == compile_hash]
            if files or compile_hash in report_hashes:
                joins.append(
                    {
                        "join": "log compile hash = compile directory",
                        "compile_hash": compile_hash,
                        "log": str(path),
                        "cirh": files,
                        "compile_report": compile_hash in report_hashes,
                        "operators": len(op_ids.get(compile_hash, ())),
                    }
                )
    return measurements, joins


def _op_ids_by_compile(cirh: list[tuple[Path, Recovery]]) -> dict[str, tuple[str, ...]]:
    ops_by_hash: dict[str, list[str]] = {}
    for path, part in cirh:
        compile_hash = compile_hash_of(path)
        if compile_hash:
            ops_by_hash.setdefault(compile_hash, []).extend(op.id for op in part.operators)
    return {compile_hash: tuple(ids) for compile_hash, ids in ops_by_hash.items()}


def _with_compile_ops(measurement: Measurement, op_ids: dict[str, tuple[str, ...]]) -> Measurement:
    compile_hash = measurement.attributes.get("compile_hash")
    if measurement.kind == "compile" and measurement.name == "compile" and compile_hash in op_ids:
        return dataclasses.replace(measurement, ids=op_ids[compile_hash])
    return measurement


def _join_runs(
    summaries: list[Recovery], measurements: list[Measurement]
) -> tuple[list[Measurement], list[dict[str, Any]]]:
    """Runs: summary.json's artifact_dir names the cerebras_logs/<run>/ of the executors,
    whose measurements get the run's workflow, index and status."""
    runs = _runs_by_directory(summaries)
    if not runs:
        return measurements, []
    joined = []
    matched = 0
    for measurement in measurements:
        run = runs.get(measurement.attributes.get("run_dir", ""))
        if run is not None:
            measurement = dataclasses.replace(measurement, attributes={**measurement.attributes, **run})
            matched += 1
        joined.append(measurement)
    joins = [{"join": "summary.json artifact_dir = cerebras_logs/<run>", "measurements": matched}] if matched else []
    return joined, joins


def _runs_by_directory(summaries: list[Recovery]) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        run_summary = summary.attributes["run_summary"]
        for index, run in enumerate(run_summary["runs"]):
            run_dir = str(run.get("artifact_dir") or "").rstrip("/").rsplit("/", 1)[-1]
            if run_dir:
                runs[run_dir] = {"workflow_id": run_summary["workflow_id"], "run": index, "status": run.get("status")}
    return runs


#: Ids a log and summary.json can both name, and how to read them from a part.
_SHARED_IDS = (
    ("wsjob id", lambda part: {job["id"] for job in part.attributes.get("jobs", [])}),
    ("workflow id", lambda part: set(part.attributes.get("workflow_ids", []))),
)


def _shared_id_joins(parts: list[tuple[type, Path, Recovery]]) -> list[dict[str, Any]]:
    """Jobs and workflows: the same wsjob or wflow id in a log and in summary.json."""
    joins = []
    for kind, ids_of in _SHARED_IDS:
        ids_by_file = {str(path): ids for _, path, part in parts if (ids := ids_of(part))}
        for first, second in itertools.combinations(ids_by_file, 2):
            shared = sorted(ids_by_file[first] & ids_by_file[second])
            if shared:
                joins.append({"join": kind, "files": [first, second], "ids": shared})
    return joins


def _attributes(
    parts: list[tuple[type, Path, Recovery]],
    logs: list[tuple[Path, Recovery]],
    cirh: list[tuple[Path, Recovery]],
    report_hashes: set[str | None],
    joins: list[dict[str, Any]],
    ignored: list[str],
) -> dict[str, Any]:
    recoveries = [part for _, _, part in parts]
    return {
        "artifacts": {str(path): dict(part.attributes) for _, path, part in parts},
        "compile_hashes": _union(
            [
                *(h for _, p in logs for h in p.attributes.get("compile_hashes", [])),
                *(compile_hash_of(path) for path, _ in cirh),
                *report_hashes,
            ]
        ),
        "workflow_ids": _union(w for part in recoveries for w in part.attributes.get("workflow_ids", [])),
        "job_ids": _union(job["id"] for part in recoveries for job in part.attributes.get("jobs", [])),
        "joins": joins,
        "ignored_files": ignored,
    }


# ---------------------------------------------------------------------------- coverage


def _coverage(
    merged: Recovery, cirh: list[tuple[Path, Recovery]], reports: list[tuple[Path, Recovery]]
) -> tuple[CoverageNote, ...]:
    measured = frozenset((m.kind, m.name) for m in merged.measurements)
    return assess(_Merged(merged, cirh, reports, measured), _RULES)


@dataclass(frozen=True)
class _Merged:
    """What the coverage notes of a Cerebras dump look at: the merged recovery, the CIRH
    dumps and compile reports among its parts, and the (kind, name) of its measurements."""

    recovery: Recovery
    cirh: list[tuple[Path, Recovery]]
    reports: list[tuple[Path, Recovery]]
    measured: frozenset[tuple[str, str]]


def _compiler_ir(merged: _Merged) -> CoverageNote:
    if not merged.cirh:
        return CoverageNote(
            "compiler_ir",
            Coverage.NOT_EXPOSED,
            "no CIRH dump among the inputs (kept only in the compile directory cs_<hash>/)",
        )
    fallbacks = [str(path) for path, part in merged.cirh if "parser_fallback" in part.attributes["cirh"]]
    parsers = sorted({source.parser for source in merged.recovery.sources if source.parser})
    detail = (
        f"{len(merged.recovery.operators)} ops from {len(merged.cirh)} CIRH dump(s), "
        f"read by the {' and '.join(parsers)}"
    )
    if not fallbacks:
        return CoverageNote("compiler_ir", Coverage.RECOVERED, detail)
    rejected = ", ".join(fallbacks)
    return CoverageNote(
        "compiler_ir",
        Coverage.PARTIAL,
        f"{detail}; the MLIR parser rejected {rejected} (read line by line, not verified)",
    )


def _lineage(merged: _Merged) -> CoverageNote:
    if not merged.cirh:
        return CoverageNote("lineage", Coverage.NOT_EXPOSED, "needs a CIRH dump")
    operators = merged.recovery.operators
    with_path = sum(1 for op in operators if op.module_path)
    phases = Counter(str(op.phase) for op in operators)
    return graded(
        "lineage",
        f"module path from CIRH locations for {with_path} of {len(operators)} ops; "
        "phase by location, then op name: "
        + ", ".join(f"{key} {value}" for key, value in sorted(phases.items())),
        recovered=with_path == len(operators) and "None" not in phases,
        partial=True,
    )


def _source_locations(merged: _Merged) -> CoverageNote | None:
    if not merged.cirh:
        return None
    operators = merged.recovery.operators
    with_source = sum(1 for op in operators if op.source is not None)
    return graded(
        "source_locations",
        f"file:line:col for {with_source} of {len(operators)} ops (the rest: unknown)",
        recovered=with_source == len(operators),
        partial=True,
    )


def _tensor_shapes(merged: _Merged) -> CoverageNote | None:
    if not merged.cirh:
        return None
    return CoverageNote(
        "tensor_shapes",
        Coverage.RECOVERED,
        f"{len(merged.recovery.tensors)} tensors, shapes and dtypes from CIRH types",
    )


def _partitions(merged: _Merged) -> CoverageNote:
    kernels = [p for p in merged.recovery.partitions if p.kind == "kernel"]
    if not kernels:
        return CoverageNote("partitions", Coverage.NOT_EXPOSED, "no kernel table and no CIRH dump")
    estimated = sum(1 for p in kernels if "samples_per_sec" in p.attributes)
    with_ops = sum(1 for p in kernels if p.operator_ids)
    return graded(
        "partitions",
        f"{len(kernels)} kernels: {with_ops} with CIRH ops, {estimated} with compile-report estimates",
        recovered=estimated == with_ops == len(kernels),
        partial=True,
    )


def _static_cost(merged: _Merged) -> CoverageNote | None:
    macs = sum(1 for op in merged.recovery.operators if op.macs is not None)
    if not (merged.reports or macs):
        return None
    return CoverageNote(
        "static_cost",
        Coverage.PARTIAL,
        f"compiler estimates from {len(merged.reports)} compile report(s); MACs of {macs} "
        "matmuls from shapes; no per-op cost model for the rest",
    )


def _per_program_timing(merged: _Merged) -> CoverageNote:
    if merged.measured & {("program", "train.steps"), ("program", "eval.steps")}:
        return CoverageNote(
            "per_program_timing",
            Coverage.PARTIAL,
            "seconds per step over each logging window (log timestamps); single steps are not logged",
        )
    if merged.measured & {("program", "total_time"), ("program", "processed_samples")}:
        return CoverageNote("per_program_timing", Coverage.PARTIAL, "run totals only")
    return CoverageNote("per_program_timing", Coverage.NOT_EXPOSED, "no log or run report given")


def _compile_timing(merged: _Merged) -> CoverageNote | None:
    if ("compile", "compile.phase") in merged.measured:
        return CoverageNote(
            "compile_timing",
            Coverage.RECOVERED,
            "compile phases from the timestamps of the compiler's phase records",
        )
    if ("compile", "compile") in merged.measured:
        return CoverageNote(
            "compile_timing", Coverage.PARTIAL, "whole compiles only (cached compiles log no phases)"
        )
    return None


#: The aspects a Cerebras reconstruction reports, in order: what the CIRH dumps give
#: when there are some, then what the appliance never reports.
_RULES = (
    _compiler_ir,
    _lineage,
    _source_locations,
    _tensor_shapes,
    _partitions,
    _static_cost,
    CoverageNote(
        "per_op_timing", Coverage.NOT_EXPOSED, "the appliance reports no per-op or per-kernel time"
    ),
    CoverageNote("per_partition_timing", Coverage.NOT_EXPOSED, "no per-kernel time is reported"),
    _per_program_timing,
    _compile_timing,
    CoverageNote("memory", Coverage.NOT_EXPOSED, "no memory figures in these artifacts"),
)

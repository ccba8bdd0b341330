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
from collections.abc import Iterable, Sequence
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
from dfit_mlir.adapters.recovery import (
    Coverage,
    CoverageNote,
    Measurement,
    RecoveredPartition,
    Recovery,
    files_of,
    readers_of,
)
from dfit_mlir.perf import paused_gc

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
    cirh = [(path, part) for reader, path, part in parts if reader is CirhReader]
    logs = [(path, part) for reader, path, part in parts if reader is ConsoleLogReader]
    summaries = [part for reader, _, part in parts if reader is RunSummaryReader]
    reports = [(path, part) for reader, path, part in parts if reader is CompileReportReader]
    joins: list[dict[str, Any]] = []

    # Kernels: a CIRH kernel and the compile report row of the same name and compile.
    partitions: dict[str, RecoveredPartition] = {}
    joined_kernels = 0
    for part in recoveries:
        for partition in part.partitions:
            found = partitions.get(partition.id)
            if found is None:
                partitions[partition.id] = partition
                continue
            joined_kernels += 1
            partitions[partition.id] = RecoveredPartition(
                id=partition.id,
                kind=partition.kind,
                operator_ids=found.operator_ids + partition.operator_ids,
                attributes={**found.attributes, **partition.attributes, "joined": True},
            )
    if joined_kernels:
        joins.append({"join": "cirh cs.kernel = compile_report kernel row", "kernels": joined_kernels})

    # Compiles: the log's compile hash names the directory of the CIRH dump and report.
    ops_by_hash: dict[str, list[str]] = {}
    for path, part in cirh:
        compile_hash = compile_hash_of(path)
        if compile_hash:
            ops_by_hash.setdefault(compile_hash, []).extend(op.id for op in part.operators)
    op_ids = {compile_hash: tuple(ids) for compile_hash, ids in ops_by_hash.items()}
    report_hashes = {compile_hash_of(path) for path, _ in reports} - {None}
    measurements: list[Measurement] = []
    for part in recoveries:
        for measurement in part.measurements:
            compile_hash = measurement.attributes.get("compile_hash")
            if measurement.kind == "compile" and measurement.name == "compile" and compile_hash in op_ids:
                measurement = dataclasses.replace(measurement, ids=op_ids[compile_hash])
            measurements.append(measurement)
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

    # Runs: summary.json's artifact_dir names the cerebras_logs/<run>/ of the executors.
    runs: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        for index, run in enumerate(summary.attributes["run_summary"]["runs"]):
            run_dir = str(run.get("artifact_dir") or "").rstrip("/").rsplit("/", 1)[-1]
            if run_dir:
                runs[run_dir] = {
                    "workflow_id": summary.attributes["run_summary"]["workflow_id"],
                    "run": index,
                    "status": run.get("status"),
                }
    if runs:
        matched = 0
        for position, measurement in enumerate(measurements):
            run = runs.get(measurement.attributes.get("run_dir", ""))
            if run is not None:
                measurements[position] = dataclasses.replace(
                    measurement, attributes={**measurement.attributes, **run}
                )
                matched += 1
        if matched:
            joins.append({"join": "summary.json artifact_dir = cerebras_logs/<run>", "measurements": matched})

    # Jobs and workflows: the same wsjob or wflow id in a log and in summary.json.
    for kind, ids_of in (
        ("wsjob id", lambda part: {job["id"] for job in part.attributes.get("jobs", [])}),
        ("workflow id", lambda part: set(part.attributes.get("workflow_ids", []))),
    ):
        ids_by_file = {str(path): ids for _, path, part in parts if (ids := ids_of(part))}
        files = list(ids_by_file)
        for i, first in enumerate(files):
            for second in files[i + 1 :]:
                shared = sorted(ids_by_file[first] & ids_by_file[second])
                if shared:
                    joins.append({"join": kind, "files": [first, second], "ids": shared})

    attributes = {
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
    operators = tuple(op for _, part in cirh for op in part.operators)
    merged = Recovery(
        backend=BACKEND,
        sources=tuple(source for part in recoveries for source in part.sources),
        operators=operators,
        tensors=tuple(tensor for _, part in cirh for tensor in part.tensors),
        partitions=tuple(partitions.values()),
        measurements=tuple(measurements),
        attributes=attributes,
    )
    return dataclasses.replace(merged, coverage=_coverage(merged, cirh, reports))


def _coverage(
    merged: Recovery, cirh: list[tuple[Path, Recovery]], reports: list[tuple[Path, Recovery]]
) -> tuple[CoverageNote, ...]:
    notes: list[CoverageNote] = []
    operators = merged.operators
    names = {(m.kind, m.name) for m in merged.measurements}
    if cirh:
        fallbacks = [str(path) for path, part in cirh if "parser_fallback" in part.attributes["cirh"]]
        parsers = sorted({source.parser for source in merged.sources if source.parser})
        detail = f"{len(operators)} ops from {len(cirh)} CIRH dump(s), read by the {' and '.join(parsers)}"
        if fallbacks:
            notes.append(
                CoverageNote(
                    "compiler_ir",
                    Coverage.PARTIAL,
                    detail
                    + "; the MLIR parser rejected "
                    + ", ".join(fallbacks)
                    + " (read line by line, not verified)",
                )
            )
        else:
            notes.append(CoverageNote("compiler_ir", Coverage.RECOVERED, detail))
        with_path = sum(1 for op in operators if op.module_path)
        phases: dict[str, int] = {}
        for op in operators:
            phases[str(op.phase)] = phases.get(str(op.phase), 0) + 1
        notes.append(
            CoverageNote(
                "lineage",
                Coverage.RECOVERED
                if with_path == len(operators) and "None" not in phases
                else Coverage.PARTIAL,
                f"module path from CIRH locations for {with_path} of {len(operators)} ops; "
                "phase by location, "
                f"then op name: " + ", ".join(f"{key} {value}" for key, value in sorted(phases.items())),
            )
        )
        with_source = sum(1 for op in operators if op.source is not None)
        notes.append(
            CoverageNote(
                "source_locations",
                Coverage.RECOVERED if with_source == len(operators) else Coverage.PARTIAL,
                f"file:line:col for {with_source} of {len(operators)} ops (the rest: unknown)",
            )
        )
        notes.append(
            CoverageNote(
                "tensor_shapes",
                Coverage.RECOVERED,
                f"{len(merged.tensors)} tensors, shapes and dtypes from CIRH types",
            )
        )
    else:
        notes.append(
            CoverageNote(
                "compiler_ir",
                Coverage.NOT_EXPOSED,
                "no CIRH dump among the inputs (kept only in the compile directory cs_<hash>/)",
            )
        )
        notes.append(CoverageNote("lineage", Coverage.NOT_EXPOSED, "needs a CIRH dump"))
    kernels = [p for p in merged.partitions if p.kind == "kernel"]
    if kernels:
        estimated = sum(1 for p in kernels if "samples_per_sec" in p.attributes)
        with_ops = sum(1 for p in kernels if p.operator_ids)
        notes.append(
            CoverageNote(
                "partitions",
                Coverage.RECOVERED if estimated == with_ops == len(kernels) else Coverage.PARTIAL,
                f"{len(kernels)} kernels: {with_ops} with CIRH ops, "
                f"{estimated} with compile-report estimates",
            )
        )
    else:
        notes.append(CoverageNote("partitions", Coverage.NOT_EXPOSED, "no kernel table and no CIRH dump"))
    macs = sum(1 for op in operators if op.macs is not None)
    if reports or macs:
        notes.append(
            CoverageNote(
                "static_cost",
                Coverage.PARTIAL,
                f"compiler estimates from {len(reports)} compile report(s); MACs of {macs} "
                "matmuls from shapes; no per-op cost model for the rest",
            )
        )
    notes.append(
        CoverageNote(
            "per_op_timing", Coverage.NOT_EXPOSED, "the appliance reports no per-op or per-kernel time"
        )
    )
    notes.append(CoverageNote("per_partition_timing", Coverage.NOT_EXPOSED, "no per-kernel time is reported"))
    if ("program", "train.steps") in names or ("program", "eval.steps") in names:
        notes.append(
            CoverageNote(
                "per_program_timing",
                Coverage.PARTIAL,
                "seconds per step over each logging window (log timestamps); single steps are not logged",
            )
        )
    elif ("program", "total_time") in names or ("program", "processed_samples") in names:
        notes.append(CoverageNote("per_program_timing", Coverage.PARTIAL, "run totals only"))
    else:
        notes.append(CoverageNote("per_program_timing", Coverage.NOT_EXPOSED, "no log or run report given"))
    if ("compile", "compile.phase") in names:
        notes.append(
            CoverageNote(
                "compile_timing",
                Coverage.RECOVERED,
                "compile phases from the timestamps of the compiler's phase records",
            )
        )
    elif ("compile", "compile") in names:
        notes.append(
            CoverageNote(
                "compile_timing", Coverage.PARTIAL, "whole compiles only (cached compiles log no phases)"
            )
        )
    notes.append(CoverageNote("memory", Coverage.NOT_EXPOSED, "no memory figures in these artifacts"))
    return tuple(notes)

"""``dfit reconstruct``: a closed backend's artifacts → the same bundle an IREE run writes.

A backend adapter's readers give a :class:`~dfit_mlir.adapters.recovery.Recovery`;
here it becomes a dfit manifest (operators, tensors, partitions as ``groups``, one
``reconstructed`` stage, the capability descriptor with the coverage notes) and
normalized events (one per measurement: compile phases, steps, throughput, memory
figures, estimates), written by the run-bundle writer, plus ``coverage.json``: what
was recovered, in part, or is not exposed by the backend.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dfit_mlir.adapters.base import Adapter
from dfit_mlir.adapters.recovery import (
    Coverage,
    CoverageNote,
    LineAccount,
    Measurement,
    RecoveredOperator,
    Recovery,
    SourceArtifact,
    ValueInfo,
)
from dfit_mlir.core import event_schema as es
from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core import toolchain
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.event_pipeline import EventPipeline, EventRow, Policy

STAGE = "reconstructed"
#: Partition kinds that group other partitions rather than run ops themselves.
PARTITION_GROUP_KINDS = frozenset({"section"})


def reconstruct_bundle(paths: Sequence[Path], bundle: Path, backend: str | Adapter = "auto") -> dict[str, Any]:
    """Read the dump, write the bundle atomically; returns the bundle's summary.
    ``backend``: ``auto`` (detected from the files), a registered name, or an adapter."""
    from dfit_mlir.adapters import registry
    from dfit_mlir.exporters.bundle import write_bundle

    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise InvalidInputError(f"{missing[0]}: no such file or directory")
    if isinstance(backend, Adapter):
        adapter = backend
    else:
        adapter = registry.detect(paths) if backend == "auto" else registry.get(backend)
    recovery = adapter.collect(paths)
    if not recovery.operators and not recovery.measurements and not recovery.partitions:
        raise InvalidInputError(f"the {adapter.name} readers recovered nothing from {', '.join(map(str, paths))}")
    recovery = _with_line_notes(recovery)
    manifest = to_manifest(recovery, adapter.capabilities(), paths)
    rows = measurement_rows(recovery.measurements)
    coverage = coverage_report(recovery)
    lines = coverage["lines"]
    summary = {
        "mode": "reconstructed",
        "backend": recovery.backend,
        "detected": backend == "auto",
        "sources": [_source(source) for source in recovery.sources],
        "lines": {"total": sum(a["total"] for a in lines.values()),
                  "consumed": sum(a["consumed"] for a in lines.values()),
                  "unparsed": sum(a["unparsed"] for a in lines.values()),
                  "files_with_unparsed": sum(1 for a in lines.values() if a["unparsed"])},
        # Section groups (SambaFlow's Plasma units) group partitions: not partitions.
        "recovered": {"operators": len(recovery.operators), "tensors": len(recovery.tensors),
                      "partitions": sum(1 for p in recovery.partitions if p.kind not in PARTITION_GROUP_KINDS),
                      "partition_groups": sum(1 for p in recovery.partitions if p.kind in PARTITION_GROUP_KINDS),
                      "measurements": len(recovery.measurements)},
        "coverage": coverage["aspects"],
    }
    warnings = input_warnings(recovery)
    if warnings:
        summary["warnings"] = warnings
    scopes = scope_counts(recovery)
    if scopes:
        summary["recovered"]["scopes"] = scopes
    session = uuid.uuid4().hex[:12]

    def fill(sink: Any) -> EventPipeline:
        pipeline = EventPipeline(manifest, Policy(mode="reconstructed"), sink, session=session,
                                 backend=recovery.backend, stage=STAGE)
        for kind in es.EVENT_KINDS:
            pipeline.add_rows(kind, [row for row, row_kind in rows if row_kind == kind])
        return pipeline

    write_bundle(bundle, manifest, fill, summary,
                 extra_files={"coverage.json": json.dumps(coverage, indent=1) + "\n"})
    return json.loads((bundle / "summary.json").read_text())


def scope_counts(recovery: Recovery) -> dict[str, dict[str, int]]:
    """Records per run scope (one compile or run of a file holding several): ``{scope:
    {operators, partitions, partition_groups, measurements}}``, so the counts of pasted
    logs can be checked against each log's own. Empty when no record carries a scope.
    Scope IDs are per file (``compile0``, ``run1``); records of several files with the
    same scope ID count together."""
    scopes: dict[str, dict[str, int]] = {}

    def tally(attributes: Any, what: str) -> None:
        scope = attributes.get("run_scope") if attributes else None
        if isinstance(scope, str):
            counts = scopes.setdefault(
                scope, {"operators": 0, "partitions": 0, "partition_groups": 0, "measurements": 0})
            counts[what] += 1

    for operator in recovery.operators:
        tally(operator.attributes, "operators")
    for partition in recovery.partitions:
        tally(partition.attributes, "partition_groups" if partition.kind in PARTITION_GROUP_KINDS else "partitions")
    for measurement in recovery.measurements:
        tally(measurement.attributes, "measurements")

    def natural(scope: str) -> tuple[str, int, str]:  # compile2 before compile10
        stem = scope.rstrip("0123456789")
        digits = scope[len(stem):]
        return (stem, int(digits) if digits else -1, scope)

    return {scope: scopes[scope] for scope in sorted(scopes, key=natural)}


def to_manifest(recovery: Recovery, capabilities: dict[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
    operators = [_operator(op) for op in recovery.operators]
    ids = [op["id"] for op in operators]
    duplicates = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if duplicates:
        raise InvalidInputError(f"the {recovery.backend} readers produced duplicate operator IDs: {duplicates[:3]}")
    first = Path(paths[0])
    return {
        "schema": manifest_io.SCHEMA_NAME,
        "version": manifest_io.MANIFEST_VERSION,
        "id_scheme": 1,
        "producer": {"tool": "dfit reconstruct", "toolchain": toolchain.versions(),
                     "python": sys.version.split()[0]},
        "input": {"path": str(first), "sources": [_source(source) for source in recovery.sources]},
        "compile": {"mode": "reconstructed"},
        "operators": operators,
        "tensors": [{
            "id": t.id, "name": t.name, "producer": t.producer, "consumers": list(t.consumers),
            "shape": None if t.shape is None else list(t.shape), "dtype": t.dtype, "bytes": t.bytes,
            "constant": t.constant,
        } for t in recovery.tensors],
        "stages": [{
            "name": STAGE, "ops": len(operators), "tagged_ops": len(operators),
            "non_constant_ops": len(operators), "non_constant_tagged": len(operators),
            "coverage": 1.0 if operators else 0.0, "attributed": 1.0 if operators else 0.0,
            "materialised_by_kind": {},
            "lineage": {"preserved": len(operators), "fused": 0, "split": 0, "erased": 0, "erased_constants": 0},
            "phase_s": None, "snapshot_s": None,
        }],
        "lineage": {"stages": [STAGE], "classes": dict.fromkeys(ids, "p")},
        "partitions": {
            "exports": [], "dispatch_sites": [],
            "groups": [{"id": p.id, "kind": p.kind, "operator_ids": list(p.operator_ids),
                        "attributes": _jsonable(p.attributes)} for p in recovery.partitions],
        },
        "capabilities": {**capabilities, "coverage": [
            {"aspect": note.aspect, "status": note.status.value, "detail": note.detail} for note in recovery.coverage]},
        "backend_attributes": _jsonable(recovery.attributes),
    }


def _operator(op: RecoveredOperator) -> dict[str, Any]:
    operands = [_value(v) for v in op.inputs]
    results = [_value(v) for v in op.outputs]
    structure = json.dumps([op.op, operands, results, _jsonable(op.attributes)], sort_keys=True)
    return {
        "id": op.id,
        "hash": hashlib.blake2b(structure.encode(), digest_size=8).hexdigest(),
        "op": op.op,
        "parent": None,
        "name": op.name,
        "index": op.index,
        "operands": operands,
        "results": results,
        "macs": op.macs,
        "flops": op.flops,
        "bytes": op.bytes,
        "source": None if op.source is None else {"file": op.source.file, "line": op.source.line,
                                                   "col": op.source.col},
        "name_path": list(op.module_path),
        "call_stack": [{"file": frame.file, "line": frame.line, "col": frame.col} for frame in op.call_stack],
        "phase": op.phase,
        "partition": op.partition,
        "status": op.status,
        "attributes": _jsonable(op.attributes),
    }


def _value(value: ValueInfo) -> dict[str, Any]:
    shape = None if value.shape is None else list(value.shape)
    if shape is not None and value.dtype:
        text = "tensor<" + "".join(f"{'?' if d is None else d}x" for d in shape) + f"{value.dtype}>"
    else:
        text = value.dtype or "unknown"
    return {"type": text, "shape": shape, "dtype": value.dtype, "bytes": value.bytes, "name": value.name}


def measurement_rows(measurements: Sequence[Measurement]) -> list[tuple[EventRow, str]]:
    """One event per measurement: ``(row, kind)``; kinds outside the schema are metrics."""
    rows = []
    for m in measurements:
        kind = m.kind if m.kind in es.EVENT_KINDS else "metric"
        attributes = {"unit": m.unit, "origin": m.origin, **_jsonable(m.attributes)}
        if kind != m.kind:
            attributes["reported_kind"] = m.kind
        if len(m.ids) > 1:
            attributes["ids"] = list(m.ids)
        rows.append((EventRow(
            invocation=None,
            partition=m.partition,
            root_id=m.ids[0] if m.ids else None,
            start_ns=None if m.start_s is None else round(m.start_s * 1e9),
            duration_ns=None if m.duration_s is None else round(m.duration_s * 1e9),
            bytes=round(m.value) if kind == "memory" and m.unit in ("B", "bytes") and m.value is not None else None,
            attributes={k: v for k, v in attributes.items() if v is not None},
            name=m.name,
            value=m.value,
            step=m.step,
        ), kind))
    return rows


def coverage_report(recovery: Recovery) -> dict[str, Any]:
    """Per aspect: recovered / partial / not-exposed, with the readers' details."""
    aspects: dict[str, dict[str, Any]] = {}
    rank = {"recovered": 0, "partial": 1, "not-exposed": 2}
    for note in recovery.coverage:
        entry = aspects.setdefault(note.aspect, {"status": note.status.value, "details": []})
        if rank[note.status.value] > rank[entry["status"]]:
            entry["status"] = note.status.value
        if note.detail not in entry["details"]:
            entry["details"].append(note.detail)
    return {
        "backend": recovery.backend,
        "aspects": {name: entry["status"] for name, entry in sorted(aspects.items())},
        "notes": aspects,
        "ignored_files": list(recovery.attributes.get("ignored_files", [])),
        "sources": [_source(source) for source in recovery.sources],
        "lines": {path: account.as_json() for path, account in line_accounts(recovery.sources).items()},
    }


def _source(source: SourceArtifact) -> dict[str, Any]:
    """A source as the bundle lists it (its line account goes to ``coverage.json``)."""
    return {key: value for key, value in asdict(source).items() if key != "lines"}


def line_accounts(sources: Sequence[SourceArtifact]) -> dict[str, LineAccount]:
    """Per text file, what became of its lines; a file read by several readers (a
    SambaFlow job log holding a compile and a run) counts a line consumed when any of
    them consumed it."""
    by_path: dict[str, list[LineAccount]] = {}
    for source in sources:
        if source.lines is not None:
            by_path.setdefault(source.path, []).append(source.lines)
    return {path: LineAccount.merged(accounts) for path, accounts in by_path.items()}


def input_warnings(recovery: Recovery) -> list[str]:
    """What the readers read past and the user must hear of (the CLI prints each as a
    ``dfit: warning:`` line): text files that held NUL bytes."""
    return [nul_warning(path, account) for path, account in line_accounts(recovery.sources).items()
            if account.nul_lines]


def nul_warning(path: str, account: LineAccount) -> str:
    return (f"{path}:{account.first_nul_line}: {account.nul_lines} line(s) held NUL bytes (what a writer that "
            "crashed or preallocated the file leaves); they were dropped and the text around them read")


def _with_line_notes(recovery: Recovery) -> Recovery:
    """One ``lines`` coverage note per text file with unparsed lines, naming the first
    lines a rule recognised but could not read; one per file that held NUL bytes."""
    notes = []
    for path, account in line_accounts(recovery.sources).items():
        if account.nul_lines:
            notes.append(CoverageNote("lines", Coverage.PARTIAL, nul_warning(path, account)))
        if not account.unparsed:
            continue
        detail = f"{path}: {account.unparsed} of {account.total} lines not parsed"
        if account.problems:
            detail += "; unreadable records: " + "; ".join(
                f"{path}:{number}: {why}" for number, why in account.problems[:3])
        notes.append(CoverageNote("lines", Coverage.PARTIAL, detail))
    if not notes:
        return recovery
    return replace(recovery, coverage=recovery.coverage + tuple(notes))


def _jsonable(value: Any) -> Any:
    """Mappings, tuples, paths and enums as plain JSON values."""
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    if hasattr(value, "value"):
        return value.value
    if hasattr(value, "items"):
        return dict(value.items())
    return str(value)

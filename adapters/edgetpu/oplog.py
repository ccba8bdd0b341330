"""Reader for the Edge TPU compiler's operation log (``<model>_edgetpu.log``).

Every compiler version seen (2.1, 15.0, 16.0) writes the same shape::

    Edge TPU Compiler version 16.0.384591198
    Input: yolov8n_saved_model/yolov8n_full_integer_quant.tflite
    Output: yolov8n_saved_model/yolov8n_full_integer_quant_edgetpu.tflite

    Operator                       Count      Status

    CONV_2D                        1          More than one subgraph is not supported
    CONV_2D                        63         Mapped to Edge TPU

The table is fixed-width, but an op name longer than its column pushes the rest of the
row right, so rows are split on whitespace runs (name, count, status) rather than on
column positions. One op type appears on several rows when its ops ended with different
statuses. The log counts ops per type and status only: which op got which status is not
in it (the cross-file matching in :mod:`.matching` recovers that from the models).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from dfit_mlir.adapters.lines import BLANK, DECORATION, Line, Rule, apply_rules, echo, read_file
from dfit_mlir.adapters.recovery import (
    ArtifactError,
    Coverage,
    CoverageNote,
    LineAccount,
    Measurement,
    Recovery,
    source_artifact,
)

BACKEND = "edgetpu"
#: The status of an op the compiler placed inside the Edge TPU custom op.
MAPPED = "Mapped to Edge TPU"

_VERSION_RE = re.compile(r"^Edge TPU Compiler version (?P<version>\S+)")
_HEADER_RE = re.compile(r"^Operator\s+Count\s+Status\s*$")
#: The count column of a row: the first whitespace-delimited integer after the op name
#: (searched from the left, so it is linear on any line; the name and status are what
#: lies either side of it).
_COUNT_RE = re.compile(r"\s(?P<count>\d+)\s+(?=\S)")
_PATH_RE = re.compile(r"^(?P<key>Input|Output): (?P<path>.*)$")


@dataclass(frozen=True)
class OperationRow:
    op_type: str
    count: int
    status: str
    #: 1-based line of the row in the log (its first, when the row is repeated).
    line: int
    #: Times the same row (type, count, status) was read in this log: a repeated row is
    #: kept once and counted, so a log of a million copies is read in bounded memory.
    repeats: int = 1

    @property
    def mapped(self) -> bool:
        return self.status == MAPPED


def table_row(number: int, text: str) -> OperationRow | None:
    """The row on line ``number``, or None when ``text`` is not a table row."""
    text = text.strip()
    found = _COUNT_RE.search(text)
    if found is None or not found.start():
        return None
    status = text[found.end() :].strip()
    if len(found["count"]) > 18:
        return None
    return OperationRow(text[: found.start()].strip(), int(found["count"]), status, number)


def parse_table_row(path: Path, number: int, text: str) -> OperationRow:
    row = table_row(number, text)
    if row is None:
        raise ArtifactError.at(
            path,
            number,
            f"malformed operation table row {echo(text.strip())} (expected: <operator> <count> <status>)",
        )
    return row


def is_table_header(text: str) -> bool:
    return bool(_HEADER_RE.match(text))


@dataclass(frozen=True)
class OperationLog:
    path: Path
    compiler_version: str
    #: The paths as the log writes them (relative to where the compiler ran).
    input_model: str | None
    output_model: str | None
    rows: tuple[OperationRow, ...]
    lines: LineAccount | None = field(default=None, compare=False)
    #: Which log of its file this is (``compile0``; ``compile1`` for a second log
    #: pasted after the first) and the line it starts at.
    run_scope: str = "compile0"
    first_line: int = 1

    @property
    def model(self) -> str:
        """The original model's stem (``yolov8n_full_integer_quant``)."""
        if self.input_model:
            return Path(self.input_model).stem
        return self.path.stem.removesuffix("_edgetpu")

    @property
    def total(self) -> int:
        return sum(row.count * row.repeats for row in self.rows)

    @property
    def mapped(self) -> int:
        return sum(row.count * row.repeats for row in self.rows if row.mapped)

    def counts(self) -> dict[str, dict[str, int]]:
        """``{op type: {status: count}}`` in the log's order."""
        table: dict[str, dict[str, int]] = {}
        for row in self.rows:
            by_status = table.setdefault(row.op_type, {})
            by_status[row.status] = by_status.get(row.status, 0) + row.count * row.repeats
        return table

    def counts_by_type(self) -> dict[str, int]:
        return {op_type: sum(by_status.values()) for op_type, by_status in self.counts().items()}

    def mapped_by_type(self) -> dict[str, int]:
        return {op_type: by_status.get(MAPPED, 0) for op_type, by_status in self.counts().items()}

    def not_mapped_by_type(self) -> dict[str, int]:
        return {
            op_type: sum(n for status, n in by_status.items() if status != MAPPED)
            for op_type, by_status in self.counts().items()
        }

    def cpu_statuses(self, op_type: str) -> tuple[str, ...]:
        """The statuses other than mapped that the log gives ops of this type."""
        return tuple(status for status in self.counts().get(op_type, {}) if status != MAPPED)

    def cpu_status_counts(self, op_type: str) -> dict[str, int]:
        """``{status: count}`` of the ops of this type the log says were not mapped: the
        candidates of a CPU op of that type when there are several (the log does not say
        which op got which)."""
        return {status: n for status, n in self.counts().get(op_type, {}).items() if status != MAPPED}


class OperationLogReader:
    """``*_edgetpu.log`` -> per op type and status counts, compiler version, model paths."""

    format: ClassVar[str] = "edgetpu-oplog"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        text = head.decode("utf-8", "replace")
        if "Edge TPU Compiler version" not in text:
            return False
        # The console summary says "Input model:"; the operation log says "Input:".
        lines = text.splitlines()
        has_log_lines = any(_PATH_RE.match(line) or _HEADER_RE.match(line) for line in lines)
        return has_log_lines and not any(line.startswith("Input model:") for line in lines)

    def logs(self) -> tuple[OperationLog, ...]:
        """Every operation log of the file, in order: one per compile (a file holding
        several pasted logs gives several, each its own scope, none added to another)."""
        state = _OpLogState(self.path)
        account = read_file(self.path, state.feed)
        state.close_log()
        first = state.done[0] if state.done else None
        if first is None or first.version is None:
            raise ArtifactError.at(self.path, 1, "no 'Edge TPU Compiler version' line")
        if not first.in_table:
            raise ArtifactError.at(self.path, None, "no 'Operator  Count  Status' table")
        for part in state.done[1:]:
            if not part.in_table:
                raise ArtifactError.at(
                    self.path, part.first_line, "an operation log starts here but has no 'Operator  Count  Status' table"
                )
        return tuple(
            OperationLog(
                self.path,
                part.version or first.version,
                part.paths.get("Input"),
                part.paths.get("Output"),
                tuple(part.rows),
                account,
                run_scope=f"compile{index}",
                first_line=part.first_line,
            )
            for index, part in enumerate(state.done)
        )

    def log(self) -> OperationLog:
        """The file's operation log; a file holding several is an error here (read it
        with :meth:`logs`, which keeps them apart)."""
        logs = self.logs()
        if len(logs) > 1:
            starts = ", ".join(str(log.first_line) for log in logs)
            raise ArtifactError.at(self.path, None, f"holds {len(logs)} operation logs (lines {starts}): one expected")
        return logs[0]

    def read(self) -> Recovery:
        return logs_recovery(self.logs(), self.format)


#: A table row's line -> (IDs of the ops it counts, the partition they run in).
RowLinks = Mapping[int, tuple[tuple[str, ...], str | None]]


def log_measurements(log: OperationLog, links: RowLinks | None = None) -> tuple[Measurement, ...]:
    """One ``metric`` / ``operation_count`` figure per table row; ``links`` (from the
    cross-file matching) names the ops a row counts where that is known."""
    links = links or {}
    return tuple(
        Measurement(
            kind="metric",
            name="operation_count",
            value=float(row.count),
            unit="ops",
            ids=links.get(row.line, ((), None))[0],
            partition=links.get(row.line, ((), None))[1],
            origin=f"{log.path}:{row.line}",
            attributes={
                "model": log.model,
                "op_type": row.op_type,
                "status": row.status,
                "mapped": row.mapped,
                "run_scope": log.run_scope,
                **({"repeats": row.repeats} if row.repeats > 1 else {}),
            },
        )
        for row in log.rows
    )


def log_attributes(log: OperationLog) -> dict[str, object]:
    return {
        "compiler_version": log.compiler_version,
        "input_model": log.input_model,
        "output_model": log.output_model,
        "operation_counts": log.counts(),
        "operations_total": log.total,
        "operations_mapped": log.mapped,
        "operations_not_mapped": log.total - log.mapped,
    }


def log_recovery(log: OperationLog, format: str = OperationLogReader.format) -> Recovery:
    return logs_recovery((log,), format)


def logs_recovery(logs: tuple[OperationLog, ...], format: str = OperationLogReader.format) -> Recovery:
    """The logs of one file (one per compile pasted into it)."""
    first = logs[0]
    total = sum(log.total for log in logs)
    mapped = sum(log.mapped for log in logs)
    attributes = log_attributes(first)
    if len(logs) > 1:
        attributes["compiles"] = [
            {"run_scope": log.run_scope, "first_line": log.first_line, **log_attributes(log)} for log in logs
        ]
    return Recovery(
        backend=BACKEND,
        sources=(source_artifact(first.path, format, lines=first.lines),),
        measurements=tuple(m for log in logs for m in log_measurements(log)),
        coverage=(
            CoverageNote(
                "operators",
                Coverage.PARTIAL,
                f"{total} ops counted per type and mapping status; no individual ops"
                + (f" ({len(logs)} compiles)" if len(logs) > 1 else ""),
            ),
            CoverageNote(
                "partitions",
                Coverage.PARTIAL,
                f"{mapped} ops mapped to the Edge TPU, {total - mapped} not; which op went where needs the models",
            ),
        ),
        attributes=attributes,
    )


@dataclass
class _LogPart:
    """One operation log of a file, while it is read."""

    first_line: int
    version: str | None = None
    paths: dict[str, str] = field(default_factory=dict)
    rows: list[OperationRow] = field(default_factory=list)
    in_table: bool = False
    #: (op type, count, status) -> position in ``rows``.
    seen: dict[tuple[str, int, str], int] = field(default_factory=dict)

    def add_row(self, row: OperationRow) -> None:
        key = (row.op_type, row.count, row.status)
        at = self.seen.get(key)
        if at is None:
            self.seen[key] = len(self.rows)
            self.rows.append(row)
        else:
            self.rows[at] = replace(self.rows[at], repeats=self.rows[at].repeats + 1)


@dataclass
class _OpLogState:
    """The operation log's rules: a head (version, model paths), the table header, then
    one row per op type and status. Every record is a fact of the compile (no time). A
    version line after a table starts the next log pasted into the file (one per
    compile: its counts are never added to the previous log's); one repeated before
    the table is a duplicated header line."""

    path: Path
    part: _LogPart = field(default_factory=lambda: _LogPart(1))
    done: list[_LogPart] = field(default_factory=list)

    @property
    def in_table(self) -> bool:
        return self.part.in_table

    def close_log(self) -> None:
        self.done.append(self.part)

    def version_line(self, found: re.Match[str], line: Line) -> None:
        if self.part.in_table:
            self.close_log()
            self.part = _LogPart(line.number)
        self.part.version = found["version"]

    def path_line(self, found: re.Match[str], line: Line) -> None:
        self.part.paths[found["key"]] = found["path"].strip()

    def header(self, found: re.Match[str], line: Line) -> None:
        self.part.in_table = True

    def feed(self, line: Line) -> bool:
        if self.part.in_table and not _HEADER_RE.match(line.text) and not _VERSION_RE.match(line.text):
            self.part.add_row(parse_table_row(self.path, line.number, line.text))
            return True
        return apply_rules(_OPLOG_RULES, self, line)


_OPLOG_RULES: tuple[Rule, ...] = (
    Rule(_VERSION_RE, lambda s, f, line: s.version_line(f, line), "compiler version"),
    Rule(_PATH_RE, lambda s, f, line: s.path_line(f, line), "input / output model path"),
    # A log pasted twice repeats the header; the table goes on.
    Rule(_HEADER_RE, lambda s, f, line: s.header(f, line), "operation table header", DECORATION),
    BLANK,
)

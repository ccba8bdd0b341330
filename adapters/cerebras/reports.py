"""The files a Cerebras run leaves next to its log: the per-executor ``performance.json``
and ``track.json`` under ``model_dir/cerebras_logs/<run>/executors/<executor>/``, the
restartable run's ``summary.json``, and the compiler's ``compile_report.txt`` in the
compile directory ``cs_<hash>/``.

Only the first seven lines of a real ``compile_report.txt`` are public (a documentation
quote, ``fixtures/cerebras/docquote_compile_report``); the per-kernel table is read as
the Cerebras documentation shows it (``| Kernel Name | Samples/s | ... |`` rows between
``+---+`` borders).
"""

from __future__ import annotations

import calendar
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.adapters.cerebras.logs import BACKEND
from dfit_mlir.adapters.lines import Line, Scopes, finite, read_file
from dfit_mlir.adapters.recovery import (
    ArtifactError,
    Coverage,
    CoverageNote,
    Measurement,
    RecoveredPartition,
    Recovery,
    source_artifact,
)

_COMPILE_DIR_RE = re.compile(r"^cs_\d+$")
_TIME_RE = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?$")
_TRACK_HEAD_RE = re.compile(rb'^\s*\{\s*"[^"]+"\s*:\s*\[\s*-?[\d.]', re.S)


def compile_hash_of(path: Path) -> str | None:
    """``cs_<hash>`` of the compile directory a file sits in (the directory the log's
    ``Compile hash is: cs_...`` names), or None."""
    for parent in Path(path).parents:
        if _COMPILE_DIR_RE.match(parent.name):
            return parent.name
    return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        line = path.read_bytes()[: error.start].count(b"\n") + 1
        raise ArtifactError.at(path, line, f"not UTF-8 text ({error.reason})") from None


def _load_json(path: Path) -> tuple[Any, list[str]]:
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ArtifactError.at(
            path, error.lineno, f"not valid JSON: {error.msg} (column {error.colno})"
        ) from None
    return data, text.splitlines()


def _line_of(lines: list[str], key: str) -> int | None:
    needle = f'"{key}"'
    return next((number for number, line in enumerate(lines, start=1) if needle in line), None)


def _number(path: Path, lines: list[str], key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArtifactError.at(path, _line_of(lines, key), f"{key}: expected a number, found {value!r}")
    return float(value)


def _executor_place(path: Path) -> dict[str, str]:
    """``cerebras_logs/<run>/executors/<executor>/file.json`` → run and executor names."""
    place: dict[str, str] = {}
    if path.parent.parent.name == "executors":
        place["executor"] = path.parent.name
        place["run_dir"] = path.parent.parent.parent.name
    return place


class PerformanceJsonReader:
    """``performance.json``: an executor's throughput summary (rates, samples, time,
    FLOPs utilization)."""

    format: ClassVar[str] = "cerebras-performance-json"
    #: key → (event kind, unit). The unit of ``flops_utilization`` is not documented
    #: (a fraction or a percentage), so none is claimed.
    KEYS: ClassVar[dict[str, tuple[str, str | None]]] = {
        "flops_utilization": ("metric", None),
        "global_rate": ("metric", "samples/s"),
        "rate": ("metric", "samples/s"),
        "samples_per_sec": ("metric", "samples/s"),
        "total_samples": ("metric", "samples"),
        "total_time": ("program", "s"),
    }

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return path.name == "performance.json" and any(f'"{key}"'.encode() in head for key in cls.KEYS)

    def read(self) -> Recovery:
        data, lines = _load_json(self.path)
        if not isinstance(data, dict):
            raise ArtifactError.at(self.path, 1, "expected a JSON object")
        place = _executor_place(self.path)
        measurements = []
        for key, value in data.items():
            if key not in self.KEYS:
                continue
            kind, unit = self.KEYS[key]
            number = _number(self.path, lines, key, value)
            measurements.append(
                Measurement(
                    kind,
                    key,
                    number,
                    unit,
                    duration_s=number if key == "total_time" else None,
                    origin=f"{self.path}:{_line_of(lines, key)}",
                    attributes=dict(place),
                )
            )
        if not measurements:
            raise ArtifactError.at(self.path, 1, f"none of {sorted(self.KEYS)} present")
        extra = {key: value for key, value in data.items() if key not in self.KEYS}
        return Recovery(
            backend=BACKEND,
            sources=(source_artifact(self.path, self.format),),
            measurements=tuple(measurements),
            attributes={"performance": {**place, **({"other": extra} if extra else {})}}
            if place or extra
            else {},
        )


class TrackJsonReader:
    """``track.json``: an executor's phase timer, ``{"Phase": [seconds, {sub-phases}]}``."""

    format: ClassVar[str] = "cerebras-track-json"

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return path.name == "track.json" and _TRACK_HEAD_RE.match(head) is not None

    def read(self) -> Recovery:
        data, lines = _load_json(self.path)
        if not isinstance(data, dict):
            raise ArtifactError.at(self.path, 1, "expected a JSON object of phase timers")
        place = _executor_place(self.path)
        measurements: list[Measurement] = []

        def visit(timers: dict[str, Any], parents: tuple[str, ...]) -> None:
            for name, timer in timers.items():
                if not (isinstance(timer, list) and len(timer) == 2 and isinstance(timer[1], dict)):
                    raise ArtifactError.at(
                        self.path,
                        _line_of(lines, name),
                        f"{name}: expected [seconds, {{sub-phases}}], found {timer!r}",
                    )
                seconds = _number(self.path, lines, name, timer[0])
                measurements.append(
                    Measurement(
                        "program",
                        "track.phase",
                        seconds,
                        "s",
                        duration_s=seconds,
                        origin=f"{self.path}:{_line_of(lines, name)}",
                        attributes={"phase": "/".join((*parents, name)), **place},
                    )
                )
                visit(timer[1], (*parents, name))

        visit(data, ())
        return Recovery(
            backend=BACKEND,
            sources=(source_artifact(self.path, self.format),),
            measurements=tuple(measurements),
        )


def _utc_seconds(path: Path, lines: list[str], key: str, text: Any) -> float:
    match = _TIME_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ArtifactError.at(path, _line_of(lines, key), f"{key}: expected 'YYYY-MM-DD HH:MM:SS[.ffffff]'")
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    fraction = float("0." + match.group(7)) if match.group(7) else 0.0
    return calendar.timegm((year, month, day, hour, minute, second)) + fraction


class RunSummaryReader:
    """``<timestamp>_restartable/summary.json``: a restartable run's workflow, its runs
    with their compile / execute wsjob ids, times, status and CS-X count."""

    format: ClassVar[str] = "cerebras-run-summary-json"

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return path.name == "summary.json" and b'"workflow_id"' in head and b'"runs"' in head

    def read(self) -> Recovery:
        data, lines = _load_json(self.path)
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            raise ArtifactError.at(
                self.path, _line_of(lines, "runs") or 1, "expected an object with a 'runs' list"
            )
        workflow = data.get("workflow_id")
        measurements = []
        jobs: list[dict[str, Any]] = []
        runs = []
        for index, run in enumerate(data["runs"]):
            if not isinstance(run, dict):
                raise ArtifactError.at(self.path, _line_of(lines, "runs"), f"run {index} is not an object")
            start_s = _utc_seconds(self.path, lines, "start_time", run.get("start_time"))
            end_s = (
                _utc_seconds(self.path, lines, "end_time", run["end_time"]) if run.get("end_time") else None
            )
            for kind in ("compile", "execute"):
                ids = run.get(f"{kind}_job_ids") or []
                if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                    raise ArtifactError.at(
                        self.path, _line_of(lines, f"{kind}_job_ids"), "expected a list of ids"
                    )
                jobs += [{"id": job_id, "kind": kind, "run": index} for job_id in ids]
            runs.append(run)
            duration = None if end_s is None else round(end_s - start_s, 6)
            measurements.append(
                Measurement(
                    "program",
                    "run",
                    duration,
                    "s",
                    start_s=start_s,
                    duration_s=duration,
                    origin=f"{self.path}:{_line_of(lines, 'start_time')}",
                    attributes={
                        "run": index,
                        "workflow_id": workflow,
                        **{k: v for k, v in run.items() if k not in ("start_time", "end_time")},
                    },
                )
            )
        last = runs[-1] if runs else {}
        return Recovery(
            backend=BACKEND,
            sources=(source_artifact(self.path, self.format),),
            measurements=tuple(measurements),
            attributes={
                "workflow_ids": [workflow] if workflow else [],
                "jobs": jobs,
                "run_summary": {
                    "workflow_id": workflow,
                    "max_num_restarts": data.get("max_num_restarts"),
                    "min_num_csx": data.get("min_num_csx"),
                    "status": last.get("status"),
                    "num_csx": last.get("num_csx"),
                    "runs": runs,
                },
            },
        )


def _snake(header: str) -> str:
    """``Compute Samples/s`` → ``compute_samples_per_sec``."""
    text = header.strip().lower().replace("/s", " per sec").replace("%", " percent")
    return re.sub(r"[^a-z0-9]+", "_", text).strip("_")


def _figure(text: str, what: str, path: Path, line: int) -> tuple[float | int, str | None]:
    """A report figure: ``62%`` → (0.62, "fraction"); ``5203`` → (5203, None); anything
    else (``inf``, ``nan``, thousands of digits) raises naming the line."""
    if text.endswith("%"):
        return finite(text[:-1], what, path, line) / 100, "fraction"
    value = finite(text, what, path, line)
    return (int(value), None) if text.strip().lstrip("-").isdigit() else (value, None)


class CompileReportReader:
    """``cs_<hash>/compile_report.txt``: the compiler's estimated overall performance and
    its per-kernel table; each kernel becomes a partition of kind ``kernel``."""

    format: ClassVar[str] = "cerebras-compile-report"

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return b"Estimated Overall Performance" in head[:2048]

    def read(self) -> Recovery:
        """Rules: the title and rule lines are decoration; ``Key: figure`` lines before
        the kernel table are overall estimates (no time: the compiler's prediction);
        ``| ... |`` rows are the kernel table (its first row the header). The title
        line starts a report: a second one after figures were read is a second report
        pasted into the file, its own scope (``compile1``), whose figures and kernels are
        kept apart from the first's."""
        compile_hash = compile_hash_of(self.path)
        measurements: list[Measurement] = []
        partitions: list[RecoveredPartition] = []
        columns: list[str] | None = None
        seen: dict[str, int] = {}
        scopes = Scopes("compile")
        read_in_scope = False

        def feed(line: Line) -> bool:
            nonlocal columns, seen, read_in_scope
            number, text = line.number, line.text.strip()
            if text == "Estimated Overall Performance":
                if read_in_scope or not scopes.all:
                    scopes.open(number if scopes.all else 1)
                    columns, seen, read_in_scope = None, {}, False
                return True
            if text.startswith(("#", "+", "---")):
                return True  # comments and table frames: decoration
            if text.startswith("|"):
                cells = [cell.strip() for cell in text.strip("|").split("|")]
                if columns is None:
                    if _snake(cells[0]) != "kernel_name":
                        raise ArtifactError.at(self.path, number, "kernel table without a 'Kernel Name' column")
                    columns = [_snake(cell) for cell in cells]
                    return True
                if not any(cells):
                    return True
                if len(cells) != len(columns):
                    raise ArtifactError.at(
                        self.path, number, f"kernel row has {len(cells)} cells, the header {len(columns)}"
                    )
                kernel = self.kernel(number, columns, cells, seen, compile_hash)
                partitions.append(replace(kernel, attributes={**kernel.attributes, "run_scope": scopes.current.id}))
                read_in_scope = True
                return True
            key, colon, value = text.partition(":")
            if not colon or columns is not None:
                return False
            figure, unit = _figure(value.strip(), f"{key.strip()}", self.path, number)
            name = _snake(key)
            measurements.append(
                Measurement(
                    "compile",
                    f"estimate.{name}",
                    float(figure),
                    "samples/s" if name.endswith("per_sec") else unit,
                    origin=f"{self.path}:{number}",
                    attributes={"text": value.strip(), "compile_hash": compile_hash, "run_scope": scopes.current.id},
                )
            )
            read_in_scope = True
            return True

        lines = read_file(self.path, feed, required=False)
        if not measurements and not partitions:
            raise ArtifactError.at(self.path, None, "no estimates found")
        attributes: dict[str, Any] = {"compile_report": {"compile_hash": compile_hash, "kernels": len(partitions)}}
        if len(scopes.all) > 1:
            # Several reports in one file: kernel IDs of each within its own scope, so
            # the same kernel of two reports stays two partitions.
            partitions = [replace(p, id=f"{p.attributes['run_scope']}/{p.id}") for p in partitions]
            attributes["compiles"] = [
                {
                    **scope,
                    "kernels": sum(1 for p in partitions if p.attributes["run_scope"] == scope["run_scope"]),
                    "estimates": sum(1 for m in measurements if m.attributes["run_scope"] == scope["run_scope"]),
                }
                for scope in scopes.as_attribute()
            ]
        notes = [
            CoverageNote(
                "static_cost",
                Coverage.RECOVERED if partitions else Coverage.PARTIAL,
                f"compiler estimates: overall and {len(partitions)} kernels"
                if partitions
                else "compiler estimates: overall only, no kernel table",
            )
        ]
        return Recovery(
            backend=BACKEND,
            sources=(source_artifact(self.path, self.format, lines=lines),),
            partitions=tuple(partitions),
            measurements=tuple(measurements),
            coverage=tuple(notes),
            attributes=attributes,
        )

    def kernel(
        self,
        number: int,
        columns: list[str],
        cells: list[str],
        seen: dict[str, int],
        compile_hash: str | None,
    ) -> RecoveredPartition:
        name = cells[0]
        estimates: dict[str, Any] = {}
        converted: dict[str, str] = {}  # the original text of percentages
        for column, cell in zip(columns[1:], cells[1:], strict=True):
            estimates[column] = _figure(cell, f"{name}: {column}", self.path, number)[0] if cell else None
            if cell.endswith("%"):
                converted[column] = cell
        repeat = seen.get(name, 0)
        seen[name] = repeat + 1
        return RecoveredPartition(
            id=kernel_partition_id(name, compile_hash) + (f"#{repeat}" if repeat else ""),
            kind="kernel",
            attributes={
                "name": name,
                **estimates,
                "text": converted,
                "compile_hash": compile_hash,
                "origin": f"{self.path}:{number}",
            },
        )


def kernel_partition_id(name: str, compile_hash: str | None) -> str:
    """The partition ID of the kernel a compile report row or a CIRH op's ``cs.kernel``
    names, within its compile: both readers use it, so a kernel's row and its ops meet
    in one partition (``cs_123/kernel/bert.pooler.dense.fc``)."""
    return f"{compile_hash}/kernel/{name}" if compile_hash else f"kernel/{name}"

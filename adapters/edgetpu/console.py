"""Reader for what ``edgetpu_compiler`` prints on stdout (its console summary).

One block per compiled model (several for a co-compilation, which shares the on-chip
parameter cache between models)::

    Input model: objects_on_road_processor/model/efficientdet-lite.tflite
    Input size: 4.25MiB
    Output model: co_compiled_model/efficientdet-lite_edgetpu.tflite
    Output size: 5.57MiB
    On-chip memory used for caching model parameters: 4.21MiB
    On-chip memory remaining for caching model parameters: 2.98MiB
    Off-chip memory used for streaming uncached model parameters: 0.00B
    Number of Edge TPU subgraphs: 1
    Total number of operations: 267
    Operation log: co_compiled_model/efficientdet-lite_edgetpu.log
    ...
    Number of operations that will run on Edge TPU: 264
    Number of operations that will run on CPU: 3

A block runs from its ``Input model:`` line to the next one. The TPU/CPU split is printed
only when some ops fall back to the CPU; a block without it keeps those counts None (the
``cpu_fallback_reported`` attribute says so) rather than inferring them. With
``--show_operations`` the operation table is printed inside the block as well; it is
read with the same row parser as the operation log.

What this reader returns (documented design):

* ``Measurement(kind="memory")``: ``on_chip_parameter_bytes`` (on-chip memory used for
  caching parameters), ``on_chip_parameter_bytes_remaining``, ``off_chip_parameter_bytes``
  (streamed uncached parameters), in bytes;
* ``Measurement(kind="metric")``: ``input_model_bytes``, ``output_model_bytes``,
  ``edgetpu_subgraphs``, ``operations_total``, ``operations_on_edgetpu``,
  ``operations_on_cpu``;
* ``Measurement(kind="compile", name="compile.total")`` for the whole run;

each per-model figure with ``attributes["model"]`` (the input model's stem),
``input_model``/``output_model`` paths and ``text`` (the figure as printed, e.g.
``"322.25KiB"``: the compiler rounds to two decimals, so a converted size is exact only
to that precision). ``Recovery.attributes["models"]`` holds the same figures as one
dict per model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.adapters.lines import (
    BLANK,
    DECORATION,
    Line,
    Rule,
    apply_rules,
    count,
    echo,
    finite,
    read_file,
)
from dfit_mlir.adapters.recovery import (
    ArtifactError,
    Coverage,
    CoverageNote,
    LineAccount,
    Measurement,
    Recovery,
    source_artifact,
)

from .oplog import _HEADER_RE, OperationRow, table_row

BACKEND = "edgetpu"

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1000, "MB": 1000**2, "GB": 1000**3}
_SIZE_RE = re.compile(r"^(?P<number>\d+(?:\.\d+)?) ?(?P<unit>[KMG]i?B|B)$")
_VERSION_RE = re.compile(r"^Edge TPU Compiler version (?P<version>\S+)")
_COMPILED_RE = re.compile(r"^Models? compiled successfully in (?P<ms>\d+(?:\.\d+)?) ms\.")
_TIMEOUT_RE = re.compile(r"^Started a compilation timeout timer of (?P<s>\d+) seconds\.")
_FIELD_RE = re.compile(r"^(?P<key>[A-Z][^:]*):(?P<value>.*)$")
_SUCCEEDED_RE = re.compile(r"^Compilation succeeded")
_FAILED_RE = re.compile(r"^Compilation failed")
#: What the compiler prints around the figures, carrying nothing the figures do not.
_DECORATION_RE = re.compile(
    r"^(?:See the operation log file for individual operation details\."
    r"|Model successfully compiled but not all operations are supported by the Edge TPU\."
    r"|Compilation child process completed within timeout period\."
    r"|Compiler version|Searching for valid delegate)"
)

#: Printed key -> (field of ConsoleModel, kind of value).
_FIELDS: dict[str, tuple[str, str]] = {
    "Input model": ("input_model", "path"),
    "Input size": ("input_bytes", "size"),
    "Output model": ("output_model", "path"),
    "Output size": ("output_bytes", "size"),
    "On-chip memory used for caching model parameters": ("on_chip_cached_bytes", "size"),
    "On-chip memory remaining for caching model parameters": ("on_chip_remaining_bytes", "size"),
    "Off-chip memory used for streaming uncached model parameters": ("off_chip_streamed_bytes", "size"),
    "Number of Edge TPU subgraphs": ("edgetpu_subgraphs", "count"),
    "Total number of operations": ("operations_total", "count"),
    "Number of operations that will run on Edge TPU": ("operations_on_edgetpu", "count"),
    "Number of operations that will run on CPU": ("operations_on_cpu", "count"),
    "Operation log": ("operation_log", "path"),
}

#: ConsoleModel field -> (measurement kind, measurement name, unit).
_MEASURED: dict[str, tuple[str, str, str | None]] = {
    "on_chip_cached_bytes": ("memory", "on_chip_parameter_bytes", "bytes"),
    "on_chip_remaining_bytes": ("memory", "on_chip_parameter_bytes_remaining", "bytes"),
    "off_chip_streamed_bytes": ("memory", "off_chip_parameter_bytes", "bytes"),
    "input_bytes": ("metric", "input_model_bytes", "bytes"),
    "output_bytes": ("metric", "output_model_bytes", "bytes"),
    "edgetpu_subgraphs": ("metric", "edgetpu_subgraphs", None),
    "operations_total": ("metric", "operations_total", "ops"),
    "operations_on_edgetpu": ("metric", "operations_on_edgetpu", "ops"),
    "operations_on_cpu": ("metric", "operations_on_cpu", "ops"),
}


def parse_size(text: str) -> int | None:
    """``"322.25KiB"`` -> 329984 bytes; None when ``text`` is not a size (or not a
    believable one: thousands of digits)."""
    match = _SIZE_RE.match(text.strip())
    if not match or len(match["number"]) > 30:
        return None
    return round(float(match["number"]) * _UNITS[match["unit"]])


@dataclass(frozen=True)
class ConsoleModel:
    """The figures of one block; None where the block does not print the figure."""

    #: Line of the block's ``Input model:``.
    line: int
    input_model: str | None = None
    output_model: str | None = None
    operation_log: str | None = None
    input_bytes: int | None = None
    output_bytes: int | None = None
    on_chip_cached_bytes: int | None = None
    on_chip_remaining_bytes: int | None = None
    off_chip_streamed_bytes: int | None = None
    edgetpu_subgraphs: int | None = None
    operations_total: int | None = None
    operations_on_edgetpu: int | None = None
    operations_on_cpu: int | None = None
    #: The rows of an operation table printed with ``--show_operations``.
    operations: tuple[OperationRow, ...] = ()
    #: Field -> the text as printed; field -> line it was read from.
    texts: Mapping[str, str] = field(default_factory=dict)
    lines: Mapping[str, int] = field(default_factory=dict)

    @property
    def model(self) -> str | None:
        """The input model's stem, the key the other readers use for a model."""
        return Path(self.input_model).stem if self.input_model else None

    def as_dict(self) -> dict[str, Any]:
        figures = {name: getattr(self, name) for name, _ in _FIELDS.values()}
        return {
            "model": self.model,
            **figures,
            "cpu_fallback_reported": self.operations_on_cpu is not None,
            "texts": dict(self.texts),
            "line": self.line,
            "operations": [(row.op_type, row.count, row.status) for row in self.operations],
        }


@dataclass(frozen=True)
class ConsoleSummary:
    path: Path
    compiler_version: str | None
    compile_time_s: float | None
    compile_timeout_s: int | None
    #: True / False from the closing line, None when the capture ends without one.
    succeeded: bool | None
    models: tuple[ConsoleModel, ...]
    compile_time_line: int | None = None
    lines: LineAccount | None = field(default=None, compare=False)


class ConsoleSummaryReader:
    """Captured ``edgetpu_compiler`` stdout -> per-model memory, subgraph and op figures."""

    format: ClassVar[str] = "edgetpu-console"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        text = head.decode("utf-8", "replace")
        return "Edge TPU Compiler version" in text and (
            "Input model:" in text or "compiled successfully" in text or "Compilation failed" in text
        )

    def summary(self) -> ConsoleSummary:
        state = _ConsoleState(self.path)
        account = read_file(self.path, state.feed)
        if state.version is None:
            raise ArtifactError.at(self.path, 1, "no 'Edge TPU Compiler version' line")
        models = tuple(
            ConsoleModel(**{**block, "operations": tuple(block["operations"])}) for block in state.blocks
        )
        return ConsoleSummary(
            self.path,
            state.version,
            state.compile_time,
            state.timeout,
            state.succeeded,
            models,
            state.compile_line,
            account,
        )

    def read(self) -> Recovery:
        return console_recovery(self.summary(), self.format)


def console_measurements(
    summary: ConsoleSummary, partitions: dict[int, str] | None = None
) -> tuple[Measurement, ...]:
    """The figures as measurements; ``partitions`` maps a block's index to the Edge TPU
    partition its figures belong to, when the reconstruction knows it."""
    measurements = []
    for position, model in enumerate(summary.models):
        for name, (kind, measured, unit) in _MEASURED.items():
            value = getattr(model, name)
            if value is None:
                continue
            measurements.append(
                Measurement(
                    kind=kind,
                    name=measured,
                    value=float(value),
                    unit=unit,
                    partition=(partitions or {}).get(position),
                    origin=f"{summary.path}:{model.lines[name]}",
                    attributes={
                        "model": model.model,
                        "input_model": model.input_model,
                        "output_model": model.output_model,
                        "text": model.texts[name],
                    },
                )
            )
    if summary.compile_time_s is not None:
        measurements.append(
            Measurement(
                kind="compile",
                name="compile.total",
                value=summary.compile_time_s,
                unit="s",
                duration_s=summary.compile_time_s,
                origin=f"{summary.path}:{summary.compile_time_line}",
                attributes={"models": [m.model for m in summary.models]},
            )
        )
    return tuple(measurements)


def console_attributes(summary: ConsoleSummary) -> dict[str, Any]:
    return {
        "compiler_version": summary.compiler_version,
        "compile_time_s": summary.compile_time_s,
        "compile_timeout_s": summary.compile_timeout_s,
        "compilation_succeeded": summary.succeeded,
        "co_compiled": len(summary.models) > 1,
        "models": [model.as_dict() for model in summary.models],
    }


def console_recovery(summary: ConsoleSummary, format: str = ConsoleSummaryReader.format) -> Recovery:
    return Recovery(
        backend=BACKEND,
        sources=(source_artifact(summary.path, format, lines=summary.lines),),
        measurements=console_measurements(summary),
        coverage=(
            CoverageNote(
                "memory",
                Coverage.PARTIAL,
                "on-chip cached / remaining and off-chip streamed parameter bytes per model "
                "(two-decimal precision as printed); activations are not reported",
            ),
            CoverageNote(
                "per_program_timing",
                Coverage.NOT_EXPOSED,
                "the summary times the compile only, not an inference",
            ),
        ),
        attributes=console_attributes(summary),
    )


class _ConsoleState:
    """The console's rules. A block of figures runs from its ``Input model:`` line to
    the next one; an operation table (``--show_operations``) runs from its header to
    the first line that is no row. Figures are facts of the compile (no time), but for
    ``Models compiled successfully in N ms``: an interval of N ms ending at the end of
    the compile, whose start the console does not give (``duration_s`` only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.version: str | None = None
        self.compile_time: float | None = None
        self.compile_line: int | None = None
        self.timeout: int | None = None
        self.succeeded: bool | None = None
        # One dict of ConsoleModel fields per block, frozen once the capture is read.
        self.blocks: list[dict[str, Any]] = []
        self.in_table = False

    def feed(self, line: Line) -> bool:
        if self.in_table:
            row = table_row(line.number, line.text)
            if row is not None:
                self.blocks[-1]["operations"].append(row)
                return True
            self.in_table = False  # the first line that is no row ends the table
        return apply_rules(_CONSOLE_RULES, self, Line(line.number, line.text.strip()))

    def version_line(self, found: re.Match[str], line: Line) -> None:
        self.version = found["version"]

    def compiled(self, found: re.Match[str], line: Line) -> None:
        self.compile_time = finite(found["ms"], "compile time", self.path, line.number) / 1000.0
        self.compile_line = line.number

    def timeout_line(self, found: re.Match[str], line: Line) -> None:
        self.timeout = count(found["s"], "compilation timeout", self.path, line.number)

    def outcome(self, succeeded: bool) -> None:
        self.succeeded = succeeded

    def table_header(self, found: re.Match[str], line: Line) -> bool:
        if not self.blocks:
            return False
        self.in_table = True
        return True

    def field_line(self, found: re.Match[str], line: Line) -> bool:
        key, value = found["key"], found["value"].strip()
        if key not in _FIELDS:
            return False
        if key == "Input model":
            self.blocks.append({"line": line.number, "operations": [], "texts": {}, "lines": {}})
        if not self.blocks:
            raise ArtifactError.at(self.path, line.number, f"{key!r} before any 'Input model:' line")
        name, kind = _FIELDS[key]
        parsed: int | str | None
        if kind == "size":
            parsed = parse_size(value)
            if parsed is None:
                raise ArtifactError.at(
                    self.path, line.number, f"{key}: {echo(value)} is not a size (e.g. 4.21MiB)"
                )
        elif kind == "count":
            parsed = count(value, key, self.path, line.number)
        else:
            parsed = value
        block = self.blocks[-1]
        block[name] = parsed
        block["texts"][name] = value
        block["lines"][name] = line.number
        return True


_CONSOLE_RULES: tuple[Rule, ...] = (
    Rule(_VERSION_RE, lambda s, f, line: s.version_line(f, line), "compiler version"),
    Rule(_COMPILED_RE, lambda s, f, line: s.compiled(f, line), "whole compile time, ms → s"),
    Rule(_TIMEOUT_RE, lambda s, f, line: s.timeout_line(f, line), "compile timeout, s"),
    Rule(_SUCCEEDED_RE, lambda s, f, line: s.outcome(True), "compile outcome"),
    Rule(_FAILED_RE, lambda s, f, line: s.outcome(False), "compile outcome"),
    Rule(_HEADER_RE, lambda s, f, line: s.table_header(f, line), "operation table header", DECORATION),
    Rule(_FIELD_RE, lambda s, f, line: s.field_line(f, line), "a figure of the current model block"),
    Rule(_DECORATION_RE, None, "advice and progress sentences", DECORATION),
    BLANK,
)

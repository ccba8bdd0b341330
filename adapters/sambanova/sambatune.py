"""SambaTune 1.1 console log → :class:`Recovery`.

SambaTune drives a compile / instrument / benchmark / report pipeline and narrates it:
``19-Sep 17:39:30 - Info - SUCCESS: <step>`` lines (``Error - FAILURE: <step>`` followed by
``Error - Message: <why>``), the ``*** Running command ***:`` it launches (``snconfig``,
``read_perf_counters``), the ``snconfig show Host`` table, one ``--> Compiling PEF ...``
block per compile (the baseline and one per ``--stage-instrumentation=...`` variant),
the runtime's ``sn_create_session: PEF File:`` lines, tracebacks, the reports it wrote
and ``Elapsed time: <s>``.

Step stamps carry day, month and time but no year; the year comes from the host table's
``Timestamp`` or a runtime line, and stays unknown (``start_s`` None) without either.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.adapters.lines import Continue, Line, echo, finite, read_file
from dfit_mlir.adapters.recovery import (
    ArtifactError,
    Coverage,
    CoverageNote,
    Measurement,
    Recovery,
    source_artifact,
)

from .compile_log import (
    BACKEND,
    CLOCK,
    LOG_ID,
    RUNTIME_LINE,
    ConsoleNoise,
    TracebackCollector,
    is_sambatune_head,
    pef_stem,
    wall_clock_s,
)

_STEP = re.compile(
    r"^(?P<day>\d{1,2})-(?P<month>[A-Z][a-z]{2}) (?P<time>\d\d:\d\d:\d\d) - "
    r"(?P<level>Info|Warning|Error) - (?P<text>.*)$"
)
_OUTCOME = re.compile(r"^(?P<outcome>SUCCESS|FAILURE): (?P<step>.*)$")
_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
        start=1,
    )
}
_INVOCATION = re.compile(r"(?:^|\$ )(?P<command>sambatune\s+(?P<config>\S+)(?P<options>.*))$")
_MODES = re.compile(r"--modes((?:\s+[a-z_]+)+)")
_ARTIFACT_ROOT = re.compile(r"--artifact-root\s+(?P<root>\S+)")
_RUNNING_COMMAND = "*** Running command ***:"
_COMPILING = "--> Compiling PEF ..."
_PEF_NAME = re.compile(r"--pef-name[= ](?P<name>\S+)")
_STAGE_INSTRUMENTATION = re.compile(r"--stage-instrumentation=(?P<stage>\S+)")
_READ_PERF = re.compile(r"read_perf_counters -p (?P<pef>\S+)")
_COUNTERS_SAVED = re.compile(r"^Instrumentation, DDR, PCIE counters saved to (?P<path>\S+)")
_HOST_TABLE = re.compile(r"^=+\s+Host Info\s+=+$")
_TABLE_ROW = re.compile(r"^(?P<key>\w+)\s+: (?P<value>.*)$")
_RUNNING_ON = re.compile(r"^SambaTune is running on (?P<platform>\w+)\.")
_YEAR_STAMP = re.compile(r"(?P<year>\d{4})-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
_ENVIRONMENT = re.compile(
    r"^(?P<action>Export|Unset) environment variable (?P<name>\w+)(?:=(?P<value>.*))?$"
)
_REPORT = re.compile(r"^(?:--> Wrote (?P<what>.+) to|See (?P<see>.+) in) (?P<path>\S+)\s*$")
_ELAPSED = re.compile(r"^Elapsed time: (?P<seconds>[^s\s]+)s\s*$")
_SNCONFIG_OUTPUT = re.compile(r"^Output JSON file: (?P<path>\S+)")
#: Lines in which SambaTune says it could not find or do something.
#: SambaTune narrating the pipeline whose steps its step lines record, and pointing at
#: its UI: decoration.
_NARRATION = re.compile(
    r"^(?:No plugins available at this time|Retrieving |Arguments preparation was finished"
    r"|Compilation was finished|Postprocessing was finished|Generating Web UI files|Web UI files generation"
    r"|To launch the Sambatune-UI|\$ sambatune_ui |Point your browser to|Reading performance counters"
    r"|--> \S+ instrumented and run successfully|bash \S+\.sh\s*$|\S+\.py: error: )"
)
#: ``[Info][SAMBA][Default] # Successfully tore down SambaRuntime context``: the runtime
#: tearing down a session; counted by message.
_BRACKETED_RUNTIME = re.compile(r"^\[\w+\]\[\w+\]\[\w+\] # (?P<message>.*)$")
_SHORTFALL = re.compile(
    r"^(?:Could not find|Cannot find|Error while|Getting .{0,200} FAILED|Instrumentation, Benchmarking"
    r"|Read file failed)"
)


@dataclass
class _Step:
    line: int
    day: int
    month: int
    time: str
    level: str
    text: str
    outcome: str | None = None
    name: str | None = None
    messages: list[str] = field(default_factory=list)
    #: The same step line read again right after this one (kept once, counted).
    repeats: int = 1

    def same(self, other: _Step) -> bool:
        return (self.day, self.month, self.time, self.level, self.text, self.messages) == (
            other.day, other.month, other.time, other.level, other.text, other.messages)


@dataclass
class _Compile:
    line: int
    command: str = ""
    after_step: int | None = None
    done_step: int | None = None


class SambaTuneLogReader:
    """The console output of one ``sambatune <config.yaml> --modes ...`` session."""

    format: ClassVar[str] = "sambatune-log"

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return (
            is_sambatune_head(head)
            or re.search(rb"(?m)(?:^|\$ )sambatune \S+\.ya?ml", head) is not None
        )

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> Recovery:
        return _SambaTuneParse(self.path).run()


class _SambaTuneParse:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.tracebacks = TracebackCollector()
        self.facts: dict[str, Any] = {}
        self.steps: list[_Step] = []
        self.compiles: list[_Compile] = []
        self.commands: list[dict[str, Any]] = []
        self.perf_reads: list[dict[str, Any]] = []
        self.sessions: list[Measurement] = []
        self.host: dict[str, str] = {}
        self.environment: list[str] = []
        self.reports: list[dict[str, str]] = []
        self.snconfig_outputs: list[str] = []
        self.shortfalls: Counter[str] = Counter()
        self.log_ids: list[str] = []
        self.measurements: list[Measurement] = []
        self.year: int | None = None
        self.expect: str | None = None
        self.in_host_table = False
        self.noise = ConsoleNoise()
        self.runtime_messages: dict[str, int] = {}

    def origin(self, number: int) -> str:
        return f"{self.path}:{number}"

    def run(self) -> Recovery:
        self.lines = read_file(self.path, lambda line: self.feed(line.number, line.text), required=False)
        return self.finish()

    def feed(self, number: int, line: str) -> bool | Continue:
        if self.tracebacks.feed(number, line):
            return True
        if self.expect is not None and line.strip():
            self.expected(number, line.strip())
            return True
        found = _STEP.match(line)
        if found is not None:
            return self.step(number, found)
        if self.in_host_table:
            row = _TABLE_ROW.match(line)
            if row is not None:
                self.host[row["key"]] = row["value"].strip()
                self.note_year(row["value"])
                return True
            if not line.strip() and self.host:
                self.in_host_table = False
        if line.strip() == _RUNNING_COMMAND:
            self.expect = "command"
        elif line.startswith(_COMPILING):
            self.compiles.append(
                _Compile(line=number, after_step=len(self.steps) - 1 if self.steps else None)
            )
            self.expect = "compile"
        elif _HOST_TABLE.match(line):
            self.in_host_table = True
        else:
            return self.other_line(number, line)
        return True

    def expected(self, number: int, command: str) -> None:
        """The line after ``*** Running command ***:`` or ``--> Compiling PEF ...``."""
        if self.expect == "compile":
            self.compiles[-1].command = command
        else:
            self.commands.append({"line": number, "command": command})
            read = _READ_PERF.search(command)
            if read is not None:
                self.perf_reads.append({"pef": read["pef"], "line": number})
        self.expect = None

    def step(self, number: int, found: re.Match[str]) -> bool:
        month = _MONTHS.get(found["month"])
        if month is None:
            return False
        step = _Step(number, int(found["day"]), month, found["time"], found["level"], found["text"])
        try:  # a day or time that is no date in any year: this line's problem
            datetime(2000, month, step.day, *(int(part) for part in step.time.split(":")), tzinfo=UTC)
        except ValueError:
            raise ArtifactError.at(self.path, number, f"step stamp {echo(found.group(0)[:30])} is no date") from None
        if self.steps and self.steps[-1].same(step):
            self.steps[-1].repeats += 1  # a line repeated: counted, not kept again
            return True
        outcome = _OUTCOME.match(found["text"])
        if outcome is not None:
            step.outcome, step.name = outcome["outcome"], outcome["step"].strip()
            self.steps.append(step)
            self.close_compile(len(self.steps) - 1)
        elif (
            found["text"].startswith("Message: ")
            and self.steps
            and self.steps[-1].outcome == "FAILURE"
        ):
            self.steps[-1].messages.append(found["text"].removeprefix("Message: "))
        else:
            self.steps.append(step)
        return True

    def close_compile(self, index: int) -> None:
        """``SUCCESS: Execute Compile <pef-name>`` ends the open compile block."""
        name = self.steps[index].name or ""
        for block in reversed(self.compiles):
            if block.done_step is None and name.startswith("Execute Compile"):
                block.done_step = index
                return

    def other_line(self, number: int, line: str) -> bool | Continue:
        found = _INVOCATION.search(line)
        if found is not None and "command" in self.facts:
            return True  # the same invocation echoed again
        if found is not None and "command" not in self.facts:
            self.facts["command"] = found["command"].strip()
            self.facts["config"] = found["config"]
            modes = _MODES.search(found["options"])
            if modes is not None:
                self.facts["modes"] = modes.group(1).split()
            root = _ARTIFACT_ROOT.search(found["options"])
            if root is not None:
                self.facts["artifact_root"] = root["root"]
            return True
        found = RUNTIME_LINE.match(line)
        if found is not None:
            self.runtime_line(number, found)
            return True
        found = LOG_ID.match(line)
        if found is not None:
            self.log_ids.append(f"[{found['user']}][{found['process']}][{found['pid']}]")
            return True
        found = _COUNTERS_SAVED.match(line)
        if found is not None:
            if self.perf_reads and "saved_to" not in self.perf_reads[-1]:
                self.perf_reads[-1]["saved_to"] = found["path"].rstrip(".")
            return True
        found = _RUNNING_ON.match(line)
        if found is not None:
            self.facts["platform"] = found["platform"]
            return True
        found = _ENVIRONMENT.match(line)
        if found is not None:
            value = (found["value"] or "").rstrip(",")
            self.environment.append(
                f"{found['action'].lower()} {found['name']}" + (f"={value}" if value else "")
            )
            return True
        found = _REPORT.match(line)
        if found is not None:
            self.reports.append({"what": found["what"] or found["see"], "path": found["path"]})
            return True
        found = _SNCONFIG_OUTPUT.match(line)
        if found is not None:
            self.snconfig_outputs.append(found["path"])
            return True
        found = _ELAPSED.match(line)
        if found is not None:
            seconds = finite(found["seconds"], "Elapsed time", self.path, number)
            self.measurements.append(
                Measurement(
                    kind="metric",
                    name="sambatune.elapsed_time",
                    value=seconds,
                    unit="s",
                    duration_s=seconds,
                    origin=self.origin(number),
                )
            )
            return True
        if _SHORTFALL.match(line):
            self.shortfalls[line.strip()] += 1
            return True
        if _NARRATION.match(line) is not None:
            return True
        found = _BRACKETED_RUNTIME.match(line)
        if found is not None:
            self.runtime_messages[found["message"]] = self.runtime_messages.get(found["message"], 0) + 1
            return True
        return self.noise.feed(Line(number, line))

    def runtime_line(self, number: int, found: re.Match[str]) -> None:
        self.note_year(found["stamp"])
        message = found["message"]
        pef = message.split("PEF File: ", 1)[1].strip() if "PEF File: " in message else None
        self.sessions.append(
            Measurement(
                kind="program",
                name=message.split(":", 1)[0],
                value=None,
                start_s=wall_clock_s(found["stamp"], self.path, number),
                origin=self.origin(number),
                attributes={
                    "pid": int(found["pid"]),
                    "component": found["component"],
                    "pef": pef,
                    "pef_name": pef_stem(pef) if pef else None,
                },
            )
        )

    def note_year(self, text: str) -> None:
        found = _YEAR_STAMP.search(text)
        if found is not None and self.year is None:
            self.year = int(found["year"])

    # -- the result ------------------------------------------------------------------

    def step_s(self, step: _Step) -> float | None:
        if self.year is None:
            return None
        hour, minute, second = (int(part) for part in step.time.split(":"))
        try:
            return datetime(self.year, step.month, step.day, hour, minute, second, tzinfo=UTC).timestamp()
        except ValueError:  # 29-Feb in a year that has none, a year 0 in the host table
            return None

    def compile_measurements(self) -> list[Measurement]:
        built: list[Measurement] = []
        for block in self.compiles:
            stage = _STAGE_INSTRUMENTATION.search(block.command)
            pef = _PEF_NAME.search(block.command)
            attributes: dict[str, Any] = {
                "pef_name": pef["name"] if pef else None,
                "stage_instrumentation": stage["stage"] if stage else None,
                "include_read_stall_cycles": "--include-read-stall-cycles" in block.command,
                "what": (
                    "SambaTune step stamp before the compile .. its 'Execute Compile' step "
                    "(1 s resolution)"
                ),
            }
            start = end = None
            if block.after_step is not None:
                start = self.step_s(self.steps[block.after_step])
            if block.done_step is not None:
                done = self.steps[block.done_step]
                end = self.step_s(done)
                attributes["status"] = done.outcome
            duration = end - start if start is not None and end is not None else None
            built.append(
                Measurement(
                    kind="compile",
                    name="compile.duration",
                    value=duration,
                    unit="s",
                    start_s=start,
                    duration_s=duration,
                    origin=self.origin(block.line),
                    attributes=attributes,
                )
            )
        return built

    def finish(self) -> Recovery:
        compiles = self.compile_measurements()
        failures = [
            {
                "step": s.name,
                "messages": s.messages,
                "line": s.line,
                "time": f"{s.day:02d}-{s.month:02d} {s.time}",
            }
            for s in self.steps
            if s.outcome == "FAILURE"
        ]
        stages = [
            m.attributes["stage_instrumentation"]
            + (" --include-read-stall-cycles" if m.attributes["include_read_stall_cycles"] else "")
            for m in compiles
            if m.attributes["stage_instrumentation"]
        ]
        attributes: dict[str, Any] = {
            **self.facts,
            "steps": [
                {"line": s.line, "level": s.level, "outcome": s.outcome, "step": s.name or s.text,
                 **({"repeats": s.repeats} if s.repeats > 1 else {})}
                for s in self.steps
            ],
            "failures": failures,
            "instrumentation_stages": stages,
            "pef_names": sorted(
                {m.attributes["pef_name"] for m in compiles if m.attributes["pef_name"]}
            ),
            "snprof_failed": any("snprof" in (f["step"] or "").lower() for f in failures),
            "clock": CLOCK,
        }
        for key, value in (
            ("host", self.host),
            ("commands", self.commands),
            ("perf_counter_reads", self.perf_reads),
            ("environment", self.environment),
            ("reports", self.reports),
            ("snconfig_outputs", self.snconfig_outputs),
            ("shortfalls", dict(self.shortfalls)),
            ("runtime_log_ids", self.log_ids),
            ("runtime_messages", self.runtime_messages),
            ("console", self.noise.facts),
            ("exceptions", [t.as_attribute() for t in self.tracebacks.done]),
        ):
            if value:
                attributes[key] = value
        notes = [
            CoverageNote(
                "per_partition_timing",
                Coverage.NOT_EXPOSED,
                f"{self.path}: SambaTune's stage-latency figures live in its report files "
                "(unified.json, collated_report.xlsx), not in the console log",
            )
        ]
        if attributes["snprof_failed"]:
            notes.append(
                CoverageNote(
                    "per_program_timing",
                    Coverage.NOT_EXPOSED,
                    f"{self.path}: snprof failed; no RDU timing",
                )
            )
        return Recovery(
            backend=BACKEND,
            sources=(source_artifact(self.path, SambaTuneLogReader.format, lines=self.lines),),
            measurements=tuple(compiles + self.sessions + self.measurements),
            coverage=tuple(notes),
            attributes=attributes,
        )

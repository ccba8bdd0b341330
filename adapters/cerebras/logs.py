"""The console / run log of a Cerebras appliance job (``run.log``, ``mytest.log``, the
``cszoo fit`` console), as the appliance client writes it.

Each record is ``YYYY-MM-DD HH:MM:SS,mmm LEVEL:   message``. Two styles are read: the
ALCF CS-2 appliance log of 2024 (``compile job id: wsjob-...``, the compiler's phase
records, gradient-accumulation trials) and the ``cszoo fit`` console of appliance
client 1.1.0, 2026 (``Job id: wsjob-..., workflow id: ...``, semantic versions, cached
compiles, Trainer Fit Summary, eval records). Lines without a timestamp are user
prints interleaved with the log: the GNN model zoo's per-window ``[Step=N] Wall=...``,
``[Profile] Avg ms/step | Load: ... | Residual(Dev): ...`` and ``[Throughput] Samples:
...`` lines (which show whether a job is bound by data loading) are read as figures of
the logging window they follow; ``[GraphCache] ...`` notes are kept as facts. Records
this reader has no rule for are unparsed lines in the line account; a record it has a
rule for but cannot read (a truncated step line, a figure that is not a finite number)
is a problem of that line, not an abort (see :mod:`dfit_mlir.adapters.lines`).

A file may hold several pasted runs: a run starts at a ``Current Working Directory``,
``Running command`` or ``Effective batch size is N.`` record when the current run has
already seen one; each run is a scope (``run_scope`` on every measurement, its job ids,
batch size and compile hash under ``attributes["runs"]``).

Timing semantics, per record type: step records are instants, and each also closes the
*interval* of its logging window (from the previous step record of the run, or from
``Beginning appliance run``); compile and execute phases are intervals between the
records that begin and end them; ``Processed N samples in S seconds`` is an interval of
S seconds that *starts where the steps it reports started* (the start of the run's
first step window), not one ending at the line that reports it; a checkpoint save runs
from ``Saving checkpoint`` to ``Saved checkpoint``.

Timestamps carry no zone; they are read as UTC (the cszoo logs' own Kubernetes events,
``Event 2026-01-30 12:50:03 +0000 UTC``, agree with their record times).
"""

from __future__ import annotations

import bisect
import calendar
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.adapters.lines import (
    DECORATION,
    Line,
    RecordSet,
    Rule,
    Scopes,
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
    Measurement,
    Recovery,
    source_artifact,
)

BACKEND = "cerebras"

_RECORD_RE = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d),(\d{3}) (DEBUG|INFO|WARNING|ERROR|CRITICAL):\s*(.*)$"
)
_RECORD_HEAD_RE = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?:INFO|WARNING|ERROR|DEBUG):", re.M)
#: Strings only a Cerebras appliance / cszoo log has near its start.
_HEAD_MARKERS = (
    b"wsjob-",
    b"wflow-",
    b"Cerebras",
    b"cszoo",
    b"Appliance client",
    b"Compile hash",
    b"Device=CSX",
    b"Effective batch size",
)

_HASH_RE = re.compile(r"\b(cs_\d+)\b")
_WSJOB_RE = re.compile(r"\b(wsjob-[a-z0-9]+)\b")
_WORKFLOW_RE = re.compile(r"\b(wflow-[a-z0-9]+)\b")
_VERSION_MARK = " semantic version: "
_VERSION_NUMBER_RE = re.compile(r"[0-9][\w.+-]*")
_STEP_RE = re.compile(r"^\| (?P<mode>Train|Eval) Device=(?P<device>\w+), (?P<fields>.*)$")
_FIELD_RE = re.compile(r"^(?P<key>\w+)(?P<op>[=<>])(?P<value>.*)$")
_PROCESSED_RE = re.compile(
    r"^Processed (?P<n>\d+) (?:(?P<what>\w+) )?sample\(s\) in (?P<s>[\d.eE+-]+) seconds\.?$"
)
_LOOP_RE = re.compile(r"^Starting (?P<name>\S+) loop (?P<i>\d+) of (?P<n>\d+), (?P<rest>.*)$")
_LOOP_RANGE_RE = re.compile(r"from global step (?P<first>\d+) to (?P<last>\d+) \((?P<steps>\d+) steps\)")
_LOOP_STEPS_RE = re.compile(r"with (?P<steps>\d+) steps")
_SUB_BATCH_RE = re.compile(r"^Gradient accumulation trying sub-batch size (\d+)")
_PER_BOX_RE = re.compile(r"per-box batch size (\d+) with (\d+) lanes")
_CHECKPOINT_SAVE_RE = re.compile(r"^Saving checkpoint at step (\d+)$")
_EVAL_METRIC_RE = re.compile(r"^-?\s*(?P<key>[\w./ -]+)[=:]\s*(?P<value>-?[\d.]+(?:[eE][+-]?\d+)?)$")

#: Top-level phases the compiler announces (level 0); each lasts until the next one or
#: the end of the compile.
COMPILE_PHASES = (
    "Pre-optimization transforms",
    "Optimizing layouts and memory usage",
    "Post-layout optimizations",
    "Allocating buffers",
    "Code generation",
    "Compiling image",
)
#: Passes of one layout exploration (level 2); a repeat of one within a gradient
#: accumulation trial starts the exploration at the chosen batch size, outside the trial.
EXPLORATION_PHASES = ("Exploring floorplans", "Exploring data layouts", "Optimizing memory usage")
#: Sub-phases of image compilation (level 1).
IMAGE_PHASES = ("Compiling kernels", "Compiling final image")
#: Execution staging, as (phase, message that starts it, message that ends it).
EXECUTE_PHASES = (
    ("Sending initial weights", "About to send initial weights", "Finished sending initial weights"),
    ("Device programming", "Waiting for device programming to complete", "Device programming is complete"),
    (
        "Input pipeline priming",
        "Waiting for input workers to prime the data pipeline",
        "Input workers have begun streaming input data",
    ),
    ("Appliance staging", "Finalizing appliance staging for the run", "Appliance staging is complete"),
)
_INGRESS_READY = ("Ingress is ready", "Poll ingress success")


def _seconds(match: re.Match[str]) -> float:
    year, month, day, hour, minute, second, millis = (int(match.group(i)) for i in range(1, 8))
    return calendar.timegm((year, month, day, hour, minute, second)) + millis / 1000


def _duration_text(text: str) -> float | None:
    """``0:13:19`` → 799.0 seconds."""
    parts = text.split(":")
    if not all(part.isdigit() and len(part) <= 9 for part in parts):
        return None
    total = 0
    for part in parts:
        total = total * 60 + int(part)
    return float(total)


@dataclass(frozen=True, slots=True)
class LogRecord:
    line: int
    time_s: float
    level: str
    message: str


def _versions(message: str) -> list[tuple[str, str]]:
    """``Appliance client semantic version: 1.1.0, cluster server semantic version: 1.1.2``
    → [("Appliance client", "1.1.0"), ("cluster server", "1.1.2")] (a str scan: linear
    on any line)."""
    found: list[tuple[str, str]] = []
    start = 0
    while (at := message.find(_VERSION_MARK, start)) >= 0:
        # Search back no further than the previous mark: linear over the whole line.
        who = message[max(message.rfind(",", start, at), message.rfind(":", start, at), start - 1) + 1 : at].strip()
        version = _VERSION_NUMBER_RE.match(message, at + len(_VERSION_MARK))
        if who and version is not None and who.replace(" ", "").isalpha():
            found.append((who, version.group(0)))
        start = at + len(_VERSION_MARK)
    return found


@dataclass
class _Phase:
    level: int
    name: str
    start_s: float
    line: int
    attributes: dict[str, Any]
    #: The same phase record read again right after (a line repeated): counted here.
    repeats: int = 1


@dataclass
class _Compile:
    start_s: float
    line: int
    job_id: str | None = None
    compile_hash: str | None = None
    cached: bool = False
    artifacts_written_s: float | None = None
    phases: list[_Phase] = field(default_factory=list)
    #: (time, level) of records that end phases without starting one.
    phase_ends: list[tuple[float, int]] = field(default_factory=list)
    trial: int | None = None
    trial_passes: set[str] = field(default_factory=set)
    attributes: dict[str, Any] = field(default_factory=dict)

    def add_phase(self, phase: _Phase) -> None:
        """A phase, or one more read of the last one when its record is repeated (same
        level, name, time, attributes): a log repeating a line is kept in the memory
        of one phase."""
        last = self.phases[-1] if self.phases else None
        if last is not None and (last.level, last.name, last.start_s, last.attributes) == (
                phase.level, phase.name, phase.start_s, phase.attributes):
            last.repeats += 1
        else:
            self.phases.append(phase)

    def end_phases(self, time_s: float, level: int) -> None:
        if not self.phase_ends or self.phase_ends[-1] != (time_s, level):
            self.phase_ends.append((time_s, level))


class ConsoleLogReader:
    """``*.log`` console / run log of an appliance job: compiles and their phases, jobs,
    per-step loss and rates, throughput totals, the Trainer Fit Summary, eval metrics."""

    format: ClassVar[str] = "cerebras-console-log"

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return _RECORD_HEAD_RE.search(head) is not None and any(marker in head for marker in _HEAD_MARKERS)

    def read(self) -> Recovery:
        return _LogParser(self.path).parse()


class _LogParser:
    def __init__(self, path: Path):
        self.path = path
        #: Each distinct figure once (a line repeated is counted, not kept again).
        self.measurements = RecordSet()
        self.attributes: dict[str, Any] = {
            "compile_hashes": [],
            "cached_compile_hashes": [],
            "jobs": [],
            "workflow_ids": [],
            "versions": {},
            "warnings": [],
        }
        self.compile: _Compile | None = None
        self.compile_hash: str | None = None  # of the latest successful compile: what runs next
        self.pending_job_kind: str | None = None
        self.waiting_jobs: dict[str, tuple[float, int, str]] = {}
        self.execute_job: str | None = None
        self.open_execute: dict[str, tuple[float, int]] = {}
        self.run_start_s: float | None = None
        self.last_step: dict[str, tuple[float, int]] = {}
        self.loop_first_step: dict[str, int] = {}
        self.checkpoint: tuple[float, int, int] | None = None
        self.fit_summary: dict[str, Any] | None = None
        self.in_fit_summary = False
        self.in_eval_metrics = False
        self.loops: list[dict[str, Any]] = []
        self.records = 0
        self.scopes = Scopes()
        self.last_time_s: float | None = None
        #: Start of the current run's first step window, and the window's last step.
        self.steps_start_s: float | None = None
        self.last_window_step: int | None = None
        self.user_prints: dict[str, list[str]] = {}
        #: "LEVEL: message" -> [position in attributes["warnings"], times read, last line].
        self.warning_repeats: dict[str, list[int]] = {}

    def origin(self, record: LogRecord) -> str:
        return f"{self.path}:{record.line}"

    def add(self, measurement: Measurement) -> None:
        """Every measurement carries its run scope."""
        self.measurements.add(self.scopes.tagged(measurement))

    def feed(self, line: Line) -> bool:
        match = _RECORD_RE.match(line.text)
        if match is None:
            return apply_rules(_PRINT_RULES, self, line)
        self.records += 1
        record = LogRecord(line.number, _seconds(match), match.group(8), match.group(9).rstrip())
        self.last_time_s = record.time_s
        return self.handle(record)

    def parse(self) -> Recovery:
        self.lines = read_file(self.path, self.feed, required=False)
        if self.records == 0:
            raise ArtifactError.at(self.path, None, "no timestamped log records")
        if self.compile is not None:
            self.finish_compile(None, "unfinished")
        self.attributes["runs"] = self.scopes.as_attribute()
        for at, times, last in self.warning_repeats.values():
            if times > 1:
                self.attributes["warnings"][at] += f" (read {times} times, the last at line {last})"
        if self.user_prints:
            self.attributes["user_prints"] = self.user_prints
        for attribute in ("compile_hashes", "cached_compile_hashes", "workflow_ids"):
            self.attributes[attribute] = list(dict.fromkeys(self.attributes[attribute]))
        if self.fit_summary is not None:
            self.attributes["fit_summary"] = self.fit_summary
        if self.loops:
            self.attributes["loops"] = self.loops
        self.attributes["timestamps"] = "read as UTC (the log carries no zone)"
        return Recovery(
            backend=BACKEND,
            sources=(source_artifact(self.path, ConsoleLogReader.format, lines=self.lines),),
            measurements=self.measurements.records(),
            coverage=self.coverage(),
            attributes=self.attributes,
        )

    def coverage(self) -> tuple[CoverageNote, ...]:
        kinds = {(m.kind, m.name) for m in self.measurements}
        notes = [
            CoverageNote(
                "per_op_timing",
                Coverage.NOT_EXPOSED,
                "the log times compiles, jobs and logging windows of steps, never an op",
            )
        ]
        if ("program", "train.steps") in kinds or ("program", "eval.steps") in kinds:
            notes.append(
                CoverageNote(
                    "per_program_timing",
                    Coverage.PARTIAL,
                    "per logging window of steps, from record timestamps (ms resolution)",
                )
            )
        if ("compile", "compile.phase") in kinds:
            notes.append(
                CoverageNote(
                    "compile_timing",
                    Coverage.RECOVERED,
                    "compile phases from the timestamps of the compiler's phase records",
                )
            )
        return tuple(notes)

    # -- records ---------------------------------------------------------------------

    def warn(self, record: LogRecord, message: str) -> None:
        """A warning, kept once however often it is repeated (its count and last line
        are added to it at the end)."""
        key = f"{record.level}: {message}"
        seen = self.warning_repeats.get(key)
        if seen is None:
            self.warning_repeats[key] = [len(self.attributes["warnings"]), 1, record.line]
            self.attributes["warnings"].append(f"{record.line}: {key}")
        else:
            seen[1] += 1
            seen[2] = record.line

    def handle(self, record: LogRecord) -> bool:
        """Whether the record was taken by a rule (a warning is always kept)."""
        message = record.message
        warned = record.level in ("WARNING", "ERROR", "CRITICAL")
        if warned:
            self.warn(record, message[:1000])
        if self.in_fit_summary:
            self.fit_summary_line(record)
            return True
        if self.in_eval_metrics:
            if self.eval_metric(record):
                return True
            self.in_eval_metrics = False
        if message.startswith("| "):
            return self.step(record) or warned
        if message.startswith("Processed "):
            self.processed(record)
        elif message == "Trainer Fit Summary":
            self.in_fit_summary = True
            self.fit_summary = {"lines": []}
        elif message.startswith("Compiling the model"):
            if self.compile is not None:
                self.finish_compile(record, "superseded")
            self.compile = _Compile(record.time_s, record.line)
        elif self.compile is not None and self.compile_record(record):
            pass
        elif self.job_record(record):
            pass
        elif self.execute_record(record):
            pass
        else:
            return self.run_facts(record) or apply_rules(_NARRATION, self, _as_line(record)) or warned
        return True

    def scope_fact(self, key: str, value: Any) -> None:
        """A fact of the current run that several records add to (its jobs, compiles)."""
        known = self.scopes.current.facts.setdefault(key, [])
        if value not in known:
            known.append(value)

    def run_start(self, record: LogRecord, fact: str, value: Any) -> None:
        """A fact every run states once: seen again, it starts the next pasted run."""
        scope = self.scopes.current if self.scopes.all else self.scopes.open(record.line)
        if fact in scope.facts:
            scope = self.scopes.open(record.line)
            self.compile_hash = self.execute_job = self.run_start_s = self.steps_start_s = None
            self.last_step.clear()
            self.loop_first_step.clear()
            self.checkpoint = None
        scope.facts[fact] = value
        self.attributes.setdefault(fact, value)

    def run_facts(self, record: LogRecord) -> bool:
        message = record.message
        versions = _versions(message)
        if versions:
            for who, version in versions:
                self.attributes["versions"][who.strip().lower()] = version
            return True
        if "initialized workflow with id" in message:
            self.attributes["workflow_ids"] += _WORKFLOW_RE.findall(message)
        elif message.startswith("Effective batch size is "):
            self.run_start(
                record, "effective_batch_size", _integer(self.path, record, r"^Effective batch size is (\d+)")
            )
        elif message.startswith("Running command: "):
            self.run_start(record, "command", message[len("Running command: ") :])
        elif message.startswith("Current Working Directory: "):
            self.run_start(record, "working_directory", message[len("Current Working Directory: ") :])
        elif message.startswith("Using network type: "):
            self.attributes["network_type"] = message[len("Using network type: ") :]
        elif message.startswith("Starting "):
            return self.loop(record)
        elif message.endswith("completed successfully!"):
            self.attributes.setdefault("completed", []).append(message)
            self.run_start_s = None
        elif message.startswith("Avg Eval Loss: "):
            self.metric(record, "eval.avg_loss", message.rsplit(" ", 1)[1], None)
        elif message == "Evaluation metrics:":
            self.in_eval_metrics = True
        else:
            match = _CHECKPOINT_SAVE_RE.match(message)
            if match:
                self.checkpoint = (record.time_s, record.line, count(match.group(1), "step", self.path, record.line))
            elif message.startswith("Saved checkpoint ") and self.checkpoint is not None:
                start_s, line, step = self.checkpoint
                self.checkpoint = None
                duration = round(record.time_s - start_s, 3)
                self.add(
                    Measurement(
                        "program",
                        "checkpoint.save",
                        duration,
                        "s",
                        start_s=start_s,
                        duration_s=duration,
                        step=step,
                        origin=f"{self.path}:{line}",
                        attributes={"file": message[len("Saved checkpoint ") :], "job_id": self.execute_job},
                    )
                )
            else:
                return False
        return True

    def loop(self, record: LogRecord) -> bool:
        match = _LOOP_RE.match(record.message)
        if match is None:
            return False
        loop: dict[str, Any] = {
            "name": match.group("name"),
            "index": int(match.group("i")),
            "of": int(match.group("n")),
            "line": record.line,
        }
        steps = _LOOP_RANGE_RE.search(match.group("rest"))
        if steps:
            loop.update(
                first_step=int(steps.group("first")),
                last_step=int(steps.group("last")),
                steps=int(steps.group("steps")),
            )
            self.loop_first_step["train"] = loop["first_step"]
        else:
            steps = _LOOP_STEPS_RE.search(match.group("rest"))
            if steps:
                loop["steps"] = int(steps.group("steps"))
        self.loops.append(loop)
        return True

    def fit_summary_line(self, record: LogRecord) -> None:
        assert self.fit_summary is not None
        text = record.message.strip()
        summary = self.fit_summary
        if text.startswith("====="):
            self.in_fit_summary = False
            return
        if not text or text.startswith("-----"):
            return
        summary["lines"].append(text)
        if match := re.match(r"^Trainer will run (\d+) train loops?", text):
            summary["train_loops"] = int(match.group(1))
        elif match := re.match(r"^\* (\d+) loops? of (\d+) steps", text):
            summary.setdefault("loop_steps", []).append(
                {"loops": int(match.group(1)), "steps": int(match.group(2))}
            )
        elif match := re.match(r"^for a total of (\d+) train steps", text):
            summary["total_train_steps"] = int(match.group(1))
        elif match := re.match(r"^Progress will be logged every (\d+) steps", text):
            summary["log_every_steps"] = int(match.group(1))
        elif text.startswith("* "):
            summary.setdefault("validation", []).append(text[2:])

    def eval_metric(self, record: LogRecord) -> bool:
        match = _EVAL_METRIC_RE.match(record.message.strip())
        if match is None:
            return False
        self.metric(record, f"eval.{match.group('key').strip()}", match.group("value"), None)
        return True

    def metric(self, record: LogRecord, name: str, value: str, unit: str | None, **extra: Any) -> None:
        number = finite(value, name, self.path, record.line)
        self.add(
            Measurement(
                "metric",
                name,
                number,
                unit,
                start_s=record.time_s,
                origin=self.origin(record),
                **extra,
            )
        )

    # -- compile -------------------------------------------------------------------

    def compile_record(self, record: LogRecord) -> bool:
        compile_ = self.compile
        assert compile_ is not None
        message = record.message
        text = message.rstrip(".").rstrip()
        if message.startswith("Found existing cached compile with hash"):
            compile_.cached = True
            compile_.compile_hash = _hash(self.path, record)
            self.attributes["cached_compile_hashes"].append(compile_.compile_hash)
        elif message.startswith("Compile artifacts successfully written"):
            compile_.compile_hash = _hash(self.path, record)
            compile_.artifacts_written_s = record.time_s
        elif message.startswith("Compile was successful"):
            self.finish_compile(record, "success")
        elif message.startswith("Compile failed") or (record.level == "ERROR" and "ompil" in message):
            self.finish_compile(record, "failed")
        elif text in COMPILE_PHASES:
            compile_.trial = None
            compile_.add_phase(_Phase(0, text, record.time_s, record.line, {}))
        elif text in IMAGE_PHASES:
            compile_.add_phase(_Phase(1, text, record.time_s, record.line, {}))
        elif match := _SUB_BATCH_RE.match(message):
            compile_.trial = int(match.group(1))
            compile_.trial_passes = set()
            compile_.add_phase(
                _Phase(1, text, record.time_s, record.line, {"sub_batch_size": compile_.trial})
            )
        elif text in EXPLORATION_PHASES:
            if compile_.trial is not None and text in compile_.trial_passes:
                compile_.end_phases(record.time_s, 1)
                compile_.trial = None
            attributes = {} if compile_.trial is None else {"sub_batch_size": compile_.trial}
            compile_.trial_passes.add(text)
            compile_.add_phase(_Phase(2, text, record.time_s, record.line, attributes))
        elif message.startswith("No benefit from gradient accumulation"):
            compile_.end_phases(record.time_s, 1)
            compile_.trial = None
            match = _PER_BOX_RE.search(message)
            if match:
                compile_.attributes.update(per_box_batch_size=int(match.group(1)), lanes=int(match.group(2)))
        elif message == "Gradient accumulation enabled":
            compile_.attributes["gradient_accumulation"] = True
        else:
            return False
        return True

    def finish_compile(self, record: LogRecord | None, status: str) -> None:
        compile_ = self.compile
        assert compile_ is not None
        self.compile = None
        end_s = record.time_s if record is not None else None
        phases_end = compile_.artifacts_written_s or end_s
        # A phase ends at the next record of its level or above (lower number), or
        # when the compile writes its artifacts.
        boundaries = [(p.start_s, p.level) for p in compile_.phases] + compile_.phase_ends
        ends = {level: sorted(t for t, other in boundaries if other <= level)
                for level in {p.level for p in compile_.phases}}
        for phase in compile_.phases:
            later = ends[phase.level]
            at = bisect.bisect_right(later, phase.start_s)  # the first boundary after its start
            end = later[at] if at < len(later) else phases_end
            if end is None or end < phase.start_s:
                end = None
            duration = None if end is None else round(end - phase.start_s, 3)
            self.add(
                Measurement(
                    "compile",
                    "compile.phase",
                    duration,
                    "s",
                    start_s=phase.start_s,
                    duration_s=duration,
                    origin=f"{self.path}:{phase.line}",
                    attributes={
                        "phase": phase.name,
                        "level": phase.level,
                        "compile_hash": compile_.compile_hash,
                        **phase.attributes,
                        **({"repeats": phase.repeats} if phase.repeats > 1 else {}),
                    },
                )
            )
        duration = None if end_s is None else round(end_s - compile_.start_s, 3)
        self.add(
            Measurement(
                "compile",
                "compile",
                duration,
                "s",
                start_s=compile_.start_s,
                duration_s=duration,
                origin=f"{self.path}:{compile_.line}",
                attributes={
                    "status": status,
                    "compile_hash": compile_.compile_hash,
                    "cached": compile_.cached,
                    "job_id": compile_.job_id,
                    **compile_.attributes,
                },
            )
        )
        if compile_.compile_hash is not None:
            self.attributes["compile_hashes"].append(compile_.compile_hash)
            self.scope_fact("compile_hashes", compile_.compile_hash)
            if status == "success":
                self.compile_hash = compile_.compile_hash

    # -- jobs and execution --------------------------------------------------------

    def job_record(self, record: LogRecord) -> bool:
        message = record.message
        if message.startswith("Initiating a new "):
            words = message.split()
            self.pending_job_kind = words[3] if len(words) > 3 else None  # compile / execute / image
            return True
        lowered = message.lower()
        if "job id: wsjob-" not in lowered:
            if any(message.startswith(ready) for ready in _INGRESS_READY):
                self.job_ready(record)
                return True
            return False
        job_id = _WSJOB_RE.search(message).group(1)  # type: ignore[union-attr]
        kind = lowered.split(" job id:", 1)[0] if not lowered.startswith("job id:") else self.pending_job_kind
        workflow = _WORKFLOW_RE.search(message)
        job: dict[str, Any] = {"id": job_id, "kind": kind, "line": record.line}
        if workflow:
            job["workflow_id"] = workflow.group(1)
            self.attributes["workflow_ids"].append(workflow.group(1))
        self.attributes["jobs"].append(job)
        self.scope_fact("job_ids", job_id)
        if kind == "compile" and self.compile is not None:
            self.compile.job_id = job_id
        elif kind == "execute":
            self.execute_job = job_id
        self.waiting_jobs[job_id] = (record.time_s, record.line, kind or "unknown")
        self.pending_job_kind = None
        return True

    def job_ready(self, record: LogRecord) -> None:
        """A job's wait for scheduling and ingress ends at its first 'ready' record."""
        if not self.waiting_jobs:
            return
        job_id, (start_s, line, kind) = next(reversed(self.waiting_jobs.items()))
        self.waiting_jobs.clear()
        self.add(
            Measurement(
                "queue",
                "wsjob.wait",
                round(record.time_s - start_s, 3),
                "s",
                start_s=start_s,
                duration_s=round(record.time_s - start_s, 3),
                origin=f"{self.path}:{line}",
                attributes={"job_id": job_id, "job_kind": kind},
            )
        )

    def execute_record(self, record: LogRecord) -> bool:
        message = record.message
        if message.startswith("Preparing to execute using "):
            self.attributes["num_csx"] = _integer(self.path, record, r"^Preparing to execute using (\d+) CSX")
            return True
        if message.startswith("Beginning appliance run"):
            self.run_start_s = record.time_s
            self.last_step.clear()
            return True
        for phase, begins, ends in EXECUTE_PHASES:
            if message.startswith(begins):
                self.open_execute[phase] = (record.time_s, record.line)
                return True
            if message.startswith(ends) and phase in self.open_execute:
                start_s, line = self.open_execute.pop(phase)
                duration = round(record.time_s - start_s, 3)
                self.add(
                    Measurement(
                        "program",
                        "execute.phase",
                        duration,
                        "s",
                        start_s=start_s,
                        duration_s=duration,
                        origin=f"{self.path}:{line}",
                        attributes={
                            "phase": phase,
                            "job_id": self.execute_job,
                            "compile_hash": self.compile_hash,
                        },
                    )
                )
                return True
        return False

    def step(self, record: LogRecord) -> bool:
        match = _STEP_RE.match(record.message)
        if match is None:
            return False  # another table-like record ("| ..."), not a step line
        mode = match.group("mode").lower()
        fields: dict[str, str] = {}
        for part in match.group("fields").split(", "):
            item = _FIELD_RE.match(part)
            if item is None:
                raise ArtifactError.at(self.path, record.line, f"unreadable field {echo(part)} in a step record")
            fields[item.group("key")] = (
                item.group("op") + item.group("value") if item.group("op") != "=" else item.group("value")
            )
        step_text = fields.get("Step", fields.get("GlobalStep"))
        if (
            step_text is None
            or not step_text.isdigit()
            or not {"Loss", "Rate", "GlobalRate"} <= fields.keys()
        ):
            raise ArtifactError.at(
                self.path, record.line, "step record without Step, Loss, Rate and GlobalRate"
            )
        step = count(step_text, "Step", self.path, record.line)
        common: dict[str, Any] = {
            "device": match.group("device"),
            "compile_hash": self.compile_hash,
            "job_id": self.execute_job,
        }
        if "Batch" in fields:
            common["batch"] = count(fields["Batch"], "Batch", self.path, record.line)
        for key in ("LoopTimeRemaining", "TimeRemaining"):
            if key in fields:
                text = fields[key].lstrip("=<>")
                common[key] = {"text": fields[key], "seconds": _duration_text(text)}
        self.metric(record, f"{mode}.loss", fields["Loss"], None, step=step, attributes=common)
        for key, name in (("Rate", "rate"), ("GlobalRate", "global_rate")):
            if key in fields:
                value, _, unit = fields[key].partition(" ")
                if unit != "samples/sec":
                    raise ArtifactError.at(self.path, record.line, f"{key}: unexpected unit {echo(unit)}")
                self.metric(record, f"{mode}.{name}", value, "samples/s", step=step, attributes=common)
        self.step_window(record, mode, step, common)
        self.last_window_step = step
        facts = self.scopes.current.facts
        facts[f"{mode}_steps"] = facts.get(f"{mode}_steps", 0) + 1
        return True

    def step_window(self, record: LogRecord, mode: str, step: int, common: dict[str, Any]) -> None:
        """Seconds per step over the window since the previous step record (or the start
        of the appliance run): the finest program timing the log allows."""
        counter = int(common["batch"]) if "batch" in common else step
        if mode in self.last_step:
            start_s, previous = self.last_step[mode]
        elif self.run_start_s is not None:
            start_s = self.run_start_s
            previous = 0 if mode == "eval" else self.loop_first_step.get("train", 1) - 1
        else:
            start_s, previous = None, None
        self.last_step[mode] = (record.time_s, counter)
        if start_s is None or previous is None or counter <= previous:
            return
        if mode == "train" and self.steps_start_s is None:
            self.steps_start_s = start_s
        duration = round(record.time_s - start_s, 3)
        steps = counter - previous
        self.add(
            Measurement(
                "program",
                f"{mode}.steps",
                duration / steps,
                "s/step",
                start_s=start_s,
                duration_s=duration,
                step=step,
                origin=self.origin(record),
                attributes={"first_step": previous + 1, "last_step": counter, "steps": steps, **common},
            )
        )

    def processed(self, record: LogRecord) -> None:
        """``Processed N samples in S seconds``: an interval of S seconds over the steps
        it reports, so it starts where the run's first step window started; only when
        the run logged no step window is it placed ending at its line (and says so)."""
        match = _PROCESSED_RE.match(record.message)
        if match is None:
            raise ArtifactError.at(
                self.path, record.line, "unreadable 'Processed N sample(s) in T seconds' record"
            )
        seconds = finite(match.group("s"), "seconds", self.path, record.line)
        samples = count(match.group("n"), "samples", self.path, record.line)
        if self.steps_start_s is not None:
            start_s, placed = self.steps_start_s, "from the start of the run's first step window"
        else:
            start_s, placed = record.time_s - seconds, "ending at the reporting line (no step window logged)"
        self.add(
            Measurement(
                "program",
                "processed_samples",
                float(samples),
                "samples",
                start_s=start_s,
                duration_s=seconds,
                origin=self.origin(record),
                attributes={"what": match.group("what"), "placed": placed, "last_step": self.last_window_step,
                            "job_id": self.execute_job, "compile_hash": self.compile_hash},
            )
        )

    # -- the user prints interleaved with the records (GNN model zoo) ----------------

    def user_step(self, found: re.Match[str], line: Line) -> None:
        """``[Step=0040] Wall=90.4672s | Loss=1.8380``: the training loop's own wall clock
        (seconds since it started) at that step; an instant, with no timestamp of its own."""
        step = count(found["step"], "Step", self.path, line.number)
        wall = finite(found["wall"], "Wall", self.path, line.number)
        loss = finite(found["loss"], "Loss", self.path, line.number)
        self.add(
            Measurement(
                "metric", "user.wall_clock", wall, "s", step=step, origin=f"{self.path}:{line.number}",
                attributes={"what": "the training loop's elapsed wall time at this step", "loss": loss},
            )
        )

    def profile(self, found: re.Match[str], line: Line) -> None:
        """``[Profile] Avg ms/step | Load: 3015.040 | Host_Submit(Fwd: 0.000, ...) |
        Residual(Dev): 0.532 | Iter_Wall: 0.532``: per-step averages (ms → s) over the
        logging window that ends at the step record before it."""
        for part in (piece.strip() for piece in found["fields"].split("|")):
            name, paren, rest = part.partition("(")
            if paren and ":" not in name:
                inside, _, after = rest.partition(")")
                if after.strip().startswith(":"):  # Residual(Dev): 0.532
                    items = [(f"{name}.{inside}", after.strip()[1:])]
                else:  # Host_Submit(Fwd: 0.000, Bwd: 0.000, Opt: 0.000)
                    items = [(f"{name}.{k.strip()}", v) for k, _, v in (i.partition(":") for i in inside.split(","))]
            else:
                key, colon, value = part.partition(":")
                if not colon:
                    raise ArtifactError.at(self.path, line.number, f"unreadable [Profile] field {echo(part)}")
                items = [(key, value)]
            for name, text in items:
                milliseconds = finite(text, f"[Profile] {name.strip()}", self.path, line.number)
                self.add(
                    Measurement(
                        "metric", f"profile.{name.strip().lower()}", milliseconds / 1000.0, "s/step",
                        step=self.last_window_step, origin=f"{self.path}:{line.number}",
                        attributes={"what": "average per step over the logging window (user profiler)",
                                    "text": f"{text.strip()} ms"},
                    )
                )

    def throughput(self, found: re.Match[str], line: Line) -> None:
        """``[Throughput] Samples: 1358.28 samples/s (1358.28)``: the user loop's rate at
        the step before it; the figure in parentheses is kept as printed."""
        value = finite(found["rate"], "[Throughput] Samples", self.path, line.number)
        self.add(
            Measurement(
                "metric", "user.throughput", value, "samples/s", step=self.last_window_step,
                origin=f"{self.path}:{line.number}",
                attributes={"what": "the training loop's own throughput print", "second_figure": found["other"]},
            )
        )

    def compilation_print(self, found: re.Match[str], line: Line) -> None:
        """``[Compilation] Step=1 finished. Duration=3.95s``: the loop's first (tracing)
        step; an interval of that duration whose start the print does not give."""
        seconds = finite(found["seconds"], "[Compilation] Duration", self.path, line.number)
        self.add(
            Measurement(
                "metric", "user.compilation_step", seconds, "s", duration_s=seconds,
                step=count(found["step"], "Step", self.path, line.number), origin=f"{self.path}:{line.number}",
                attributes={"what": "the training loop's tracing step, as it prints it"},
            )
        )

    def user_note(self, found: re.Match[str], line: Line) -> None:
        prints = self.user_prints.setdefault(found["who"], [])
        if not prints or prints[-1] != line.text[:500]:  # a print repeated is kept once
            prints.append(line.text[:500])


def _as_line(record: LogRecord) -> Line:
    return Line(record.line, record.message)


#: Untimestamped lines: the GNN model zoo's prints.
_PRINT_RULES: tuple[Rule, ...] = (
    Rule(
        re.compile(r"^\[Step=(?P<step>\d+)\] Wall=(?P<wall>[^s|\s]+)s \| Loss=(?P<loss>\S+)\s*$"),
        _LogParser.user_step,
        "training loop wall clock at a step (s) and its loss",
        "instant: at the step, no timestamp of its own",
    ),
    Rule(
        re.compile(r"^\[Profile\] Avg ms/step \|(?P<fields>.*)$"),
        _LogParser.profile,
        "per-step averages of data loading, host submit, device residual and iteration wall time (ms → s/step)",
        "interval: the logging window that ends at the step record before it",
    ),
    Rule(
        re.compile(r"^\[Throughput\] Samples: (?P<rate>\S+) samples/s(?: \((?P<other>[^)]*)\))?\s*$"),
        _LogParser.throughput,
        "the training loop's throughput (samples/s)",
        "instant: at the step record before it",
    ),
    Rule(
        re.compile(r"^\[Compilation\] Step=(?P<step>\d+) finished\. Duration=(?P<seconds>[^s\s]+)s"),
        _LogParser.compilation_print,
        "the training loop's tracing step (s)",
        "interval: its duration only (no start printed)",
    ),
    Rule(
        re.compile(r"^\[(?P<who>GraphCache|DataLoader|Dataset)\] "),
        _LogParser.user_note,
        "data-loader notes (kept as printed under attributes['user_prints'])",
    ),
)

#: Records that narrate what other records already time or state (decoration).
_NARRATION: tuple[Rule, ...] = (
    Rule(re.compile(r"^(?:[=-]{5,})?$"), None, "rule lines and empty records around summaries", DECORATION),
    Rule(
        re.compile(
            r"^(?:Checkpoint autoloading is enabled|No checkpoints were found|No checkpoint was provided"
            r"|Poll ingress status: |Recording the timestamp when jobs is scheduled"
            r"|User sidecar image build is disabled|Programming Cerebras Wafer Scale Cluster"
            r"|Ordinal \d+: |Compile artifacts will be|Constructing a|Loading|Creating"
            r"|Mounting|Uploading|Transferring|Initializing|Waiting for|Heartbeat"
            r"|Saving run metadata|Event \d{4}-\d\d-\d\d |Defaulted to use the \S+ namespace"
            r"|Custom worker image build is disabled)"
        ),
        None,
        "progress narration: the phases and jobs it announces are timed by the records that begin and end them",
        DECORATION,
    ),
)


def _integer(path: Path, record: LogRecord, pattern: str) -> int:
    match = re.match(pattern, record.message)
    if match is None:
        raise ArtifactError.at(path, record.line, f"unreadable record (expected {pattern!r})")
    return count(match.group(1), "count", path, record.line)


def _hash(path: Path, record: LogRecord) -> str:
    match = _HASH_RE.search(record.message)
    if match is None:
        raise ArtifactError.at(path, record.line, "compile record without a cs_<hash>")
    return match.group(1)

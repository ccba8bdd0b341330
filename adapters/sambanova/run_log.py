"""SambaFlow run (training / test) console output → :class:`Recovery`.

Styles the public logs show:

* the SN30 job-script run log of SambaFlow 1.17 (``RUN`` + the SLURM environment,
  ``RUN COMMAND: srun ... --pef=<pef>``, eight data-parallel tasks logging interleaved,
  one ``epoch:0|local_step:N|...|step_loss:...`` line per step behind a tqdm bar, the final
  ``{'e2e_train_time': ..., 'training_sequences_per_second': ...}`` dictionary, and the
  ``min_throughput`` AssertionError with the ``srun`` task exits);
* the 2021 SLURM output (``[INFO][SC][pid]: SambaConnector: PEF File: ...``, ``Log ID``
  lines, ``Test Accuracy: .. Loss: ..`` per task).

Tasks of a data-parallel run interleave their lines; a figure keeps the ``pid`` of the
task that logged it, and ``rank`` where the line says it (``Rank 0, PID n`` in 1.19).
Every task logs the app's milestones (``NLP app started.``, ``... app running in run
mode``, ``NLP app finished``) even where only one logs steps (the 1.17 BertLarge run:
task 0 alone), so each task's phases between them are its own timing figures.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.adapters.lines import (
    MAX_MAGNITUDE,
    Continue,
    Line,
    RecordSet,
    Scopes,
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

from .compile_log import (
    APP_LOG,
    BACKEND,
    CLOCK,
    LOG_ID,
    RUNTIME_LINE,
    ConsoleNoise,
    JobScriptHeader,
    TracebackCollector,
    is_job_script_head,
    is_sambatune_head,
    pef_stem,
    python_warning_echo,
    wall_clock_s,
)

#: ``Iteration:   5%|▍         | 124/2549 [01:50<34:20,  1.18it/s]`` (tqdm, before the log
#: line of the next step).
_TQDM = re.compile(
    r"^(?P<label>[\w ]+):\s+\d+%\|[^|]*\|\s*(?P<done>\d+)/(?P<total>\d+) "
    r"\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+), +(?P<rate>[^\]\s]+)\]"
)
_RATE = re.compile(r"^(?P<value>[\d.]+)(?P<unit>s/it|it/s)$")
_STEP_FIELD = re.compile(r"^(?P<key>\w+):(?P<value>\S*)$")
_RUN_COMMAND = re.compile(r"^RUN COMMAND: (?P<command>.*)$")
_PEF_ARGUMENT = re.compile(r"--pef[= ](?P<path>\S{1,4096})")
_SLURM_ENV = re.compile(r"^(?P<key>SLURM_\w+)=(?P<value>.*)$")
_PEF_LOAD = re.compile(r"^(?:SambaConnector|sn_create_session): PEF File: (?P<path>\S+)")
_TEST_RESULT = re.compile(r"^Test Accuracy: (?P<accuracy>\S+)\s+Loss: (?P<loss>\S+)\s*$")
_DISTRIBUTED = re.compile(r"^Distributed run: (?P<value>\w+)")
_USAGE_ERROR = re.compile(r"^(?P<program>\S+\.py): error: (?P<message>.*)$")
_SRUN_EXIT = re.compile(
    r"^srun: error: (?P<node>[^:]+): tasks? (?P<tasks>[\d,\-]+): (?P<status>.*)$"
)
_STEP_CANCELLED = re.compile(
    r"^slurmstepd: error: \*\*\* STEP (?P<step>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
)
_THROUGHPUT_CHECK = re.compile(
    r"at least (?P<expected>[\d.eE+]+), instead found (?P<found>[\d.eE+]+)"
)


def _tasks(text: str, path: Path, line: int) -> list[int]:
    """``1-2,4,6-7`` → [1, 2, 4, 6, 7] (srun's task list); at most 65536 tasks."""
    tasks: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        low = count(first, "srun task", path, line)
        high = count(last or first, "srun task", path, line)
        if high < low or high - low + len(tasks) > 65536:
            raise ArtifactError.at(path, line, f"srun task list {echo(text)} is not a believable list")
        tasks.extend(range(low, high + 1))
    return tasks


def _unit_of(key: str) -> str | None:
    """Units of the final throughput dictionary's keys, read from their names."""
    if key.endswith("_per_second"):
        return key.removesuffix("_per_second").rsplit("_", 1)[-1] + "/s"
    if key.endswith("_time"):
        return "s"
    return None


class SambaFlowRunLogReader:
    """The console output of one SambaFlow run (one or many data-parallel tasks)."""

    format: ClassVar[str] = "sambaflow-run-log"

    _MARKERS: ClassVar[tuple[bytes, ...]] = (
        b"SambaConnector: PEF File",
        b"RUN COMMAND:",
        b"|local_step:",
        b"training_samples_per_second",
        b"Test Accuracy:",
    )

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        if is_sambatune_head(head):
            return False
        return is_job_script_head(head) or any(marker in head for marker in cls._MARKERS)

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> Recovery:
        return _RunLogParse(self.path).run()


class _RunLogParse:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.header = JobScriptHeader()
        self.tracebacks = TracebackCollector()
        self.facts: dict[str, Any] = {}
        self.evidence = False
        self.slurm: dict[str, str] = {}
        #: Each distinct figure once (a line repeated is counted, not kept again).
        self.measurements = RecordSet()
        self.pids: set[int] = set()
        self.ranks: dict[int, int] = {}
        self.log_ids: list[str] = []
        self.pef_loads: list[dict[str, Any]] = []
        self.usage_errors: Counter[tuple[str, str]] = Counter()
        self.task_exits: dict[int, str] = {}
        self.distributed = 0
        self.test_results = 0
        self.steps = 0
        self.modes: set[str] = set()
        self.scopes = Scopes()
        self.noise = ConsoleNoise()
        self.redrawn_bars = 0
        #: Progress bars that could not be read (cut, pasted with an ellipsis): the step
        #: record after them is still read; the first one is kept as an example.
        self.unreadable_bars: list[tuple[int, str]] = []
        #: pid → (stamp, line) of its ``NLP app started.`` not yet closed by ``... running
        #: in <mode> mode`` (the setup phase) and by ``NLP app finished`` (the app phase).
        self.app_starts: dict[int, tuple[str, int]] = {}
        self.setup_open: set[int] = set()

    def origin(self, number: int) -> str:
        return f"{self.path}:{number}"

    def run(self) -> Recovery:
        self.lines = read_file(self.path, self.feed_line, required=False)
        return self.finish()

    def add(self, measurement: Measurement) -> None:
        """Every record carries the run it belongs to."""
        self.measurements.add(self.scopes.tagged(measurement))

    def feed_line(self, line: Line) -> bool | Continue:
        if line.overwritten and _TQDM.match(line.overwritten.rsplit("\r", 1)[-1]) is not None:
            self.redrawn_bars += 1
        return self.feed(line.number, line.text)

    def feed(self, number: int, line: str) -> bool | Continue:
        if self.tracebacks.feed(number, line):
            return True
        app = APP_LOG.search(line)
        if app is not None:
            self.app_line(number, line, app)
            return python_warning_echo(number, line, app)
        found = RUNTIME_LINE.match(line)
        if found is not None:
            self.runtime_line(number, found)
            return True
        found = LOG_ID.match(line)
        if found is not None:
            self.pids.add(int(found["pid"]))
            self.log_ids.append(f"[{found['user']}][{found['process']}][{found['pid']}]")
            self.facts.setdefault("runtime_log", found["log"])
            return True
        found = _SLURM_ENV.match(line)
        if found is not None:
            self.slurm[found["key"]] = found["value"]
            return True
        if self.header.feed(line):
            return True
        return self.other_line(number, line)

    def other_line(self, number: int, line: str) -> bool | Continue:
        found = _RUN_COMMAND.match(line)
        if found is not None:
            self.evidence = True
            command = found["command"].strip()
            scope = self.scopes.current if self.scopes.all else self.scopes.open(number)
            if "command" in scope.facts:  # a second pasted run
                scope = self.scopes.open(number)
            scope.facts["command"] = command
            self.facts["command"] = command
            pef = _PEF_ARGUMENT.search(found["command"])
            if pef is not None and pef["path"].endswith(".pef"):
                self.facts["pef_path"] = pef["path"]
                scope.facts["pef_path"] = pef["path"]
            return True
        found = _TEST_RESULT.match(line)
        if found is not None:
            self.test_result(number, found)
            return True
        found = _DISTRIBUTED.match(line)
        if found is not None:
            self.distributed += 1
            return True
        found = _USAGE_ERROR.match(line)
        if found is not None:
            self.usage_errors[(found["program"], found["message"])] += 1
            return True
        found = _SRUN_EXIT.match(line)
        if found is not None:
            for task in _tasks(found["tasks"], self.path, number):
                self.task_exits[task] = found["status"]
            return True
        found = _STEP_CANCELLED.match(line)
        if found is not None:
            self.facts["job_step_cancelled"] = {
                "step": found["step"],
                "node": found["node"],
                "at": found["at"],
            }
            return True
        found = _TQDM.match(line)
        if found is not None:
            return True  # a bar with no record after it: its figures come again on the next step line
        return self.noise.feed(Line(number, line))

    # -- app-logger lines: steps, the final dictionary ---------------------------------

    def app_line(self, number: int, line: str, app: re.Match[str]) -> None:
        pid = int(app["pid"] or app["rank_pid"])
        self.pids.add(pid)
        who: dict[str, Any] = {"pid": pid}
        if app["rank"] is not None:
            self.ranks[pid] = int(app["rank"])
            who["rank"] = int(app["rank"])
        message = app["message"].strip()
        if "running in run mode" in message:
            self.evidence = True
            self.modes.add("run")
        self.app_milestone(number, app["stamp"], message, who)
        if "|local_step:" in message:
            self.step(number, line[: app.start()], app["stamp"], message, who)
        elif message.startswith("{") and message.endswith("}"):
            self.summary(number, message, who)

    _PHASES: ClassVar[dict[str, str]] = {
        "setup": "'NLP app started' .. 'app running in <mode> mode' of this task: model build, dataset load",
        "app": "'NLP app started' .. 'NLP app finished' of this task: its whole run (setup, session, "
        "steps, teardown)",
    }

    def app_milestone(self, number: int, stamp: str, message: str, who: dict[str, Any]) -> None:
        """A task's phases between the app's milestone lines (``run.phase`` per task): the
        per-task timing a data-parallel log holds when only one task logs steps."""
        pid = who["pid"]
        if message.startswith("NLP app started"):
            self.app_starts[pid] = (stamp, number)
            self.setup_open.add(pid)
        elif re.search(r"app running in \w+ mode$", message) and pid in self.setup_open:
            self.setup_open.discard(pid)
            self.app_phase("setup", number, stamp, who)
        elif message.startswith("NLP app finished") and pid in self.app_starts:
            self.app_phase("app", number, stamp, who)
            del self.app_starts[pid]

    def app_phase(self, phase: str, number: int, stamp: str, who: dict[str, Any]) -> None:
        started, line = self.app_starts[who["pid"]]
        begin, end = wall_clock_s(started, self.path, line), wall_clock_s(stamp, self.path, number)
        if end < begin:  # lines pasted out of order: no span to state
            return
        self.add(
            Measurement(
                kind="program",
                name="run.phase",
                value=round(end - begin, 6),
                unit="s",
                start_s=begin,
                duration_s=round(end - begin, 6),
                origin=self.origin(line),
                attributes={**who, "phase": phase, "what": self._PHASES[phase], "end_line": number},
            )
        )

    def step(self, number: int, prefix: str, stamp: str, message: str, who: dict[str, Any]) -> None:
        """``epoch:0|local_step:125|...|step_loss:9.91058|...``; the tqdm bar in front of
        it reports the iterations done before this step."""
        self.evidence = True
        self.steps += 1
        fields: dict[str, float | int] = {}
        for item in message.split("|"):
            found = _STEP_FIELD.match(item)
            if found is None:
                raise ArtifactError.at(self.path, number, f"unreadable step field {echo(item)}")
            value = finite(found["value"], found["key"], self.path, number)
            fields[found["key"]] = int(value) if found["value"].lstrip("-").isdigit() else value
        if "local_step" not in fields:
            raise ArtifactError.at(self.path, number, "step line without local_step")
        step = int(fields.pop("local_step"))
        loss_key = "step_loss" if "step_loss" in fields else "loss"
        if loss_key not in fields:
            raise ArtifactError.at(self.path, number, "step line without a loss")
        loss = fields.pop(loss_key)
        self.add(
            Measurement(
                kind="metric",
                name="loss",
                value=loss,
                start_s=wall_clock_s(stamp, self.path, number),
                step=step,
                origin=self.origin(number),
                attributes={**who, **fields},
            )
        )
        self.tqdm(number, prefix, who)

    def tqdm(self, number: int, prefix: str, who: dict[str, Any]) -> None:
        """The bar in front of a step record: its smoothed rate. A bar that cannot be
        read (cut short, an ellipsis pasted in) loses only its own figure."""
        if not prefix.strip():
            return
        bar = _TQDM.match(prefix.strip())
        rate = None if bar is None or bar["rate"].startswith("?") else _RATE.match(bar["rate"])
        if bar is None or (rate is None and not bar["rate"].startswith("?")):
            self.unreadable_bars.append((number, echo(prefix.strip())))
            return
        if rate is None:
            return
        value = finite(rate["value"], "progress rate", self.path, number)
        seconds = value if rate["unit"] == "s/it" else (1.0 / value if value else None)
        self.add(
            Measurement(
                kind="metric",
                name="step_time",
                value=seconds,
                unit="s",
                step=int(bar["done"]),
                origin=self.origin(number),
                attributes={
                    **who,
                    "what": "tqdm's smoothed seconds per iteration after this many steps",
                    "text": bar["rate"],
                    "elapsed": bar["elapsed"],
                    "total_steps": int(bar["total"]),
                },
            )
        )

    def summary(self, number: int, message: str, who: dict[str, Any]) -> None:
        if len(message) > 65536:
            raise ArtifactError.at(self.path, number, f"summary dictionary of {len(message)} characters")
        try:
            figures = ast.literal_eval(message)
        except (ValueError, SyntaxError, RecursionError, MemoryError) as error:
            raise ArtifactError.at(
                self.path, number, f"unreadable summary dictionary: {type(error).__name__}: {error}"
            ) from None
        if not isinstance(figures, dict):
            return
        self.evidence = True
        for key, value in figures.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ArtifactError.at(
                    self.path, number, f"summary figure {echo(str(key))} is not a number: {echo(repr(value))}"
                )
            if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
                raise ArtifactError.at(self.path, number, f"summary figure {echo(str(key))} is not finite")
            self.add(
                Measurement(
                    kind="metric",
                    name=str(key),
                    value=float(value),
                    unit=_unit_of(str(key)),
                    origin=self.origin(number),
                    attributes={**who, "what": "run summary"},
                )
            )

    # -- runtime and 2021-era lines ---------------------------------------------------

    def runtime_line(self, number: int, found: re.Match[str]) -> None:
        pid = int(found["pid"])
        self.pids.add(pid)
        pef = _PEF_LOAD.match(found["message"])
        if pef is not None:
            self.evidence = True
            self.pef_loads.append(
                {
                    "pid": pid,
                    "pef": pef["path"],
                    "component": found["component"],
                    "at": found["stamp"],
                    "line": number,
                }
            )
            self.facts.setdefault("pef_path", pef["path"])

    def test_result(self, number: int, found: re.Match[str]) -> None:
        self.evidence = True
        report = {
            "report": self.test_results,
            "what": "one task's test pass (tasks print unlabelled)",
        }
        self.test_results += 1
        self.add(
            Measurement(
                kind="metric",
                name="test_accuracy",
                value=finite(found["accuracy"], "Test Accuracy", self.path, number),
                unit="%",
                origin=self.origin(number),
                attributes=report,
            )
        )
        self.add(
            Measurement(
                kind="metric",
                name="test_loss",
                value=finite(found["loss"], "test Loss", self.path, number),
                origin=self.origin(number),
                attributes=report,
            )
        )

    # -- the result ------------------------------------------------------------------

    def finish(self) -> Recovery:
        source = source_artifact(self.path, SambaFlowRunLogReader.format, lines=self.lines)
        if not self.evidence:
            return Recovery(
                backend=BACKEND,
                sources=(source,),
                coverage=(
                    CoverageNote(
                        "run", Coverage.NOT_EXPOSED, f"{self.path}: no run output in this log"
                    ),
                ),
            )
        attributes: dict[str, Any] = {**self.header.facts, **self.facts}
        if "pef_path" in attributes:
            attributes["pef_name"] = pef_stem(attributes["pef_path"])
        self.tasks(attributes)
        if self.log_ids:
            attributes["runtime_log_ids"] = self.log_ids
        if self.pef_loads:
            attributes["pef_loads"] = self.pef_loads
        if self.usage_errors:
            attributes["usage_errors"] = [
                {"program": program, "message": message, "count": count}
                for (program, message), count in self.usage_errors.items()
            ]
        if self.tracebacks.done:
            failure = self.tracebacks.done[-1]
            attributes["run_failure"] = failure.as_attribute()
            check = _THROUGHPUT_CHECK.search(failure.message or "")
            if failure.exception == "AssertionError" and check is not None:
                attributes["throughput_check"] = {
                    "expected_at_least": float(check["expected"]),
                    "found": float(check["found"]),
                    "passed": False,
                }
        if self.steps:
            attributes["logged_steps"] = self.steps
            attributes["clock"] = CLOCK
        if len(self.scopes.all) > 1:
            attributes["runs"] = self.scopes.as_attribute()
        if self.noise.facts:
            attributes["console"] = self.noise.facts
        if self.unreadable_bars:
            attributes["unreadable_progress_bars"] = {
                "count": len(self.unreadable_bars),
                "first": list(self.unreadable_bars[0]),
            }
        notes = [
            CoverageNote(
                "per_program_timing",
                Coverage.RECOVERED if self.steps else Coverage.PARTIAL,
                f"{self.path}: {self.steps} logged steps (loss, tqdm step time) and the run summary"
                if self.steps
                else f"{self.path}: run-level figures only (no per-step lines)",
            )
        ]
        return Recovery(
            backend=BACKEND,
            sources=(source,),
            measurements=self.measurements.records(),
            coverage=tuple(notes),
            attributes=attributes,
        )

    def tasks(self, attributes: dict[str, Any]) -> None:
        """How many tasks ran and what is known of each: SLURM says how many, srun says
        how each ended, the lines say which pids logged; pid → rank only where logged."""
        if self.slurm:
            attributes["slurm"] = dict(self.slurm)
        if "SLURM_NTASKS" in self.slurm:
            attributes["num_tasks"] = count(self.slurm["SLURM_NTASKS"], "SLURM_NTASKS", self.path, None)
            attributes["num_tasks_from"] = "SLURM_NTASKS"
        elif len(self.pef_loads) > 1:
            attributes["num_tasks"] = len({load["pid"] for load in self.pef_loads})
            attributes["num_tasks_from"] = "distinct pids loading the PEF"
        if self.pids:
            attributes["task_pids"] = sorted(self.pids)
        if self.ranks:
            attributes["ranks"] = {str(pid): rank for pid, rank in sorted(self.ranks.items())}
        if self.app_starts:
            # Started and never logged 'NLP app finished' (failed, killed, or the log is cut).
            attributes["tasks_unfinished"] = sorted(self.app_starts)
        if self.task_exits:
            attributes["task_exits"] = {
                str(task): status for task, status in sorted(self.task_exits.items())
            }
        if self.distributed:
            attributes["distributed_tasks_reported"] = self.distributed
        if self.modes:
            attributes["modes"] = sorted(self.modes)

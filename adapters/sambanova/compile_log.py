"""SambaFlow compile console output → :class:`Recovery`.

One reader for every style of compile output the public logs show:

* the SN30 job-script logs of SambaFlow 1.17 / 1.19 (``Model:`` / ``Machine State Before``
  header, ``COMPILE START AT``, ``[info    ]: ...`` compiler lines, rail partition
  compiles, Plasma modules, ``PEF file ... created``, ``COMPILE END AT``, ``Duration:``);
* the 2021 SLURM output (``[Info][SAMBA][Default] # ...``, ``[Warning][MAC][<Pass>] #``,
  ``Pef file ... created``, ``[info] Compilation succeeded.``);
* the 2023 console of a failed compile (``[warning] [samba]: The <op> operator is
  experimental.`` and a Python traceback into ``sambaflow.samba``).

The compiler never prints its graph. What it does print, and what this reader recovers:
partitions (``Compilation succeeded for partition_N_M_``), the Plasma compile units that
group them (``sections_A_B``), the graph-level "Amortized resources" estimates, operators
named in warnings (their names encode the PyTorch module path with ``__``), the
``NamedTensor`` shapes some warnings list, the operators rail names in a partition's
buffer contexts (which ties those operators to a partition), the PEF path, the compile
duration and, for a failed compile, the failure and the model-code line it points at.

The small console vocabulary every SambaFlow console reader shares (job-script header,
app-logger lines, runtime lines, ``Log ID`` lines, tracebacks, wall-clock stamps) lives
here too; :mod:`.run_log` and :mod:`.sambatune` import it.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from dfit_mlir.adapters.lines import (
    PROGRESS_BAR,
    Continue,
    Line,
    RecordSet,
    Scopes,
    balanced,
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
    RecoveredOperator,
    RecoveredPartition,
    Recovery,
    SourceLoc,
    ValueInfo,
    source_artifact,
)

BACKEND = "sambanova"

# --- console vocabulary shared by the SambaFlow console readers ------------------------

#: What the job scripts of the ALCF SN30 examples print first (``Model:  BertLarge``,
#: ``Date:``, ``Time:``, the ``apt list sambaflow`` line, ``Machine State Before:``).
#: Compile and run logs start alike, so this head only says "a SambaFlow job log".
_JOB_HEAD = re.compile(rb"\AModel:[ \t]+\S+.*?(?:Machine State Before|\nsambaflow/)", re.S)

#: ``2024-04-04 04:26:33,240 - <logger> - Process ID 2734725 - info     - <message>`` (1.17)
#: and ``... - Rank 0, PID 841013 - info     - ...`` (1.19). Searched, not matched: a tqdm
#: bar may precede it on the same line.
APP_LOG = re.compile(
    r"(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - (?P<logger>\S+) - "
    r"(?:Process ID (?P<pid>\d+)|Rank (?P<rank>\d+), PID (?P<rank_pid>\d+)) - "
    r"(?P<level>\w+)\s+- (?P<message>.*)$"
)

#: ``2021-9-13 19:44:17 : [INFO][SC][25140]: SambaConnector: PEF File: x.pef`` and
#: ``2022-09-19T17:45:38 : [INFO][LIB][31335]: sn_create_session: PEF File: x.pef``.
RUNTIME_LINE = re.compile(
    r"^(?P<stamp>\d{4}-\d{1,2}-\d{1,2}[ T]\d{1,2}:\d\d:\d\d) : "
    r"\[(?P<level>\w+)\]\[(?P<component>\w+)\]\[(?P<pid>\d+)\]: (?P<message>.*)$"
)

#: ``Log ID initialized to: [user][python][pid] at /var/log/sambaflow/runtime/sn.log``.
LOG_ID = re.compile(
    r"^Log ID initialized to: \[(?P<user>[^\]]*)\]\[(?P<process>[^\]]*)\]\[(?P<pid>\d+)\] "
    r"at (?P<log>\S+)"
)

_STAMP = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})[ T](\d{1,2}):(\d\d):(\d\d)(?:[,.](\d{1,6}))?")

#: How a stamp became ``start_s``: SambaFlow logs print local wall-clock time with no
#: zone, so the stamp is read as if it were UTC. Recorded in the recovery's attributes.
CLOCK = "log wall clock, no time zone logged: read as UTC"


def wall_clock_s(stamp: str, path: Path | str = "<log>", line: int | None = None) -> float:
    """Seconds since the epoch of a wall-clock stamp (see :data:`CLOCK`); a stamp that
    is no date (month 13, hour 25) raises :class:`ArtifactError` naming the line."""
    found = _STAMP.match(stamp)
    if found is None:
        raise ArtifactError.at(path, line, f"not a date-time stamp: {echo(stamp)}")
    year, month, day, hour, minute, second, fraction = found.groups()
    micro = int((fraction or "0").ljust(6, "0"))
    try:
        moment = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=UTC
        )
    except ValueError as error:
        raise ArtifactError.at(path, line, f"date-time stamp {echo(stamp)} is no date ({error})") from None
    return moment.timestamp()


def is_job_script_head(head: bytes) -> bool:
    return _JOB_HEAD.match(head) is not None


def is_sambatune_head(head: bytes) -> bool:
    """SambaTune's step lines (``19-Sep 17:39:30 - Info - SUCCESS: ...``): a SambaTune
    console also echoes runtime lines, which must not make it a compile or run log."""
    return (
        re.search(rb"(?m)^\d{1,2}-[A-Z][a-z]{2} \d\d:\d\d:\d\d - (?:Info|Warning|Error) - ", head)
        is not None
    )


def pef_stem(pef_path: str) -> str:
    """``/home/u/BertLarge/bertlrg//bertlrg.pef`` → ``bertlrg``: the name the compile gave
    the PEF (``--pef-name``), which is what a run log's ``--pef=`` path ends with."""
    return PurePosixPath(pef_path).name.removesuffix(".pef")


_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): ?(?P<message>.*)$")
#: A traceback's last line without a message (``KeyboardInterrupt``).
_BARE_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*\s*$")


@dataclass
class Traceback:
    """A Python traceback in a console log, frames outermost first."""

    first_line: int
    frames: list[dict[str, Any]] = field(default_factory=list)
    exception: str | None = None
    message: str | None = None
    last_line: int | None = None
    #: Unindented lines of other writers met inside it.
    interleaved: int = 0

    def as_attribute(self) -> dict[str, Any]:
        return {
            "exception": self.exception,
            "message": self.message,
            "lines": [self.first_line, self.last_line],
            "frames": [f"{f['file']}:{f['line']} in {f['function']}" for f in self.frames],
        }


class TracebackCollector:
    """Feeds lines to the traceback being read, if any. A traceback ends at its first
    unindented line, normally ``SomeError: message``."""

    def __init__(self) -> None:
        self.done: list[Traceback] = []
        self._open: Traceback | None = None

    def feed(self, number: int, line: str) -> bool:
        """True when the line belonged to a traceback."""
        if line.startswith("Traceback (most recent call last):"):
            self._open = Traceback(first_line=number)
            return True
        current = self._open
        if current is None:
            return False
        frame = _FRAME.match(line)
        if frame is not None:
            current.frames.append(
                {
                    "file": frame["file"],
                    "line": int(frame["line"]),
                    "function": frame["function"],
                    "code": None,
                }
            )
            return True
        if line.startswith(" "):
            if current.frames and current.frames[-1]["code"] is None:
                current.frames[-1]["code"] = line.strip()
            return True
        ending = _EXCEPTION.match(line)
        if ending is not None:
            current.exception, current.message = ending["type"], ending["message"]
        elif _BARE_EXCEPTION.match(line) is None and current.interleaved < 3:
            # Another process's line interleaved with the traceback (data-parallel
            # tasks write to one log): not the traceback's end, not its line.
            current.interleaved += 1
            return False
        else:
            current.message = line
        current.last_line = number
        self.done.append(current)
        self._open = None
        return True


class JobScriptHeader:
    """The lines the ALCF job scripts wrap around a compile or a run."""

    _MODEL = re.compile(r"^Model:\s+(?P<model>\S+)")
    _DATE = re.compile(r"^(?P<key>Date|Time):\s+(?P<value>\S+)")
    _PACKAGE = re.compile(r"^sambaflow/\S+ (?P<version>\d\S*) (?P<arch>\S+)")
    _PLATFORM = re.compile(r"^Platform: (?P<platform>\S.*)$")

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}

    def feed(self, line: str) -> bool:
        for pattern, key in ((self._MODEL, "model"), (self._PLATFORM, "platform")):
            found = pattern.match(line)
            if found is not None:
                self.facts.setdefault(key, found[key].strip())
                return True
        found = self._DATE.match(line)
        if found is not None:
            self.facts.setdefault(f"job_{found['key'].lower()}", found["value"])
            return True
        found = self._PACKAGE.match(line)
        if found is not None:
            self.facts.setdefault("sambaflow_version", found["version"])
            return True
        return False


def python_warning_echo(number: int, line: str, found: re.Match[str]) -> bool | Continue:
    """An app-logger ``py.warnings`` record is followed by the source line Python echoes
    (indented): taken with it."""
    if found["logger"] != "py.warnings":
        return True
    return Continue(
        Line(number, line), line, lambda joined: "\n" in joined, lambda joined, first: None,
        belongs=lambda follow: follow.text.startswith((" ", "\t")),
    )


class ConsoleNoise:
    """What SambaFlow job logs wrap around compiles and runs, read once for every
    SambaFlow console reader (each calls :meth:`feed` for the lines its own rules did not
    take). Facts kept (under ``attributes["console"]``): the machine's component
    inventory (how many, which are not present/online), the job's environment variable
    names, Python warnings by category, framework versions, framework log lines, job-script
    shell errors. Decoration (consumed, carries nothing): banners and section titles, the
    ``apt`` banner, progress bars with no record after them (downloads), the source
    locations rail prints under its warnings, transformers' weight-initialisation notices,
    an argparse ``usage:`` line (its ``error:`` line is read by the run reader)."""

    _INVENTORY_ROW = re.compile(
        r"^(?P<component>/NODE/[^\s|]+)\s*\|(?P<serial>[^|]*)\|(?P<state>[^|]*)\|(?P<function>.*)$"
    )
    _ENVIRONMENT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=")
    _PY_WARNING = re.compile(r"^\S+:\d+: (?P<category>[A-Z]\w*): ")
    _FRAMEWORK = re.compile(r"^(?P<framework>PyTorch|TensorFlow) version (?P<version>\S+) available\.")
    _FRAMEWORK_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+\] ")
    _SHELL_ERROR = re.compile(r"^/\S+: \d+: (?P<message>.*)$")
    _DECORATION = re.compile(
        r"^(?:Physical Inventory:|Component Name\s+\||WARNING: apt does not have a stable CLI interface"
        r"|Listing\.\.\.|Machine [Ss]tate (?:Before|After):|RUN\s*$|=+ .* =+\s*$|[=*#-]{3,}\s*$|\+ "
        r"|(?:ctx|pmu|tbuffer): \S+ \S+:\d+:\d+|(?:/|\.\./)\S+\.(?:cpp|cc|h|hpp):\d+:\d+\s*$"
        r"|Some weights of |You should probably TRAIN|- This IS (?:NOT )?expected if"
        r"|To enable them in other operations, rebuild TensorFlow|import blocksparse tasks from "
        r"|usage: \S+ \[-h\]|srun: (?:Terminating job step|Force Terminated job step|Job step aborted))"
    )

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}

    def feed(self, line: Line) -> bool | Continue:
        text = line.text
        if not text.strip():
            return True
        found = self._INVENTORY_ROW.match(text)
        if found is not None:
            inventory = self.facts.setdefault("machine_inventory", {"components": 0, "not_online": []})
            inventory["components"] += 1
            state, function = found["state"].strip(), found["function"].strip()
            if (state, function) != ("Present", "Online") and len(inventory["not_online"]) < 50:
                inventory["not_online"].append([found["component"], state, function])
            return True
        if self._DECORATION.match(text) is not None or PROGRESS_BAR.match(text.strip()) is not None:
            return True
        found = self._PY_WARNING.match(text)
        if found is not None:
            warnings = self.facts.setdefault("python_warnings", {})
            warnings[found["category"]] = warnings.get(found["category"], 0) + 1
            # The message may go on over one line and Python echoes the source line
            # (indented) after it.
            return Continue(
                line, text, lambda joined: joined.count("\n") >= 3, lambda joined, first: None, belongs=_warning_tail
            )
        found = self._FRAMEWORK.match(text)
        if found is not None:
            self.facts.setdefault("framework_versions", {})[found["framework"]] = found["version"]
            return True
        if self._FRAMEWORK_LOG.match(text) is not None:
            self.facts["framework_log_lines"] = self.facts.get("framework_log_lines", 0) + 1
            return True
        found = self._ENVIRONMENT.match(text)
        if found is not None:
            names = self.facts.setdefault("environment_variables", [])
            if len(names) < 500:
                names.append(found["name"])
            return True
        found = self._SHELL_ERROR.match(text)
        if found is not None:
            self.facts.setdefault("job_script_errors", []).append(f"{line.number}: {found['message'][:300]}")
            return True
        return False


def _warning_tail(line: Line) -> bool:
    """A line that continues a Python warning: the source line Python echoes (indented),
    or NumPy's second message line (``Deprecated in NumPy 1.20; for more details ...``)."""
    return line.text.startswith((" ", "\t")) or _NUMPY_TAIL.match(line.text) is not None


_NUMPY_TAIL = re.compile(r"^Deprecated in NumPy \S+; for more details")


# --- the compile log -------------------------------------------------------------------

#: ``[info    ]: msg`` / ``[warning ]: msg`` / ``[info    ] : PEF file ...`` (1.17, 1.19),
#: ``[info    ] PEF file ...`` / ``[info] Compilation succeeded.`` (2021).
_LEVELLED = re.compile(r"^\[(?P<level>info|warning|error|debug)\s*\]\s*:?\s(?P<message>.*)$")
#: ``[Info][SAMBA][Default] # msg`` / ``[Warning][MAC][ReduceCatFaninPass] # msg`` (2021).
_BRACKETED = re.compile(
    r"^\[(?P<level>Info|Warning|Error)\]\[(?P<component>\w+)\]\[(?P<scope>\w+)\] # (?P<message>.*)$"
)
#: ``[warning] [samba]: msg`` (2023).
_COMPONENT = re.compile(r"^\[(?P<level>\w+)\] \[(?P<component>\w+)\]: (?P<message>.*)$")

_SCRIPT_MARK = re.compile(r"^COMPILE (?P<which>START|END) AT (?P<value>\S+)\s*$")
_SCRIPT_DURATION = re.compile(r"^Duration:\s+(?P<value>\S+)\s*$")
_COMMAND = re.compile(r"^COMPILE COMMAND: (?P<command>.*)$")
_SHELL_PROMPT = re.compile(r"^\(\S+\) (?P<user>[^@\s]+)@(?P<host>[^:\s]+):\S*\$ (?P<command>.+)$")
_SUBMITTED = re.compile(r"^Submitted batch job (?P<job>\d+)")
_PEF_CREATED = re.compile(r"(?i)^(?:\[PLASMA\] )?pef file (?P<path>\S+) created")
_NAMESPACE_START = "args: Namespace("
_NAMESPACE = re.compile(r"^args: Namespace\((?P<args>.*)\)\s*$", re.S)
_NAMESPACE_ITEM = re.compile(r"\b(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,]*)")

_AMORTIZED = re.compile(r"^Amortized resources (?P<scope>\S+): (?P<figures>.*)$")
_AMORTIZED_FIGURES = re.compile(
    r"^(?P<pcus>\S+) PCUs, (?P<pmus>\S+) PMUs, projected latency: (?P<latency>\S+) (?P<latency_unit>\w+), "
    r"FLOPS: (?P<flops>\S+) (?P<flops_unit>\w+/s), DDR_BW: (?P<ddr>\S+) (?P<ddr_unit>\w+/s)\s*$"
)
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_FLOP_RATE = {"T/s": 1e12, "G/s": 1e9, "M/s": 1e6, "P/s": 1e15}
_BYTE_RATE = {"GB/s": 1e9, "MB/s": 1e6, "TB/s": 1e12, "KB/s": 1e3, "B/s": 1.0}

_SQUEEZE = re.compile(r"^Try to squeeze a unsqueezable dim (?P<dim>\S+) for op (?P<op>\S+)\s*$")
_NAMED_TENSORS = re.compile(r"^ (?P<side>inputs|outputs): \{(?P<body>.*)\}\s*$")
_NAMED_TENSOR = re.compile(r"NamedTensor: shape \{(?P<shape>[^}]*)\} names: \{(?P<names>[^}]*)\}")
_DIMENSION_MAPPING = re.compile(r'^DimensionMapping for %(?P<ssa>\d+) = "(?P<op>[\w.]+)"')
_TENSOR_TYPE = re.compile(r"tensor<(?P<body>[^>]*)>")

_SECTION_BOUNDARY = re.compile(r"^section boundary name: (?P<name>\S+)")
_GRAPH = re.compile(r"^Mapping for graph/function: (?P<graph>\S+)")
_PLASMA_START = re.compile(r"^Starting Plasma compile at (?P<dir>\S+)")
_PLASMA_PASS = re.compile(r"^\[PASS\] Running PlasmaIR\d+_(?P<name>\w+)")
_PLASMA_DONE = re.compile(r"^Plasma compile (?P<status>succeeded|failed)")
_SECTIONS_MODULE = re.compile(r"^sections_(?P<first>\d+)_(?P<last>\d+)$")
_RAIL_LOGS = re.compile(
    r"^Logs are generated in (?P<dir>\S+) for (?P<partition>partition_\d+_\d+_?)\.?\s*$"
)
_PARTITION_DONE = re.compile(
    r"^Compilation (?P<status>succeeded|failed) for (?P<partition>partition_\d+_\d+_?)"
)
_PARTITION_NAME = re.compile(r"^partition_(?P<index>\d+)_(?P<sub>\d+)_?$")
#: A rail buffer context named after the operator it serves:
#: ``partition_9_0_.HfTransformerSamba.partition_9_0_.naming_group_27_<op name>.tbuf...``.
_CONTEXT_OP = re.compile(
    r"(?P<partition>partition_\d+_\d+_)\.(?:(?!naming_group_)[A-Za-z]\w{0,200}\.){0,16}"
    r"naming_group_(?P<group>\d+)_(?P<name>\w+)"
)
_MILESTONE = re.compile(
    r"^(?P<what>(?:Mac )?Compilation|Lowering to TLIR) (?P<status>succeeded|failed)\.\s*$"
)
_EXPERIMENTAL = re.compile(r"^The (?P<op>\w+) operator is experimental\.")
_PLACING_LOGS = re.compile(r"^Placing log files in (?P<path>\S+)")
#: Compiler narration with nothing to record (the 2021 console's PLASMA launch line,
#: its pass iteration counts): decoration.
_COMPILER_NOTES = re.compile(
    r"^(?:\[(?:info|Info)\s*\] (?:\[PLASMA\] Launching|Run A Round of|We run \d+ iterations)"
    r"|\}\s*$)"  # the end of an op a warning printed over several lines
)


def partition_id(vendor_name: str) -> str:
    """``partition_7_0_`` → ``partition_7_0`` (the trailing underscore is SambaFlow's
    separator, not part of the name)."""
    return vendor_name.rstrip("_")


def split_operator_name(name: str) -> tuple[tuple[str, ...], str, str]:
    """(module path, op-local name, op type) of a SambaFlow operator name.

    SambaFlow joins the PyTorch module path and the op with ``__``
    (``bertformaskedlm__bert__encoder__layer__3__attention__self__key__linear_t_output0``).
    The op segment is the last one that starts with a letter: segments after it start
    with a digit and number the op's own shards (``decoder__linear__gemm__0_bwd_weight``),
    while a digit segment *before* it is a ModuleList index (``layer__3``). The op type
    is the op segment's leading word (``linear``, ``tanh``, ``crossentropyloss``)."""
    parts = name.split("__")
    lettered = [i for i, part in enumerate(parts) if part[:1].isalpha()]
    at = lettered[-1] if lettered else len(parts) - 1
    word = re.match(r"[A-Za-z]+", parts[at])
    op_type = word.group(0) if word else parts[at]
    return tuple(parts[:at]), "__".join(parts[at:]), op_type


def phase_of(name: str) -> str:
    """SambaFlow names the gradient ops of ``x`` ``x_bwd``, ``x_bwd_loss``, ``x_bwd_weight``."""
    return "backward" if "_bwd" in name else "forward"


def _tensor_type(body: str) -> ValueInfo:
    """``1024x128xbf16`` → ValueInfo(shape=(1024, 128), dtype="bf16")."""
    *dims, dtype = body.split("x")
    shape = tuple(int(d) if d.isdigit() else None for d in dims)
    return ValueInfo(name=None, shape=shape, dtype=dtype)


@dataclass
class _Operator:
    """An operator as the log names it, before IDs are assigned."""

    name: str | None
    op_type: str
    first_line: int
    scope: str = "graph"
    #: The compile of the file it belongs to (``compile0``, ``compile1``, ...).
    run_scope: str = "compile0"
    partition: str | None = None
    inputs: list[ValueInfo] = field(default_factory=list)
    outputs: list[ValueInfo] = field(default_factory=list)
    dim_names: dict[str, list[list[str]]] = field(default_factory=dict)
    status: str | None = None
    source: SourceLoc | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Partition:
    name: str
    #: N of ``partition_N_M_``.
    index: int
    first_line: int
    run_scope: str = "compile0"
    status: str | None = None
    log_dir: str | None = None
    rail_warnings: int = 0
    naming_groups: set[int] = field(default_factory=set)


class SambaFlowCompileLogReader:
    """The console output of one SambaFlow compile (any of the styles above)."""

    format: ClassVar[str] = "sambaflow-compile-log"

    _MARKERS: ClassVar[tuple[bytes, ...]] = (
        b"COMPILE COMMAND:",
        b"COMPILE START AT",
        b"[Info][SAMBA][",
        b"[Info][MAC][",
        b"] [samba]: ",
        b"Compilation succeeded for partition_",
    )

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        if is_sambatune_head(head):
            return False
        if is_job_script_head(head):
            return True
        return (
            any(marker in head for marker in cls._MARKERS)
            or re.search(rb"(?m)^\[(?:info|warning) +\]: ", head) is not None
        )

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> Recovery:
        return _CompileLogParse(self.path).run()


class _CompileLogParse:
    """One pass over a compile log; ``run`` returns the Recovery."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header = JobScriptHeader()
        self.tracebacks = TracebackCollector()
        self.facts: dict[str, Any] = {}
        self.evidence = False
        #: Keyed by (compile scope, operator name): two compiles pasted into one file
        #: name the same operators, which stay two operators.
        self.operators: dict[tuple[str, str], _Operator] = {}
        self.unnamed: list[_Operator] = []
        #: Keyed by (compile scope, partition ID), as operators.
        self.partitions: dict[tuple[str, str], _Partition] = {}
        self.current_partition: _Partition | None = None
        self.squeezed: _Operator | None = None
        self.plasma_modules: list[dict[str, Any]] = []
        self.section_boundaries: list[str] = []
        self.milestones: list[str] = []
        self.experimental: list[str] = []
        self.messages: Counter[str] = Counter()
        self.warning_lines = 0
        self.log_files: list[str] = []
        self.log_ids: list[str] = []
        #: (stamp, pid, message, line, compile scope).
        self.app_stamps: list[tuple[str, int, str, int, str]] = []
        #: Each distinct figure once (a line repeated is counted, not kept again); a
        #: tuple of them once the compile is finished.
        self.measurements: RecordSet | tuple[Measurement, ...] = RecordSet()
        #: (compile scope, START|END) → (job-script seconds, line).
        self.script_marks: dict[tuple[str, str], tuple[int, int]] = {}
        #: The job-script header of each compile (a pasted second job log has its own
        #: model, date and SambaFlow version).
        self.scope_headers: dict[str, JobScriptHeader] = {}
        self.scopes = Scopes("compile")
        self.noise = ConsoleNoise()
        self.pef_written_in_scope = False
        #: Lines of the job script around the compile (header, ``Submitted batch job``,
        #: ``Duration``): a job log whose compile step was skipped still has these.
        self.job_lines = 0

    def origin(self, number: int) -> str:
        return f"{self.path}:{number}"

    @property
    def scope_id(self) -> str:
        """The compile the line being read belongs to."""
        return self.scopes.current.id if self.scopes.all else "compile0"

    def scope_at(self, number: int) -> str:
        """The compile a line read earlier belongs to (the last one started at or before it)."""
        found = "compile0"
        for scope in self.scopes.all:
            if scope.first_line <= number:
                found = scope.id
        return found

    # -- the pass --------------------------------------------------------------------

    def run(self) -> Recovery:
        self.lines = read_file(self.path, lambda line: self.feed(line.number, line.text), required=False)
        return self.finish()

    def feed(self, number: int, line: str) -> bool | Continue:
        """Whether the line was this reader's (see :mod:`dfit_mlir.adapters.lines`)."""
        if self.tracebacks.feed(number, line):
            self.squeezed = None
            return True
        found = _COMPONENT.match(line)
        if found is not None:
            self.evidence = True
            self.component_message(found["level"], found["message"])
            return True
        found = _LEVELLED.match(line)
        if found is not None:
            self.evidence = True
            self.levelled(number, found["level"], found["message"])
            return True
        found = _NAMED_TENSORS.match(line)
        if found is not None and self.squeezed is not None:
            self.named_tensors(number, found["side"], found["body"])
            return True
        self.squeezed = None
        found = _BRACKETED.match(line)
        if found is not None:
            self.evidence = True
            self.bracketed(found["level"], found["component"], found["scope"], found["message"])
            return True
        in_context = self.current_partition is not None and self.partition_context(line)
        model = JobScriptHeader._MODEL.match(line)
        if model is not None:
            # A job script prints its header once: a second ``Model:`` line is a second
            # job log pasted after the first, and starts its compile.
            self.compile_scope(number, "job_model", model["model"])
        if self.header.feed(line):
            self.scope_headers.setdefault(self.scope_id, JobScriptHeader()).feed(line)
            self.job_lines += 1
            return True
        return (
            self.script_line(number, line)
            or in_context
            or _COMPILER_NOTES.match(line) is not None
            or self.noise.feed(Line(number, line))
        )

    def add(self, measurement: Measurement) -> None:
        """Every record carries the compile (scope) of the file it belongs to."""
        scope = measurement.attributes.get("run_scope") or (self.scopes.current.id if self.scopes.all else "compile0")
        assert isinstance(self.measurements, RecordSet)
        self.measurements.add(replace(measurement, attributes={**measurement.attributes, "run_scope": scope}))

    def compile_scope(self, number: int, fact: str, value: Any) -> None:
        """A fact every compile states once: seen again, it starts the next compile of
        the file (a console transcript of several compiles, job logs pasted together)."""
        scope = self.scopes.current if self.scopes.all else self.scopes.open(1)
        if fact in scope.facts:
            scope = self.scopes.open(number)
            # Nothing read in the previous compile goes on into this one.
            self.current_partition = None
            self.squeezed = None
        scope.facts[fact] = value

    def script_line(self, number: int, line: str) -> bool | Continue:
        found = _SCRIPT_MARK.match(line)
        if found is not None:
            self.evidence = True
            seconds = count(found["value"], line.strip(), self.path, number)
            if found["which"] == "START":
                self.compile_scope(number, "compile_start", number)
            self.script_marks[(self.scope_id, found["which"])] = (seconds, number)
            return True
        found = _SCRIPT_DURATION.match(line)
        if found is not None:
            self.job_lines += 1
            seconds = count(found["value"], "Duration", self.path, number)
            self.add(
                Measurement(
                    kind="metric",
                    name="job_script.duration",
                    value=float(seconds),
                    unit="s",
                    duration_s=float(seconds),
                    origin=self.origin(number),
                    attributes={
                        "what": "whole job script (machine state, compile, run submission)"
                    },
                )
            )
            return True
        found = _COMMAND.match(line) or _SHELL_PROMPT.match(line)
        if found is not None:
            command = found["command"].strip()
            if " compile" in f" {command} ":
                self.evidence = True
                self.facts["command"] = command
                self.compile_scope(number, "command", command)
                if "host" in found.groupdict():
                    self.facts["host"] = found["host"]
            return True
        found = _PEF_CREATED.match(line)
        if found is not None:
            self.pef_created(number, found["path"])
            return True
        if line.startswith(_NAMESPACE_START):
            return Continue(Line(number, line), line, balanced(), self.namespace)
        found = _SUBMITTED.match(line)
        if found is not None:
            self.job_lines += 1
            self.facts["submitted_batch_job"] = count(found["job"], "batch job", self.path, number)
            return True
        found = LOG_ID.match(line)
        if found is not None:
            if "pef_path" in self.facts:
                return True  # a run started after the compile wrote its PEF (a compile + run SLURM output)
            self.log_ids.append(f"[{found['user']}][{found['process']}][{found['pid']}]")
            self.facts.setdefault("runtime_log", found["log"])
            return True
        found = APP_LOG.search(line)
        if found is not None:
            self.app_line(number, found)
            return python_warning_echo(number, line, found)
        return False

    def namespace(self, text: str, first: Line) -> None:
        """``args: Namespace(acc_test=False, ..., command='compile', ...)``, on one line or
        continued over many: the app's arguments; a second compile's starts its scope."""
        found = _NAMESPACE.match(text.replace("\n", " "))
        if found is None:
            raise ArtifactError.at(self.path, first.number, f"unreadable arguments {echo(text)}")
        items = _namespace_items(found["args"])
        self.facts.setdefault("app_args", items)
        if items.get("command") == "compile":
            self.evidence = True
            self.compile_scope(first.number, "app_args", items)
            self.pef_written_in_scope = False

    def app_line(self, number: int, found: re.Match[str]) -> None:
        wall_clock_s(found["stamp"], self.path, number)  # a stamp that is no date: this line's problem
        pid = int(found["pid"] or found["rank_pid"])
        message = found["message"].strip()
        if "compile mode" in message:
            self.evidence = True
        self.app_stamps.append((found["stamp"], pid, message, number, self.scope_id))

    def levelled(self, number: int, level: str, message: str) -> None:
        if level == "warning":
            self.warning_lines += 1
            if self.current_partition is not None:
                self.current_partition.rail_warnings += 1
        self.squeezed = None
        for pattern, handler in self._LEVELLED_HANDLERS:
            found = pattern.match(message)
            if found is not None:
                handler(self, number, found)
                return
        if self.current_partition is not None:
            self.partition_context(message)

    def bracketed(self, level: str, component: str, scope: str, message: str) -> None:
        found = _PLACING_LOGS.match(message)
        if found is not None:
            self.log_files.append(found["path"])
            return
        if self.pef_written_in_scope:
            return  # the run's tasks, printing after the compile wrote its PEF
        self.messages[f"[{level}][{component}][{scope}] {message}"] += 1

    def component_message(self, level: str, message: str) -> None:
        found = _EXPERIMENTAL.match(message)
        if found is not None:
            self.experimental.append(found["op"])
        self.messages[f"[{level}] {message}"] += 1

    # -- levelled-message handlers ---------------------------------------------------

    def amortized(self, number: int, found: re.Match[str]) -> None:
        figures = _AMORTIZED_FIGURES.match(found["figures"])
        if figures is None:
            raise ArtifactError.at(
                self.path, number, f"unreadable Amortized resources figures: {echo(found['figures'])}"
            )
        scope = found["scope"]
        partition = partition_id(scope) if _PARTITION_NAME.match(scope) else None

        def number_of(key: str) -> float:
            return finite(figures[key], f"Amortized resources {key}", self.path, number)

        def scale(table: dict[str, float], unit_key: str) -> float:
            unit = figures[unit_key]
            if unit not in table:
                raise ArtifactError.at(
                    self.path, number, f"unknown unit {echo(unit)} in Amortized resources"
                )
            return table[unit]

        estimates = (
            ("pcus", number_of("pcus"), None, f"{figures['pcus']} PCUs"),
            ("pmus", number_of("pmus"), None, f"{figures['pmus']} PMUs"),
            (
                "projected_latency",
                number_of("latency") * scale(_SECONDS, "latency_unit"),
                "s",
                f"{figures['latency']} {figures['latency_unit']}",
            ),
            (
                "projected_flop_rate",
                number_of("flops") * scale(_FLOP_RATE, "flops_unit"),
                "FLOP/s",
                f"{figures['flops']} {figures['flops_unit']}",
            ),
            (
                "projected_ddr_bandwidth",
                number_of("ddr") * scale(_BYTE_RATE, "ddr_unit"),
                "B/s",
                f"{figures['ddr']} {figures['ddr_unit']}",
            ),
        )
        for name, value, unit, text in estimates:
            self.add(
                Measurement(
                    kind="metric",
                    name=f"amortized.{name}",
                    value=value,
                    unit=unit,
                    partition=partition,
                    origin=self.origin(number),
                    attributes={"estimate": True, "scope": scope, "text": text},
                )
            )

    def squeeze(self, number: int, found: re.Match[str]) -> None:
        operator = self.named_operator(found["op"], number)
        operator.attributes.setdefault("unsqueezable_dim", found["dim"])
        self.squeezed = operator

    def dimension_mapping(self, number: int, found: re.Match[str]) -> None:
        message_types = found.string.rsplit(" : (", 1)
        operator = _Operator(
            name=None,
            op_type=found["op"],
            first_line=number,
            status="dimension mapping not supported",
            run_scope=self.scope_id,
        )
        operator.attributes["ssa"] = f"%{found['ssa']}"
        if len(message_types) == 2 and ") -> " in message_types[1]:
            ins, outs = message_types[1].split(") -> ", 1)
            operator.inputs = [_tensor_type(t["body"]) for t in _TENSOR_TYPE.finditer(ins)]
            operator.outputs = [_tensor_type(t["body"]) for t in _TENSOR_TYPE.finditer(outs)]
        self.unnamed.append(operator)

    def section_boundary(self, number: int, found: re.Match[str]) -> None:
        self.section_boundaries.append(found["name"])

    def graph(self, number: int, found: re.Match[str]) -> None:
        self.facts["graph"] = found["graph"]

    def plasma_start(self, number: int, found: re.Match[str]) -> None:
        self.current_partition = None
        module = PurePosixPath(found["dir"]).name
        self.plasma_modules.append(
            {"module": module, "line": number, "passes": [], "status": None, "run_scope": self.scope_id}
        )

    def plasma_pass(self, number: int, found: re.Match[str]) -> None:
        if self.plasma_modules:
            self.plasma_modules[-1]["passes"].append(found["name"])

    def plasma_done(self, number: int, found: re.Match[str]) -> None:
        if self.plasma_modules:
            self.plasma_modules[-1]["status"] = found["status"]

    def rail_logs(self, number: int, found: re.Match[str]) -> None:
        partition = self.partition(found["partition"], number)
        partition.log_dir = found["dir"]
        self.current_partition = partition

    def partition_done(self, number: int, found: re.Match[str]) -> None:
        partition = self.partition(found["partition"], number)
        partition.status = found["status"]
        self.current_partition = None

    def milestone(self, number: int, found: re.Match[str]) -> None:
        self.milestones.append(f"{found['what']} {found['status']}")

    def pef(self, number: int, found: re.Match[str]) -> None:
        self.pef_created(number, found["path"])

    _LEVELLED_HANDLERS: ClassVar[tuple[tuple[re.Pattern[str], Any], ...]] = (
        (_SQUEEZE, squeeze),
        (_RAIL_LOGS, rail_logs),
        (_PARTITION_DONE, partition_done),
        (_PLASMA_PASS, plasma_pass),
        (_PLASMA_START, plasma_start),
        (_PLASMA_DONE, plasma_done),
        (_AMORTIZED, amortized),
        (_DIMENSION_MAPPING, dimension_mapping),
        (_SECTION_BOUNDARY, section_boundary),
        (_GRAPH, graph),
        (_MILESTONE, milestone),
        (_PEF_CREATED, pef),
    )

    # -- records ---------------------------------------------------------------------

    def pef_created(self, number: int, pef_path: str) -> None:
        self.evidence = True
        self.facts.setdefault("pef_path", pef_path)
        self.facts.setdefault("pef_line", number)
        self.pef_written_in_scope = True
        scope = self.scopes.current
        scope.facts.setdefault("pef_path", pef_path)
        scope.facts.setdefault("pef_line", number)

    def named_operator(self, name: str, number: int) -> _Operator:
        operator = self.operators.get((self.scope_id, name))
        if operator is None:
            _, _, op_type = split_operator_name(name)
            operator = _Operator(name=name, op_type=op_type, first_line=number, run_scope=self.scope_id)
            self.operators[(self.scope_id, name)] = operator
        return operator

    def partition(self, vendor_name: str, number: int) -> _Partition:
        key = (self.scope_id, partition_id(vendor_name))
        if key not in self.partitions:
            # the callers' patterns guarantee ``partition_<N>_<M>_``
            index = int(vendor_name.split("_")[1])
            self.partitions[key] = _Partition(
                name=vendor_name, index=index, first_line=number, run_scope=self.scope_id
            )
        return self.partitions[key]

    def named_tensors(self, number: int, side: str, body: str) -> None:
        operator = self.squeezed
        assert operator is not None
        values: list[ValueInfo] = []
        names: list[list[str]] = []
        for tensor in _NAMED_TENSOR.finditer(body):
            dims = [d.strip() for d in tensor["shape"].split(",") if d.strip()]
            shape = tuple(
                count(d, f"NamedTensor shape of {operator.name}", self.path, number) for d in dims
            )
            values.append(ValueInfo(name=None, shape=shape, dtype=None))
            names.append([n.strip() for n in tensor["names"].split(",") if n.strip()])
        if not values and body.strip():
            raise ArtifactError.at(
                self.path, number, f"unreadable NamedTensor list for {operator.name}"
            )
        if side == "inputs":
            operator.inputs = values
        else:
            operator.outputs = values
        operator.dim_names[side] = names

    def partition_context(self, text: str) -> bool:
        """Rail's warnings and buffer lines name the operators a partition serves."""
        found = _CONTEXT_OP.search(text)
        if found is None:
            return False
        key = partition_id(found["partition"])
        partition = self.partitions.get((self.scope_id, key))
        if partition is None:
            return False
        partition.naming_groups.add(int(found["group"]))
        if "__" not in found["name"]:
            return True  # a buffer's own name (``tbuf1a_8_0_35187``), not an operator's
        operator = self.operators.get((self.scope_id, found["name"]))
        if operator is None:
            _, _, op_type = split_operator_name(found["name"])
            operator = _Operator(
                name=found["name"],
                op_type=op_type,
                first_line=partition.first_line,
                scope=key,
                run_scope=self.scope_id,
            )
            self.operators[(self.scope_id, found["name"])] = operator
        if operator.partition is None:
            operator.partition = key
            operator.attributes["naming_group"] = int(found["group"])
        return True

    # -- the result ------------------------------------------------------------------

    def finish(self) -> Recovery:
        source = source_artifact(self.path, SambaFlowCompileLogReader.format, lines=self.lines)
        if not self.evidence:
            note = CoverageNote("compile", Coverage.NOT_EXPOSED, f"{self.path}: no compile output in this log")
            if not self.job_lines:
                return Recovery(backend=BACKEND, sources=(source,), coverage=(note,))
            # A job log whose compile step was skipped: the job's own facts are still
            # worth a bundle when no other reader finds more in the file.
            return Recovery(
                backend=BACKEND,
                sources=(source,),
                measurements=self.finished_measurements(),
                coverage=(note,),
                attributes={
                    **self.header.facts,
                    **self.facts,
                    "compile_status": "not in this log (the job printed no compile output)",
                    "job_script_only": True,
                },
            )
        failure = self.failure()
        operators = self.build_operators(failure)
        partitions = self.build_partitions(operators)
        self.compile_timing()
        self.compile_outcomes(failure)
        self.measurements = self.finished_measurements()
        if len(self.scopes.all) > 1:
            # Resource estimates name their partition as the compile printed it.
            self.measurements = tuple(
                m if m.partition is None else replace(m, partition=self.scoped(m.attributes["run_scope"], m.partition))
                for m in self.measurements
            )
        attributes: dict[str, Any] = {
            **self.header.facts,
            **self.facts,
            "compile_status": self.status(failure),
        }
        if "pef_path" in attributes:
            attributes["pef_name"] = pef_stem(attributes["pef_path"])
        if failure is not None:
            attributes["compile_failure"] = failure.as_attribute()
        if self.experimental:
            attributes["experimental_operators"] = sorted(set(self.experimental))
        if self.section_boundaries:
            attributes["section_boundaries"] = self.section_boundaries
        if self.plasma_modules:
            attributes["plasma_modules"] = self.plasma_modules
        if self.milestones:
            attributes["milestones"] = self.milestones
        if self.messages:
            attributes["messages"] = dict(self.messages)
        if self.log_files:
            attributes["compiler_log_files"] = self.log_files
        if self.log_ids:
            attributes["runtime_log_ids"] = self.log_ids
        if self.app_stamps:
            attributes["clock"] = CLOCK
        if self.noise.facts:
            attributes["console"] = self.noise.facts
        if len(self.scopes.all) > 1:
            attributes["compiles"] = self.compiles_attribute(operators, partitions)
        attributes["compiler_warning_lines"] = self.warning_lines
        return Recovery(
            backend=BACKEND,
            sources=(source,),
            operators=operators,
            partitions=partitions,
            measurements=tuple(self.measurements),
            coverage=self.coverage(operators, partitions, failure),
            attributes=attributes,
        )

    def finished_measurements(self) -> tuple[Measurement, ...]:
        found = self.measurements
        return found.records() if isinstance(found, RecordSet) else found

    def compiles_attribute(
        self, operators: tuple[RecoveredOperator, ...], partitions: tuple[RecoveredPartition, ...]
    ) -> list[dict[str, Any]]:
        """One entry per compile of the file: where it starts, its own job header facts
        (model, SambaFlow version), its PEF, and how many records are its own."""
        compiles = []
        for scope in self.scopes.as_attribute():
            run_scope = scope["run_scope"]
            header = self.scope_headers.get(run_scope)
            compiles.append(
                {
                    **{k: v for k, v in scope.items() if k not in ("app_args", "job_model")},
                    **(header.facts if header is not None else {}),
                    "operators": sum(1 for o in operators if o.attributes["run_scope"] == run_scope),
                    "partitions": sum(
                        1 for p in partitions if p.kind == "partition" and p.attributes["run_scope"] == run_scope
                    ),
                    "sections": sum(
                        1 for p in partitions if p.kind == "section" and p.attributes["run_scope"] == run_scope
                    ),
                    "measurements": sum(1 for m in self.measurements if m.attributes["run_scope"] == run_scope),
                }
            )
        return compiles

    def compile_outcomes(self, failure: Traceback | None) -> None:
        """One ``compile.outcome`` record per compile of the file (its scope): what it
        was asked to build and the PEF it wrote. No time: the transcripts carry none."""
        if not self.scopes.all:
            self.scopes.open(1)
        failed_in = None if failure is None else self.scope_at(failure.first_line)
        for scope in self.scopes.all:
            wrote = scope.facts.get("pef_path")
            if wrote:
                status = "succeeded"
            elif not scope.facts.keys() & {"compile_start", "command", "app_args"} and len(self.scopes.all) > 1:
                # A job header and nothing of a compile (a run's job log pasted after it):
                # its traceback, if any, is not a compile's failure.
                status = "no compile output"
            elif scope.id == failed_in:
                status = "failed"
            else:
                status = "incomplete"
            args = scope.facts.get("app_args") or {}
            self.add(
                Measurement(
                    kind="compile",
                    name="compile.outcome",
                    value=None,
                    origin=self.origin(scope.first_line),
                    attributes={
                        "run_scope": scope.id,
                        "status": status,
                        "pef_path": wrote,
                        "pef_name": pef_stem(wrote) if wrote else None,
                        "batch_size": args.get("batch_size"),
                        "what": "one compile of this log: its outcome and the PEF it wrote",
                    },
                )
            )

    def failure(self) -> Traceback | None:
        return self.tracebacks.done[-1] if self.tracebacks.done else None

    def status(self, failure: Traceback | None) -> str:
        if failure is not None or any(p.status == "failed" for p in self.partitions.values()):
            return "failed"
        if "pef_path" in self.facts or "Compilation succeeded" in self.milestones:
            return "succeeded"
        return "incomplete"

    def failed_operator(self, failure: Traceback) -> _Operator | None:
        """The op a failed trace points at: the ``sambaflow.samba.functional`` frame's
        function is the op (``...functional.arithmetic.mul.mul`` → ``mul``); the last
        frame outside sambaflow and torch's module plumbing before it is the model-code
        line that called it."""
        caller: dict[str, Any] | None = None
        for frame in failure.frames:
            in_sambaflow = frame["file"].startswith("sambaflow/")
            if not in_sambaflow and not frame["file"].endswith("torch/nn/modules/module.py"):
                caller = frame
                continue
            if (
                in_sambaflow
                and ".functional." in frame["function"]
                and "/functional/" in frame["file"]
            ):
                module_file = PurePosixPath(frame["file"]).stem
                op_type = frame["function"].rsplit(".", 1)[-1]
                if op_type != module_file:
                    continue
                operator = _Operator(
                    name=None,
                    op_type=op_type,
                    first_line=failure.first_line,
                    status="compile failed",
                    run_scope=self.scope_at(failure.first_line),
                )
                operator.attributes["error"] = f"{failure.exception}: {failure.message}"
                if caller is not None:
                    operator.source = SourceLoc(file=caller["file"], line=caller["line"])
                    operator.attributes["code"] = caller["code"]
                if op_type in self.experimental:
                    operator.attributes["experimental"] = True
                return operator
        return None

    def build_operators(self, failure: Traceback | None) -> tuple[RecoveredOperator, ...]:
        pending = list(self.operators.values()) + self.unnamed
        if failure is not None:
            failed = self.failed_operator(failure)
            if failed is not None:
                pending.append(failed)
        roots = {
            run_scope: _shared_root([o.name for o in pending if o.name is not None and o.run_scope == run_scope])
            for run_scope in {o.run_scope for o in pending}
        }
        counts: Counter[tuple[str, str, str]] = Counter()
        built: list[RecoveredOperator] = []
        for operator in sorted(pending, key=lambda o: o.first_line):
            counted = (operator.run_scope, operator.scope, operator.op_type)
            k = counts[counted]
            counts[counted] += 1
            root = roots[operator.run_scope]
            attributes = dict(operator.attributes)
            attributes["run_scope"] = operator.run_scope
            module_path: tuple[str, ...] = ()
            phase = None
            if operator.name is not None:
                module_path, local, _ = split_operator_name(operator.name)
                if root is not None and module_path[:1] == (root,):
                    module_path = module_path[1:]
                    attributes["root_module"] = root
                attributes["op_name"] = local
                phase = phase_of(operator.name)
            if operator.dim_names:
                attributes["dim_names"] = operator.dim_names
            built.append(
                RecoveredOperator(
                    id=self.scoped(operator.run_scope, f"{operator.scope}/{operator.op_type}#{k}"),
                    op=f"{BACKEND}.{operator.op_type}",
                    index=operator.first_line,
                    name=operator.name,
                    inputs=tuple(operator.inputs),
                    outputs=tuple(operator.outputs),
                    source=operator.source,
                    module_path=module_path,
                    phase=phase,
                    partition=None if operator.partition is None else self.scoped(operator.run_scope, operator.partition),
                    status=operator.status,
                    attributes=attributes,
                )
            )
        return tuple(built)

    def scoped(self, run_scope: str, local_id: str) -> str:
        """The ID of a record of one compile: ``compile1/partition_7_0`` when the file
        holds several compiles (their partitions and operators share names), the local ID
        when it holds one (the IDs of a single compile log do not change)."""
        return f"{run_scope}/{local_id}" if len(self.scopes.all) > 1 else local_id

    def build_partitions(
        self, operators: tuple[RecoveredOperator, ...]
    ) -> tuple[RecoveredPartition, ...]:
        members: dict[str, list[str]] = {}
        for operator in operators:
            if operator.partition is not None:
                members.setdefault(operator.partition, []).append(operator.id)
        #: (compile scope, module, first, last, module record)
        sections: list[tuple[str, str, int, int, dict[str, Any]]] = []
        for module in self.plasma_modules:
            found = _SECTIONS_MODULE.match(module["module"])
            if found is not None:
                sections.append(
                    (module["run_scope"], module["module"], int(found["first"]), int(found["last"]), module)
                )
        section_of: dict[str, str] = {}
        built: list[RecoveredPartition] = []
        for (run_scope, key), partition in self.partitions.items():
            index = partition.index
            scoped_key = self.scoped(run_scope, key)
            section = next(
                (
                    self.scoped(run_scope, name)
                    for section_scope, name, first, last, _ in sections
                    if section_scope == run_scope and first <= index <= last
                ),
                None,
            )
            if section is not None:
                section_of[scoped_key] = section
            attributes: dict[str, Any] = {
                "name": partition.name,
                "index": index,
                "status": partition.status,
                "rail_warnings": partition.rail_warnings,
                "line": partition.first_line,
                "run_scope": run_scope,
            }
            if partition.log_dir is not None:
                attributes["rail_log_dir"] = partition.log_dir
            if section is not None:
                attributes["section"] = section
            if partition.naming_groups:
                attributes["naming_groups"] = sorted(partition.naming_groups)
            built.append(
                RecoveredPartition(
                    id=scoped_key,
                    kind="partition",
                    operator_ids=tuple(members.get(scoped_key, ())),
                    attributes=attributes,
                )
            )
        for run_scope, name, first, last, module in sections:
            section_id = self.scoped(run_scope, name)
            inside = [key for key, section in section_of.items() if section == section_id]
            built.append(
                RecoveredPartition(
                    id=section_id,
                    kind="section",
                    operator_ids=tuple(op for key in inside for op in members.get(key, ())),
                    attributes={
                        "what": "Plasma compile unit of partitions first..last",
                        "first": first,
                        "last": last,
                        "partitions": inside,
                        "plasma_passes": module["passes"],
                        "status": module["status"],
                        "line": module["line"],
                        "run_scope": run_scope,
                    },
                )
            )
        return tuple(built)

    def compile_timing(self) -> None:
        """Per compile of the file: its job-script duration and its app phase."""
        for scope in self.scopes.all or [self.scopes.open(1)]:
            self.scope_timing(scope.id)

    def scope_timing(self, run_scope: str) -> None:
        start, end = self.script_marks.get((run_scope, "START")), self.script_marks.get((run_scope, "END"))
        if start is not None and end is not None:
            self.add(
                Measurement(
                    kind="compile",
                    name="compile.duration",
                    value=float(end[0] - start[0]),
                    unit="s",
                    duration_s=float(end[0] - start[0]),
                    origin=self.origin(end[1]),
                    attributes={
                        "what": "COMPILE START AT .. COMPILE END AT (job-script seconds)",
                        "script_offsets_s": [start[0], end[0]],
                        "run_scope": run_scope,
                    },
                )
            )
        stamps = [s for s in self.app_stamps if s[4] == run_scope]
        started = [s for s in stamps if s[2].startswith("NLP app started")]
        finished = [s for s in stamps if s[2].startswith("NLP app finished")]
        if started and finished:
            begin, stop = wall_clock_s(started[0][0]), wall_clock_s(finished[-1][0])
            self.add(
                Measurement(
                    kind="compile",
                    name="compile.phase",
                    value=stop - begin,
                    unit="s",
                    start_s=begin,
                    duration_s=stop - begin,
                    origin=self.origin(started[0][3]),
                    attributes={
                        "phase": "app",
                        "what": "'NLP app started' .. 'NLP app finished': tracing and graph (MAC) compile, "
                        "before Plasma, rail and PEF",
                        "pid": started[0][1],
                        "run_scope": run_scope,
                    },
                )
            )

    def coverage(
        self,
        operators: tuple[RecoveredOperator, ...],
        partitions: tuple[RecoveredPartition, ...],
        failure: Traceback | None,
    ) -> tuple[CoverageNote, ...]:
        notes: list[CoverageNote] = []
        shaped = sum(1 for o in operators if o.inputs or o.outputs)
        if failure is not None:
            notes.append(
                CoverageNote(
                    "compile",
                    Coverage.PARTIAL,
                    f"{self.path}: compile failed ({failure.exception}: {failure.message}); "
                    "recovered what the log printed before the failure",
                )
            )
        notes.append(
            CoverageNote(
                "operators",
                Coverage.PARTIAL if operators else Coverage.NOT_EXPOSED,
                f"{self.path}: {len(operators)} operators named in compiler warnings, rail contexts or a "
                "traceback; the compile log does not list the graph",
            )
        )
        notes.append(
            CoverageNote(
                "tensor_shapes",
                Coverage.PARTIAL if shaped else Coverage.NOT_EXPOSED,
                f"{self.path}: shapes of {shaped} operators, only where warnings print NamedTensors or types",
            )
        )
        if partitions:
            count = sum(1 for p in partitions if p.kind == "partition")
            notes.append(
                CoverageNote(
                    "partitions",
                    Coverage.RECOVERED,
                    f"{self.path}: {count} partitions from rail compile lines",
                )
            )
        return tuple(notes)


def _shared_root(names: list[str]) -> str | None:
    """The first ``__`` segment every operator name shares, when there are several: the
    traced model itself (``bertformaskedlm``), which a PyTorch module path leaves out."""
    firsts = {name.split("__", 1)[0] for name in names if "__" in name}
    if len(names) > 1 and len(firsts) == 1:
        return firsts.pop()
    return None


def _namespace_items(text: str) -> dict[str, Any]:
    """``acc_test=False, batch_size=1, command='compile'`` → a dict of Python values."""
    items: dict[str, Any] = {}
    for key, raw in _NAMESPACE_ITEM.findall(text):
        raw = raw.strip()
        try:
            items[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            items[key] = raw
    return items

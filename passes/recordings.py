"""Command-buffer recordings of a ``hal``-phase module: what the runtime join matches.

Facts of the pinned IREE (3.13, measured on ``tests/inputs/shapes``; README "run modes"):

* every ``stream.cmd.execute`` region becomes one command-buffer *recording*
  (``hal.command_buffer.create`` … ``finalize``), straight-line: its commands
  (dispatches, copies, fills, barriers) are fixed at compile time, and ``local-task``
  numbers them (``command_index``) in that order;
* most recordings are *memoized*: recorded once at load time in a
  ``__<fn>_memoize_apply`` function called by an initializer that stores the command
  buffer in a global, then executed (``hal.device.queue.execute.indirect``) by the
  functions that load the global — so one runtime ``command_buffer_id`` is executed
  once per loop trip, and an ``scf.if`` selects between two loaded globals;
* the others are recorded where they run (``mode(OneShot)``), e.g. the load-time work
  of an initializer;
* control flow (loops, branches) lives in host code around the executions.

So each recording gets its ordered command list with the call sites of its dispatches,
the functions that execute it (executors), and whether it runs at load time. Each
function gets the functions it calls and an *anchor*: the first execution in its entry
block (which runs exactly once per call) with the queue operations issued before it,
which is how runtime submissions are split into invocations (a function without one —
every execution under control flow — is split by the profile's per-invocation flushes
instead: ``runtime_hooks/profile_flushes.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from iree.compiler import ir

from dfit_mlir.passes.host_calls import reachable
from dfit_mlir.passes.mlir_engine import OpTree, symbol_name
from dfit_mlir.passes.snapshot import SITE_KINDS, _site_target, symbol_path

FUNCTION_KINDS = frozenset({"util.func", "func.func", "util.initializer"})
CALL_KINDS = frozenset({"util.call", "func.call"})
#: Command-buffer ops that are not commands (the runtime does not number them).
NOT_COMMANDS = frozenset({
    "hal.command_buffer.create", "hal.command_buffer.finalize", "hal.command_buffer.begin_debug_group",
    "hal.command_buffer.end_debug_group", "hal.command_buffer.device",
})
EXECUTE_KINDS = frozenset({"hal.device.queue.execute", "hal.device.queue.execute.indirect"})
COMMAND_BUFFER_TYPE = "!hal.command_buffer"


@dataclass(frozen=True)
class Command:
    op: str
    """``dispatch``, ``copy_buffer``, ``fill_buffer``, ``execution_barrier`` … (the
    ``hal.command_buffer.`` op name without its prefix)."""
    site: int | None = None
    export: str | None = None
    #: Workgroup count when it is a compile-time constant (x, y, z), else ``None``.
    workgroups: tuple[int, ...] | None = None


@dataclass
class Recording:
    index: int
    function: str
    commands: list[Command] = field(default_factory=list)
    #: Global the recorded command buffer is stored in (memoized recordings).
    global_name: str | None = None
    executors: list[str] = field(default_factory=list)
    load_time: bool = False


@dataclass
class HostFunction:
    name: str
    public: bool
    initializer: bool
    calls: list[str] = field(default_factory=list)
    #: Recordings its executions may run (``None`` in the list: one it cannot trace).
    executes: list[list[int] | None] = field(default_factory=list)
    #: The entry block up to its first execution: ``["queue"]`` per queue operation (one
    #: submission each), ``["call", callee]``, and ``["execute", recordings]`` last.
    entry: list[list[Any]] = field(default_factory=list)
    #: Queue operations anywhere in its body.
    queue_ops: int = 0


def host_program(module: ir.Operation) -> dict[str, Any]:
    """``{"recordings": [...], "functions": {...}}`` of a ``hal``-phase module (JSON)."""
    walk = _HostWalk(OpTree(module))
    for top in walk.tree.children(module):
        walk.visit(top, None)
    walk.trace_executions(walk.link_globals())
    walk.mark_load_time()
    return {
        "recordings": [_recording_json(r) for r in walk.recordings],
        "functions": {name: {k: v for k, v in asdict(f).items() if k != "name"} for name, f in walk.functions.items()},
    }


@dataclass
class _HostWalk:
    """What one walk over a module's host code collects (:func:`host_program`); filled
    by :meth:`visit`, then linked."""

    tree: OpTree
    recordings: list[Recording] = field(default_factory=list)
    functions: dict[str, HostFunction] = field(default_factory=dict)
    #: Command-buffer value -> its recording.
    recording_of: dict[Any, Recording] = field(default_factory=dict)
    #: Function returning a recorded buffer -> the global an initializer stores it in.
    memo_global: dict[str, str] = field(default_factory=dict)
    #: Global -> the functions loading it.
    loads: dict[str, set[str]] = field(default_factory=dict)
    #: Command-buffer executions, with the function issuing each.
    executions: list[tuple[HostFunction, ir.Operation]] = field(default_factory=list)
    #: Integer constants by value (what constant workgroup counts are read from).
    constants: dict[Any, int] = field(default_factory=dict)
    #: Dispatch call sites seen so far: they are numbered in program order, as snapshots do.
    sites: int = 0
    initializers: int = 0

    def visit(self, op: ir.Operation, function: HostFunction | None) -> None:
        if op.name in FUNCTION_KINDS and function is None:
            function = self._open_function(op)
        if op.name in SITE_KINDS and _site_target(op) is not None:
            self._visit_site(op, function)
        elif function is not None:
            self._visit_host_op(op, function)
        for child in self.tree.children(op):
            self.visit(child, function)

    def _open_function(self, op: ir.Operation) -> HostFunction:
        if op.name == "util.initializer":
            name, public, initializer = f"initializer#{self.initializers}", False, True
            self.initializers += 1
        else:
            name = symbol_name(op) or "?"
            visibility = op.attributes["sym_visibility"] if "sym_visibility" in op.attributes else None
            public, initializer = visibility is None or str(visibility) == '"public"', False
        function = self.functions[name] = HostFunction(name, public, initializer)
        _entry_anchor_ops(op, self.tree, function)
        return function

    def _recording_fed(self, op: ir.Operation) -> Recording | None:
        """The recording whose command buffer is ``op``'s first operand."""
        if op.operands and op.operands[0] in self.recording_of:
            return self.recording_of[op.operands[0]]
        return None

    def _visit_site(self, op: ir.Operation, function: HostFunction | None) -> None:
        target = _site_target(op)
        recording = self._recording_fed(op) if function is not None else None
        if recording is not None and target is not None:
            recording.commands.append(Command("dispatch", self.sites, target[1], _workgroups(op, self.constants)))
        self.sites += 1

    def _visit_host_op(self, op: ir.Operation, function: HostFunction) -> None:
        kind = op.name
        if kind == "arith.constant":
            self._note_constant(op)
        elif kind.startswith("hal.command_buffer."):
            self._visit_command_buffer_op(op, function)
        elif kind in CALL_KINDS:
            self._visit_call(op, function)
        elif kind == "util.global.load":
            self.loads.setdefault(_symbol_ref(op.attributes["global"]), set()).add(function.name)
        elif kind == "util.global.store":
            if (recording := self._recording_fed(op)) is not None:
                recording.global_name = _symbol_ref(op.attributes["global"])
        elif kind in EXECUTE_KINDS:
            self.executions.append((function, op))
        if kind.startswith("hal.device.queue."):
            function.queue_ops += 1

    def _note_constant(self, op: ir.Operation) -> None:
        if len(op.results) != 1:
            return
        try:
            self.constants[op.results[0]] = ir.IntegerAttr(op.attributes["value"]).value
        except (ValueError, TypeError, KeyError):
            pass

    def _visit_command_buffer_op(self, op: ir.Operation, function: HostFunction) -> None:
        """``create`` opens a recording; every other command is one of its commands."""
        kind = op.name
        if kind == "hal.command_buffer.create":
            recording = Recording(len(self.recordings), function.name)
            self.recordings.append(recording)
            self.recording_of[op.results[0]] = recording
        elif kind not in NOT_COMMANDS and (fed := self._recording_fed(op)) is not None:
            fed.commands.append(Command(kind.removeprefix("hal.command_buffer.")))

    def _visit_call(self, op: ir.Operation, function: HostFunction) -> None:
        """A call; in an initializer, one whose command buffer it stores in a global
        names the memoized recording's global."""
        callee = _symbol_ref(op.attributes["callee"])
        function.calls.append(callee)
        if not function.initializer:
            return
        for user in op.results[0].uses if op.results else ():
            owner = user.owner
            if owner.name == "util.global.store" and str(op.results[0].type) == COMMAND_BUFFER_TYPE:
                self.memo_global[callee] = _symbol_ref(owner.attributes["global"])

    def link_globals(self) -> dict[str, list[int]]:
        """Each recording's global and executors: a buffer stored in a global is executed
        by the functions that load it; one recorded where it runs, by that function.
        Returns the recordings stored in each global."""
        by_global: dict[str, list[int]] = {}
        for recording in self.recordings:
            if recording.global_name is None and recording.function in self.memo_global:
                recording.global_name = self.memo_global[recording.function]
            if recording.global_name is not None:
                by_global.setdefault(recording.global_name, []).append(recording.index)
                recording.executors = sorted(self.loads.get(recording.global_name, ()))
            else:
                recording.executors = [recording.function]
        return by_global

    def trace_executions(self, by_global: dict[str, list[int]]) -> None:
        """The recordings each execution, and each function's entry anchor, may run."""
        for function, op in self.executions:
            function.executes.append(_traced(_command_operand(op), self.recording_of, by_global))
        for function in self.functions.values():
            if function.entry and function.entry[-1][0] == "execute":
                executed = _traced(_command_operand(function.entry[-1][1]), self.recording_of, by_global)
                function.entry[-1] = ["execute", executed]

    def mark_load_time(self) -> None:
        """Load time: only initializers (and what only they call) execute the recording."""
        calls = {n: f.calls for n, f in self.functions.items()}
        load_reach = reachable({name for name, f in self.functions.items() if f.initializer}, calls)
        call_reach = reachable({name for name, f in self.functions.items() if f.public}, calls)
        for recording in self.recordings:
            executors = [e for e in recording.executors if e in self.functions]
            recording.load_time = bool(executors) and all(e in load_reach and e not in call_reach for e in executors)


def _symbol_ref(attribute: Any) -> str:
    """``@name`` (or ``@"na\\22me"``) -> ``name`` (``na"me``): the name as data, escapes
    decoded (:func:`dfit_mlir.passes.snapshot.symbol_path`)."""
    return symbol_path(attribute)[-1]


def _recording_json(recording: Recording) -> dict[str, Any]:
    row = asdict(recording)
    row["commands"] = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(c).items() if v is not None}
                       for c in recording.commands]
    return row


def _workgroups(op: ir.Operation, constants: dict[Any, int]) -> tuple[int, ...] | None:
    """The constant workgroup count of a ``hal.command_buffer.dispatch`` (its three
    index operands after the function ordinal), or ``None`` when any is dynamic."""
    if op.name != "hal.command_buffer.dispatch":
        return None
    # Operands: command buffer, executable, function ordinal, workgroups x/y/z, ...
    counts = [constants.get(value) for value in list(op.operands)[3:6]]
    return None if any(c is None for c in counts) else tuple(counts)  # type: ignore[arg-type]


def _command_operand(op: ir.Operation) -> Any:
    for value in op.operands:
        if str(value.type) == COMMAND_BUFFER_TYPE:
            return value
    return None


def _traced(value: Any, recording_of: dict[Any, Recording], by_global: dict[str, list[int]]) -> list[int] | None:
    """Recordings a command-buffer value can hold: a recording's own value, a loaded
    memoized global, a ``select`` of those; ``None`` when it cannot be traced."""
    if value is None:
        return None
    if value in recording_of:
        return [recording_of[value].index]
    owner = value.owner
    if not isinstance(owner, (ir.Operation, ir.OpView)):
        return None  # a block argument
    owner = owner.operation if isinstance(owner, ir.OpView) else owner
    if owner.name == "util.global.load":
        return by_global.get(_symbol_ref(owner.attributes["global"]))
    if owner.name == "arith.select":
        parts = [_traced(v, recording_of, by_global) for v in list(owner.operands)[1:]]
        return None if any(p is None for p in parts) else sorted({i for p in parts for i in p})  # type: ignore[union-attr]
    return None


def _entry_anchor_ops(function_op: ir.Operation, tree: OpTree, function: HostFunction) -> None:
    """The entry block's queue operations, calls and first execution, in order (the
    entry block runs exactly once per call: see :func:`dfit_mlir.passes.host_calls.anchor`)."""
    if not function_op.regions or not function_op.regions[0].blocks:
        return
    for op in tree.ops_in(function_op.regions[0].blocks[0]):
        if op.name in EXECUTE_KINDS:
            function.entry.append(["execute", op])
            return
        if op.name.startswith("hal.device.queue."):
            function.entry.append(["queue"])
        elif op.name in CALL_KINDS:
            function.entry.append(["call", _symbol_ref(op.attributes["callee"])])

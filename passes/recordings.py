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

from dfit_mlir.passes.mlir_engine import OpTree, symbol_name
from dfit_mlir.passes.snapshot import SITE_KINDS, _site_target

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
    tree = OpTree(module)
    recordings: list[Recording] = []
    functions: dict[str, HostFunction] = {}
    recording_of: dict[Any, Recording] = {}  # command-buffer value -> its recording
    memo_global: dict[str, str] = {}  # function returning a recorded buffer -> global it is stored in
    loads: dict[str, set[str]] = {}  # global -> functions loading it
    site_index = 0
    initializers = 0
    executions: list[tuple[HostFunction, ir.Operation]] = []
    constants: dict[Any, int] = {}

    def visit(op: ir.Operation, function: HostFunction | None) -> None:
        nonlocal site_index, initializers
        kind = op.name
        if kind in FUNCTION_KINDS and function is None:
            if kind == "util.initializer":
                name, public, init = f"initializer#{initializers}", False, True
                initializers += 1
            else:
                name = symbol_name(op) or "?"
                visibility = op.attributes["sym_visibility"] if "sym_visibility" in op.attributes else None
                public, init = visibility is None or str(visibility) == '"public"', False
            function = functions[name] = HostFunction(name, public, init)
            _entry_anchor_ops(op, tree, function)
        if kind in SITE_KINDS and _site_target(op) is not None:
            target = _site_target(op)
            if function is not None and op.operands and op.operands[0] in recording_of:
                recording_of[op.operands[0]].commands.append(
                    Command("dispatch", site_index, target[1], _workgroups(op, constants)))
            site_index += 1
        elif function is not None:
            if kind == "arith.constant" and len(op.results) == 1:
                try:
                    constants[op.results[0]] = ir.IntegerAttr(op.attributes["value"]).value
                except (ValueError, TypeError, KeyError):
                    pass
            elif kind == "hal.command_buffer.create":
                recording = Recording(len(recordings), function.name)
                recordings.append(recording)
                recording_of[op.results[0]] = recording
            elif kind.startswith("hal.command_buffer.") and kind not in NOT_COMMANDS and op.operands \
                    and op.operands[0] in recording_of:
                recording_of[op.operands[0]].commands.append(Command(kind.removeprefix("hal.command_buffer.")))
            elif kind in CALL_KINDS:
                callee = str(op.attributes["callee"]).lstrip("@").strip('"')
                function.calls.append(callee)
                if function.initializer:
                    for user in op.results[0].uses if op.results else ():
                        owner = user.owner
                        if owner.name == "util.global.store" and str(op.results[0].type) == COMMAND_BUFFER_TYPE:
                            memo_global[callee] = str(owner.attributes["global"]).lstrip("@").strip('"')
            elif kind == "util.global.load":
                loads.setdefault(str(op.attributes["global"]).lstrip("@").strip('"'), set()).add(function.name)
            elif kind == "util.global.store" and op.operands and op.operands[0] in recording_of:
                recording_of[op.operands[0]].global_name = str(op.attributes["global"]).lstrip("@").strip('"')
            elif kind in EXECUTE_KINDS:
                executions.append((function, op))
            if kind.startswith("hal.device.queue."):
                function.queue_ops += 1
        for child in tree.children(op):
            visit(child, function)

    for top in tree.children(module):
        visit(top, None)

    by_global: dict[str, list[int]] = {}
    for recording in recordings:
        if recording.global_name is None and recording.function in memo_global:
            recording.global_name = memo_global[recording.function]
        if recording.global_name is not None:
            by_global.setdefault(recording.global_name, []).append(recording.index)
            recording.executors = sorted(loads.get(recording.global_name, ()))
        else:
            recording.executors = [recording.function]
    for function, op in executions:
        function.executes.append(_traced(_command_operand(op), recording_of, by_global))
    for function in functions.values():
        if function.entry and function.entry[-1][0] == "execute":
            function.entry[-1] = ["execute", _traced(_command_operand(function.entry[-1][1]), recording_of, by_global)]
    load_roots = {name for name, f in functions.items() if f.initializer}
    load_reach = reachable(load_roots, {n: f.calls for n, f in functions.items()})
    call_reach = reachable({name for name, f in functions.items() if f.public},
                           {n: f.calls for n, f in functions.items()})
    for recording in recordings:
        # A buffer stored in a global is executed by the functions that load it; one
        # recorded where it runs, by that function. Load time: only initializers (and
        # what only they call) execute it.
        executors = [e for e in recording.executors if e in functions]
        recording.load_time = bool(executors) and all(e in load_reach and e not in call_reach for e in executors)
    return {
        "recordings": [_recording_json(r) for r in recordings],
        "functions": {name: {k: v for k, v in asdict(f).items() if k != "name"} for name, f in functions.items()},
    }


def reachable(roots: set[str] | list[str], calls: dict[str, list[str]]) -> set[str]:
    """``roots`` and every function they call, transitively."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(calls.get(name, ()))
    return seen


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
        return by_global.get(str(owner.attributes["global"]).lstrip("@").strip('"'))
    if owner.name == "arith.select":
        parts = [_traced(v, recording_of, by_global) for v in list(owner.operands)[1:]]
        return None if any(p is None for p in parts) else sorted({i for p in parts for i in p})  # type: ignore[union-attr]
    return None


def _entry_anchor_ops(function_op: ir.Operation, tree: OpTree, function: HostFunction) -> None:
    """The entry block's queue operations, calls and first execution, in order (the
    entry block runs exactly once per call: see :func:`anchor`)."""
    if not function_op.regions or not function_op.regions[0].blocks:
        return
    for op in tree.ops_in(function_op.regions[0].blocks[0]):
        if op.name in EXECUTE_KINDS:
            function.entry.append(["execute", op])
            return
        if op.name.startswith("hal.device.queue."):
            function.entry.append(["queue"])
        elif op.name in CALL_KINDS:
            function.entry.append(["call", str(op.attributes["callee"]).lstrip("@").strip('"')])


def anchor(functions: dict[str, dict[str, Any]], name: str, depth: int = 0) -> tuple[list[int], int] | None:
    """The first command-buffer execution a call of ``name`` makes for sure: (recordings
    it may run, queue operations — one submission each — issued before it in the call).
    Found in the entry block, following calls made there; ``None`` when a call or branch
    before it could issue any number of submissions."""
    function = functions.get(name)
    if function is None or depth > 16:
        return None
    issued = 0
    for item in function["entry"]:
        if item[0] == "queue":
            issued += 1
        elif item[0] == "execute":
            return (item[1], issued) if item[1] else None
        elif item[0] == "call":
            callee = item[1]
            if not _issues_queue_ops(functions, callee):
                continue
            found = anchor(functions, callee, depth + 1)
            return None if found is None else (found[0], issued + found[1])
    return None


def _issues_queue_ops(functions: dict[str, dict[str, Any]], name: str) -> bool:
    return any(functions[n]["queue_ops"] for n in reachable([name], {k: f["calls"] for k, f in functions.items()})
               if n in functions)

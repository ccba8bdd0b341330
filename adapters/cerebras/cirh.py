"""CIRH MLIR dumps of a Cerebras compile (``cs_<hash>/cirh*.mlir``, ``ws_*.mlir``): the
operators of the program the compiler was given, with their types, attributes and the
locations that lead back to the model code.

No real CIRH dump is public; this reader follows the textual MLIR the printer writes
with debug info (generic op form for the unregistered ``cirh`` dialect, location
aliases ``#locN = loc(...)``), and the synthetic samples in ``tests/inputs/cerebras``.

Two parsers give the same operators:

* ``mlir-bindings``: the MLIR parser bundled with IREE (unregistered dialects allowed),
  walked generically: op name, operand and result types, attributes, locations.
* ``line-reader``: one op per line, by regular expressions: result names, op name,
  attribute dictionary text, type signature and trailing ``loc(...)``, resolving
  location aliases; generic and custom-form functions, ops with regions, and custom
  assembly (``%r = cirh.Tanh %x {...} : type``, operand types from their producers).
  Used when the parser rejects a dump (custom assembly of an op it does not know, a
  truncated file) and, for speed, for dumps larger than :data:`BINDINGS_MAX_BYTES`: on
  150k ops the bindings parse in ~1.8 s but walking the ops from Python costs ~5 s
  more, while the line reader parses them in ~2.5 s (benchmarks/reconstruct_scale.py).

Rules, stated once:

* IDs are ``<function>/<op name>#<k>`` (``train_step/cirh.MatMul#3``); ``func.return``
  is structure, not an operator. Tensor IDs are ``<op id>:<result>`` and
  ``<function>/arg<n>``.
* Phase: (1) a frame of the location in an optimizer (``.../optim/...``) or in autograd
  (``torch/autograd/...``) says ``optimizer`` / ``backward``; (2) where the location
  says neither, the op name does: ``...Grad`` / ``...Backward`` → backward, ``...Update``
  → optimizer; (3) otherwise an op whose location says anything (a file, a name) is
  ``forward``, and an op with an unknown location has no phase (None). Backward ops usually keep the forward
  op's location, hence the op name before the default. A backward op that is neither
  named as a gradient nor located in autograd reads as forward: the dump cannot tell.
* Module path: the first name location in the location tree (callee before caller)
  that is an identifier path (``bert.encoder.layer.3.attention.self.query``, ``cls``).
* Source: the innermost file location (the callee end of a call-site chain); the whole
  chain is kept in the operator's ``call_stack`` when it has more than one frame.
* MACs: ``cirh.MatMul`` / ``cirh.BatchMatMul`` with static shapes, result elements ×
  the contracted dimension (lhs last = rhs second-to-last); FLOPs = 2 × MACs.
* Kernels: an op's ``cs.kernel`` attribute names the kernel that executes it; ops of
  one kernel form a partition of kind ``kernel`` (the compile report's row of that
  name joins it). ``cs.layer`` is the op's ``name``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.adapters.cerebras.logs import BACKEND
from dfit_mlir.adapters.cerebras.reports import compile_hash_of, kernel_partition_id
from dfit_mlir.adapters.recovery import (
    ArtifactError,
    Coverage,
    CoverageNote,
    RecoveredOperator,
    RecoveredPartition,
    RecoveredTensor,
    Recovery,
    SourceLoc,
    ValueInfo,
    source_artifact,
)
from dfit_mlir.core import costs, locations
from dfit_mlir.core.locations import CallSiteLoc, FileLoc, FusedLoc, Loc, NameLoc
from dfit_mlir.core.perf import paused_gc

#: Above this size the line reader is used directly (see the module docstring).
BINDINGS_MAX_BYTES = 8 << 20
#: Above this region nesting the line reader is used directly: the MLIR bindings parse
#: and walk nested regions recursively (a 5000-deep dump crashes the process), while the
#: line reader keeps open regions on a list.
BINDINGS_MAX_DEPTH = 256
#: Locations with more parentheses than this are refused (a call chain this deep is
#: not a model's; the location parser recurses once per level).
_MAX_LOC_NESTING = 400


def region_depth(text: str) -> int:
    """How deep ``({`` ... ``})`` regions nest (a line scan: one op per line in CIRH
    dumps; braces of attribute dictionaries open and close on their line)."""
    depth = deepest = 0
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.endswith("({") or stripped.endswith("{") and not stripped.startswith("}"):
            depth += 1
            deepest = max(deepest, depth)
        elif stripped.startswith("}"):
            depth -= 1
    return deepest
MLIR_BINDINGS = "mlir-bindings"
LINE_READER = "line-reader"

_NAME_RE = re.compile(r"(^|/)(cirh|ws)[^/]*\.mlir$")
_LOCATION_PHASES = (("optimizer", re.compile(r"(^|/)optim/")), ("backward", re.compile(r"(^|/)autograd/")))
_MODULE_PATH_RE = re.compile(r"^[A-Za-z_][\w]*(?:\.[\w]+)*$")
_SCALAR_RE = re.compile(r"^(?:bf16|f16|f32|f64|tf32|i\d+|si\d+|ui\d+|index)$")
MATMUL_OPS = frozenset({"cirh.MatMul", "cirh.BatchMatMul"})
_TERMINATORS = frozenset({"func.return"})
#: Ops that are structure, not operators: their regions hold the operators.
_STRUCTURE = frozenset({"builtin.module", "func.func"})


def op_name_phase(name: str) -> str | None:
    short = name.rsplit(".", 1)[-1]
    if short.endswith(("Grad", "Backward")):
        return "backward"
    if short.endswith("Update"):
        return "optimizer"
    return None


class _LocFacts:
    """What a location tree says about its op, composed from the facts of its parts:
    aliased locations share subtrees, so each node is looked at once per dump."""

    __slots__ = ("source", "stack", "module_path", "phase", "silent")

    def __init__(
        self,
        source: SourceLoc | None,
        stack: tuple[SourceLoc, ...],
        module_path: tuple[str, ...],
        phase: str | None,
        silent: bool,
    ):
        self.source = source
        self.stack = stack
        self.module_path = module_path
        self.phase = phase
        self.silent = silent


_SILENT = _LocFacts(None, (), (), None, True)
_PHASE_PRIORITY = tuple(phase for phase, _ in _LOCATION_PHASES)


def _first_phase(*phases: str | None) -> str | None:
    return next((phase for phase in _PHASE_PRIORITY if phase in phases), None)


def _facts(loc: Loc | None, memo: dict[int, tuple[Loc, _LocFacts]]) -> _LocFacts:
    """The source (innermost file location of the callee chain), the call stack (callee
    first), the first module-path name (callee before caller), the phase a frame's file
    says, and whether the location says nothing at all."""
    if loc is None:
        return _SILENT
    found = memo.get(id(loc))
    if found is not None:
        return found[1]
    if isinstance(loc, FileLoc):
        phase = next((phase for phase, pattern in _LOCATION_PHASES if pattern.search(loc.file)), None)
        source = SourceLoc(loc.file, loc.line, loc.col)
        facts = _LocFacts(source, (source,), (), phase, False)
    elif isinstance(loc, NameLoc):
        child = _facts(loc.child, memo)
        path = tuple(loc.name.split(".")) if _MODULE_PATH_RE.match(loc.name) else child.module_path
        facts = _LocFacts(child.source, child.stack, path, child.phase, False)
    elif isinstance(loc, CallSiteLoc):
        callee, caller = _facts(loc.callee, memo), _facts(loc.caller, memo)
        facts = _LocFacts(
            callee.source or caller.source,
            callee.stack + caller.stack,
            callee.module_path or caller.module_path,
            _first_phase(callee.phase, caller.phase),
            callee.silent and caller.silent,
        )
    elif isinstance(loc, FusedLoc) and loc.locations:
        parts = [_facts(item, memo) for item in loc.locations]
        facts = _LocFacts(
            parts[0].source,
            parts[0].stack,
            next((p.module_path for p in parts if p.module_path), ()),
            _first_phase(*(p.phase for p in parts)),
            all(p.silent for p in parts),
        )
    else:
        facts = _SILENT
    memo[id(loc)] = (loc, facts)
    return facts


class _Builder:
    """Turns parsed ops (from either parser) into operators, tensors and kernels, so
    both parsers give identical records."""

    def __init__(self, path: Path, compile_hash: str | None, scope_prefix: str):
        self.path = path
        self.compile_hash = compile_hash
        self.scope_prefix = scope_prefix
        self.scope = scope_prefix + "module"
        #: scope → function name, in order
        self.functions: dict[str, str] = {}
        self.counters: dict[tuple[str, str], int] = {}
        self.operators: list[RecoveredOperator | None] = []
        #: One record per tensor: [producer, consumers, value, name]; ``values`` maps the
        #: parser's key of a value (SSA name, bindings Value) in the current function to it.
        self.tensors: list[list[Any]] = []
        self.values: dict[Hashable, list[Any]] = {}
        self.types: dict[str, tuple[tuple[int | None, ...] | None, str | None, int | None]] = {}
        self.loc_facts: dict[int, tuple[Loc, _LocFacts]] = {}
        self.kernels: dict[str, list[str]] = {}
        self.partition_ids: dict[str, str] = {}
        self.name_phases: dict[str, str | None] = {}
        self.updated: set[str] = set()

    def function(self, name: str) -> None:
        self.scope = self.scope_prefix + name
        self.functions[self.scope] = name
        self.values = {}

    def type_info(self, type_text: str) -> tuple[tuple[int | None, ...] | None, str | None, int | None]:
        """(shape, dtype, bytes) of a type: ranked tensors and scalars; else unknown."""
        found = self.types.get(type_text)
        if found is None:
            shaped = costs.parse_shaped(type_text)
            if shaped is not None:
                found = (shaped.shape, shaped.dtype, shaped.nbytes)
            elif _SCALAR_RE.match(type_text):
                found = ((), type_text, costs.type_bytes(f"tensor<{type_text}>"))
            else:
                found = (None, None, None)
            self.types[type_text] = found
        return found

    def value(self, tensor_id: str, type_text: str) -> ValueInfo:
        return ValueInfo(tensor_id, *self.type_info(type_text))

    def argument(
        self, key: Hashable, index: int, type_text: str, loc: Loc | None, block: str | None = None
    ) -> None:
        """An argument of the function, or of ``block`` (``<op id>/bb<n>``) of an op's region."""
        record = [
            None,
            [],
            self.value(f"{block or self.scope}/arg{index}", type_text),
            loc.name if isinstance(loc, NameLoc) else None,
        ]
        self.values[key] = record
        self.tensors.append(record)

    def reserve(self, name: str) -> tuple[str, int]:
        """ID and position of an op (reserved ahead for ops whose types come after their
        regions)."""
        counter = (self.scope, name)
        k = self.counters.get(counter, 0)
        self.counters[counter] = k + 1
        self.operators.append(None)
        return f"{self.scope}/{name}#{k}", len(self.operators) - 1

    def op(
        self,
        name: str,
        results: Sequence[Hashable],
        result_types: Sequence[str],
        operands: Sequence[Hashable],
        attributes: dict[str, Any],
        loc: Loc,
        line: int | None,
        reserved: tuple[str, int] | None = None,
    ) -> str:
        # Written for speed (once per op of 150k-op dumps): lookups are cached per op
        # name, type and location node.
        if reserved is None:
            counter = (self.scope, name)
            k = self.counters.get(counter, 0)
            self.counters[counter] = k + 1
            op_id = f"{self.scope}/{name}#{k}"
            index = len(self.operators)
            self.operators.append(None)
        else:
            op_id, index = reserved
        values = self.values
        inputs = []
        for key in operands:
            record = values.get(key)
            if record is None:
                raise ArtifactError.at(
                    self.path, line, f"{name}: operand {key} is not defined before its use"
                )
            record[1].append(op_id)
            inputs.append(record[2])
        if len(results) != len(result_types):
            raise ArtifactError.at(
                self.path, line, f"{name}: {len(results)} results, {len(result_types)} types"
            )
        outputs = []
        types = self.types
        tensors = self.tensors
        total: int | None = 0
        for value in inputs:
            if value.bytes is None:
                total = None
            elif total is not None:
                total += value.bytes
        for position, key in enumerate(results):
            type_text = result_types[position]
            shape = types.get(type_text) or self.type_info(type_text)
            value = ValueInfo(f"{op_id}:{position}", shape[0], shape[1], shape[2])
            record = [op_id, [], value, None]
            values[key] = record
            tensors.append(record)
            outputs.append(value)
            if shape[2] is None:
                total = None
            elif total is not None:
                total += shape[2]
        entry = self.loc_facts.get(id(loc))
        info = entry[1] if entry is not None else _facts(loc, self.loc_facts)
        phase = info.phase
        if phase is None:
            phase = self.name_phases.get(name, "")
            if phase == "":
                phase = self.name_phases[name] = op_name_phase(name)
            if phase is None and not info.silent:
                phase = "forward"
        if phase == "optimizer" and inputs:
            self.updated.add(inputs[0].name)  # type: ignore[arg-type]
        macs = matmul_macs(inputs, outputs) if name in MATMUL_OPS else None
        kernel = attributes.get("cs.kernel")
        partition = None
        if kernel is not None:
            ops = self.kernels.get(kernel)
            if ops is None:
                ops = self.kernels[kernel] = []
            ops.append(op_id)
            partition = self.partition_ids.get(kernel)
            if partition is None:
                partition = self.partition_ids[kernel] = kernel_partition_id(kernel, self.compile_hash)
        operator = self.operators[index] = RecoveredOperator(
            op_id,
            name,
            index,
            attributes.get("cs.layer"),
            tuple(inputs),
            tuple(outputs),
            macs,
            None if macs is None else 2 * macs,
            total,
            info.source,
            info.module_path,
            phase,
            partition,
            None,
            attributes,
            info.stack if len(info.stack) > 1 else (),
        )
        return operator.id

    def recovery(self, parser: str, extra: dict[str, Any]) -> Recovery:
        operators = tuple(op for op in self.operators if op is not None)
        updated = self.updated
        tensors = tuple(
            RecoveredTensor(
                value.name,
                producer,
                tuple(consumers),
                value.shape,
                value.dtype,
                value.bytes,
                value.name in updated,
                name,
            )
            for producer, consumers, value, name in self.tensors
        )
        partitions = tuple(
            RecoveredPartition(
                id=kernel_partition_id(kernel, self.compile_hash),
                kind="kernel",
                operator_ids=tuple(ids),
                attributes={"name": kernel, "compile_hash": self.compile_hash},
            )
            for kernel, ids in self.kernels.items()
        )
        functions = {name: 0 for name in self.functions.values()}
        for (scope, _), count in self.counters.items():
            name = self.functions.get(scope, scope)
            functions[name] = functions.get(name, 0) + count
        phases: dict[str, int] = {}
        for op in operators:
            phases[str(op.phase)] = phases.get(str(op.phase), 0) + 1
        read = f"{len(operators)} CIRH ops read by the {parser}"
        if "parser_fallback" in extra:
            ir_note = CoverageNote(
                "compiler_ir",
                Coverage.PARTIAL,
                f"{read}: the MLIR parser rejected the dump "
                f"({extra['parser_fallback']}); lines are read, not verified",
            )
        else:
            ir_note = CoverageNote(
                "compiler_ir",
                Coverage.RECOVERED,
                read + (f" ({extra['parser_choice']})" if "parser_choice" in extra else ""),
            )
        notes = [
            ir_note,
            CoverageNote(
                "per_op_timing", Coverage.NOT_EXPOSED, "a CIRH dump is the program, not its execution"
            ),
        ]
        return Recovery(
            backend=BACKEND,
            sources=(source_artifact(self.path, CirhReader.format, parser),),
            operators=operators,
            tensors=tensors,
            partitions=partitions,
            coverage=tuple(notes),
            attributes={
                "cirh": {
                    "path": str(self.path),
                    "compile_hash": self.compile_hash,
                    "parser": parser,
                    "functions": functions,
                    "phases": phases,
                    **extra,
                }
            },
        )


def matmul_macs(inputs: Sequence[ValueInfo], outputs: Sequence[ValueInfo]) -> int | None:
    if len(inputs) < 2 or len(outputs) != 1:
        return None
    lhs, rhs, out = inputs[0].shape, inputs[1].shape, outputs[0].shape
    if not lhs or not rhs or len(rhs) < 2 or out is None or None in lhs or None in rhs or None in out:
        return None
    if lhs[-1] != rhs[-2]:
        return None
    elements = 1
    for dim in out:
        elements *= dim  # type: ignore[operator]
    return elements * lhs[-1]  # type: ignore[operator]


# -- locations (line reader) -------------------------------------------------------------

_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_FILE_RE = re.compile(rf"({_STRING}):(\d+):(\d+)(?: to (?:\d+:)?\d+)?")
_STRING_RE = re.compile(_STRING)
_ALIAS_USE_RE = re.compile(r"#([\w.$-]+)")
_FAST_NAMED_RE = re.compile(rf"^({_STRING})\(#([\w.$-]+)\)$")
_FAST_CALLSITE_RE = re.compile(r"^callsite\(#([\w.$-]+) at #([\w.$-]+)\)$")


def _unquote(text: str) -> str:
    body = text[1:-1]
    if "\\" not in body:
        return body
    return re.sub(r'\\(["\\])|\\([0-9A-Fa-f]{2})', lambda m: m.group(1) or chr(int(m.group(2), 16)), body)


class _Locations:
    """``loc(...)`` texts → :mod:`dfit_mlir.core.locations` trees, aliases resolved lazily."""

    def __init__(self, path: Path, aliases: dict[str, tuple[str, int]]):
        self.path = path
        self.aliases = aliases
        self.resolved: dict[str, Loc] = {}
        self.parsed: dict[str, Loc] = {}
        self.resolving: set[str] = set()

    def alias(self, name: str, line: int | None) -> Loc:
        found = self.resolved.get(name)
        if found is not None:
            return found
        if name not in self.aliases:
            raise ArtifactError.at(self.path, line, f"location alias #{name} is not defined")
        if name in self.resolving:
            raise ArtifactError.at(
                self.path, self.aliases[name][1], f"location alias #{name} refers to itself"
            )
        self.resolving.add(name)
        text, alias_line = self.aliases[name]
        loc = self.read(text, alias_line)
        self.resolving.discard(name)
        self.resolved[name] = loc
        return loc

    def parse(self, text: str, line: int | None) -> Loc:
        """An inline location (cached: the same text recurs on many ops)."""
        found = self.parsed.get(text)
        if found is None:
            found = self.parsed[text] = self.read(text, line)
        return found

    def read(self, text: str, line: int | None) -> Loc:
        # The shapes the printer writes aliases in, by one regex each; the rest by the
        # general parser.
        first = text[:1]
        if first == "#" and " " not in text and "(" not in text:
            loc = self.alias(text[1:], line)
        elif first == "c" and (match := _FAST_CALLSITE_RE.match(text)) is not None:
            loc = CallSiteLoc(self.alias(match.group(1), line), self.alias(match.group(2), line))
        elif first == '"' and text[-1] == '"' and text.count('"') == 2 and "\\" not in text:
            loc = NameLoc(text[1:-1])  # a plain name: function arguments
        elif first == '"' and (match := _FAST_NAMED_RE.match(text)) is not None:
            child = self.alias(match.group(2), line)
            loc = NameLoc(_unquote(match.group(1)), None if child is locations.UNKNOWN else child)
        else:
            if text.count("(") > _MAX_LOC_NESTING:
                # parse_at recurses once per nested location.
                raise ArtifactError.at(
                    self.path, line, f"location nested deeper than {_MAX_LOC_NESTING} ({len(text)} characters)"
                )
            loc, end = self.parse_at(text, 0, line)
            if end != len(text):
                raise ArtifactError.at(self.path, line, f"unreadable location {text[:160]!r}")
        return loc

    def parse_at(self, text: str, pos: int, line: int | None) -> tuple[Loc, int]:
        def fail() -> ArtifactError:
            return ArtifactError.at(self.path, line, f"unreadable location {text!r} at column {pos + 1}")

        if text.startswith("#", pos):
            match = _ALIAS_USE_RE.match(text, pos)
            if match is None:
                raise fail()
            return self.alias(match.group(1), line), match.end()
        if text.startswith("unknown", pos):
            return locations.UNKNOWN, pos + len("unknown")
        if text.startswith("callsite(", pos):
            callee, pos = self.parse_at(text, pos + len("callsite("), line)
            if not text.startswith(" at ", pos):
                raise fail()
            caller, pos = self.parse_at(text, pos + 4, line)
            if not text.startswith(")", pos):
                raise fail()
            return CallSiteLoc(callee, caller), pos + 1
        if text.startswith("fused", pos):
            pos += len("fused")
            if text.startswith("<", pos):  # fusion metadata: skip to its matching '>'
                depth = 0
                while pos < len(text):
                    depth += {"<": 1, ">": -1}.get(text[pos], 0)
                    pos += 1
                    if depth == 0:
                        break
            if not text.startswith("[", pos):
                raise fail()
            pos += 1
            items: list[Loc] = []
            while not text.startswith("]", pos):
                item, pos = self.parse_at(text, pos, line)
                items.append(item)
                if text.startswith(", ", pos):
                    pos += 2
                elif not text.startswith("]", pos):
                    raise fail()
            return FusedLoc(tuple(items)), pos + 1
        match = _FILE_RE.match(text, pos)
        if match:
            return FileLoc(_unquote(match.group(1)), int(match.group(2)), int(match.group(3))), match.end()
        match = _STRING_RE.match(text, pos)
        if match is None:
            raise fail()
        name, pos = _unquote(match.group(0)), match.end()
        if text.startswith("(", pos):
            child, pos = self.parse_at(text, pos + 1, line)
            if not text.startswith(")", pos):
                raise fail()
            return NameLoc(name, None if child is locations.UNKNOWN else child), pos + 1
        return NameLoc(name), pos


# -- the line reader ---------------------------------------------------------------------

_ALIAS_DEF_RE = re.compile(r"^#([\w.$-]+) = loc\((.*)\)[ \t]*$", re.M)
_FUNC_RE = re.compile(
    r'^\s*func\.func\s+(?:(?:public|private|nested)\s+)?@("(?:[^"\\]|\\.)*"|[\w$.-]+)\((.*)$'
)
_ARG_SPLIT_RE = re.compile(r",\s+(?=%[\w$.-]+\s*:)")
_ARG_RE = re.compile(r"^(%[\w$.-]+)\s*:\s*(.*?)(?:\s+\{.*\})?(?:\s+loc\((.*)\))?$")
_CUSTOM_RE = re.compile(
    r"^\s*(?:(?P<res>%[^=]*?)\s*=\s*)?(?P<name>[A-Za-z_][\w$]*\.[\w.$]+)(?P<rest>(?:\s.*)?)$"
)
_RESULT_RE = re.compile(r"^(%[\w$.-]+)(?::(\d+))?$")
_VALUE_RE = re.compile(r"%[\w$.-]+(?:#\d+)?")
_OPERANDS_RE = re.compile(r"%[\w$.-]+(?:#\d+)?(?:, %[\w$.-]+(?:#\d+)?)*")
#: ``%r:2 = "dialect.op"(%a, %b) {attrs} : (types) -> types loc(...)`` as printed.
_PRINTED_OP_RE = re.compile(
    r'^ *(?:(%[\w$.-]+)(?::(\d+))? = )?"([^"]+)"\(([^()]*)\)'
    r"(?: \{(.*)\})? : (\([^()]*\) -> (?:\([^()]*\)|[^ ()]+))(?: loc\((.*)\))?$"
)
_REGION_CLOSE_RE = re.compile(r"^\s*\}\)(?P<rest>.*)$")
_NOT_OPS = ("return ", "func.return", "module", "}", "^", "func.func", "//")


def split_top(text: str) -> list[str]:
    """Split on ``, `` outside brackets and strings (``tensor<4xf32, #enc>`` stays whole)."""
    if not text:
        return []
    parts = text.split(", ")
    if all(_balanced(part) for part in parts):
        return parts
    merged: list[str] = []
    current: str | None = None
    for part in parts:
        current = part if current is None else f"{current}, {part}"
        if _balanced(current):
            merged.append(current)
            current = None
    if current is not None:
        merged.append(current)
    return merged


def _balanced(text: str) -> bool:
    return (
        text.count("<") == text.count(">") - text.count("->")
        and text.count("(") == text.count(")")
        and text.count("[") == text.count("]")
        and text.count("{") == text.count("}")
        and (text.count('"') - text.count('\\"')) % 2 == 0
    )


def attribute_value(text: str) -> str:
    """An attribute's text as both parsers give it: string attributes unquoted, the rest
    as printed (``-1 : i64``, ``array<i64: 0, 2>``)."""
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        body = text[1:-1]
        if '"' not in body and "\\" not in body:
            return body
        if _STRING_RE.fullmatch(text):
            return _unquote(text)
    return text


_ATTR_KEY = r'(?:[A-Za-z_][\w.$-]*|"[^"\\]*")'
#: ``key = "string"`` (the string's body in group 2) or ``key = literal`` without
#: brackets (``-1 : i64``, in group 3).
_FAST_ATTR_ITEM_RE = re.compile(
    rf'({_ATTR_KEY}) = (?:"([^"\\]*(?:\\.[^"\\]*)*)"|([^",<>()\[\]{{}}]+))(?:, |$)'
)


def parse_attribute_dict(body: str) -> dict[str, str]:
    items = _FAST_ATTR_ITEM_RE.findall(body)
    if len(items) == body.count(" = ") == body.count(", ") + 1:
        # Every value a string or a bracket-free literal (`-1 : i64`): one regex pass. A
        # value with brackets (`array<i64: 0, 1>`), a unit attribute, or ', ' / ' = '
        # inside a string fails the counts and takes the general path.
        return {
            (_unquote(key) if key[0] == '"' else key): (
                literal or (_unquote(f'"{string}"') if "\\" in string else string)
            )
            for key, string, literal in items
        }
    attributes: dict[str, str] = {}
    for part in split_top(body.strip()):
        key, equals, value = part.partition(" = ")
        key = key.strip()
        if key.startswith('"'):
            key = _unquote(key)
        attributes[key] = attribute_value(value.strip()) if equals else "unit"
    return attributes


def _matching(text: str, pos: int, open_: str, close: str) -> int:
    """Index just past the bracket closing the one at ``pos`` (quotes respected); -1
    when the text ends first."""
    closing = locations.closing_paren(text, pos, open_ + close)
    return closing + 1 if closing >= 0 else -1


class _LineReader:
    def __init__(self, path: Path, text: str, builder: _Builder):
        self.path = path
        self.lines = text.split("\n")
        self.builder = builder
        aliases = {}
        number, counted = 1, 0
        for match in _ALIAS_DEF_RE.finditer(text):
            number += text.count("\n", counted, match.start())
            counted = match.start()
            aliases[match.group(1)] = (match.group(2), number)
        self.locations = _Locations(path, aliases)
        #: A dump has few distinct type signatures and many ops of each.
        self.signatures: dict[str, tuple[list[str], list[str]]] = {}
        #: (line, op name, operand keys, attributes, loc text, reserved id) of ops with regions
        self.open_regions: list[
            tuple[int, str, list[str], list[str], dict[str, str], tuple[str, int] | None]
        ] = []
        #: Whether the next '^bb0(...)' holds the arguments of a generic-form function.
        self.block_arguments = False

    def read(self) -> None:
        for number, line in enumerate(self.lines, start=1):
            stripped = line.lstrip()
            if not stripped or stripped[0] == "#" or stripped.startswith("//"):
                continue
            first = stripped[0]
            if first == "%" or first == '"':
                self.op(number, line)
            elif stripped.startswith("func.func"):
                self.function(number, line)
            elif stripped.startswith("})"):
                self.close_region(number, line)
            elif stripped.startswith("^bb"):
                self.block_label(number, stripped)
            elif not stripped.startswith(_NOT_OPS) and _CUSTOM_RE.match(line):
                self.op(number, line)
        if self.open_regions:
            raise ArtifactError.at(self.path, self.open_regions[-1][0], "op region is never closed")

    def loc(self, text: str | None, line: int) -> Loc:
        if text is None:
            return locations.UNKNOWN
        if text[0] == "#" and " " not in text:
            return self.locations.alias(text[1:], line)
        return self.locations.parse(text, line)

    def function(self, number: int, line: str) -> None:
        """``func.func @name(%arg0: type loc(...), ...) -> types {`` (custom form)."""
        match = _FUNC_RE.match(line)
        if match is None:
            raise ArtifactError.at(self.path, number, "unreadable func.func signature")
        name = match.group(1)
        self.builder.function(_unquote(name) if name.startswith('"') else name)
        signature = match.group(2)
        end = signature.rfind(") -> ")
        if end < 0:
            end = signature.rstrip(" {").rfind(")")
        self.arguments(number, signature[:end])

    def block_label(self, number: int, stripped: str) -> None:
        """``^bb0(%a: type loc(...), ...):``: the arguments of a generic-form function,
        or of a block of the innermost open op region (``<op id>/bb<n>``)."""
        label, paren, rest = stripped.partition("(")
        if not paren:
            return  # a block without arguments
        args_text = rest[: rest.rstrip().rfind("):")]
        if self.block_arguments:
            self.block_arguments = False
            self.arguments(number, args_text)
        elif self.open_regions and self.open_regions[-1][5] is not None:
            owner = self.open_regions[-1][5][0]
            self.arguments(number, args_text, block=f"{owner}/{label[1:]}")

    def arguments(self, number: int, args_text: str, block: str | None = None) -> None:
        if not args_text.strip():
            return
        for index, arg in enumerate(_ARG_SPLIT_RE.split(args_text)):
            arg_match = _ARG_RE.match(arg.strip())
            if arg_match is None:
                raise ArtifactError.at(self.path, number, f"unreadable function argument {arg!r}")
            loc_text = arg_match.group(3)
            loc = self.locations.parse(loc_text, number) if loc_text else None
            self.builder.argument(arg_match.group(1), index, arg_match.group(2), loc, block)

    def results(self, number: int, text: str | None) -> list[str]:
        if not text:
            return []
        if "," not in text and ":" not in text:
            return [text.strip()]
        names: list[str] = []
        for item in text.split(","):
            match = _RESULT_RE.match(item.strip())
            if match is None:
                raise ArtifactError.at(self.path, number, f"unreadable result {item.strip()!r}")
            count = match.group(2)
            names += (
                [match.group(1)] if count is None else [f"{match.group(1)}#{i}" for i in range(int(count))]
            )
        return names

    def op(self, number: int, line: str) -> None:
        match = _PRINTED_OP_RE.match(line)
        if match is not None:
            self.printed_op(number, match)
            return
        stripped = line.lstrip()
        results_text = None
        body = stripped
        if stripped[0] == "%":
            equals = stripped.find(" = ")
            if equals > 0:
                results_text, body = stripped[:equals], stripped[equals + 3 :]
        if body[:1] == '"':
            quote = body.find('"', 1)
            close = body.find(")", quote + 2) if body[quote + 1 : quote + 2] == "(" else -1
            if quote > 0 and close > 0:
                self.generic(number, body[1:quote], results_text, body[quote + 2 : close], body[close + 1 :])
                return
        match = _CUSTOM_RE.match(line)
        if match is None or match.group("name") in ("func.func",):
            raise ArtifactError.at(self.path, number, "unreadable op line")
        self.custom(number, match)

    def printed_op(self, number: int, match: re.Match[str]) -> None:
        """The common case, an op as the printer writes it (one result name, generic
        form, attributes, signature, location), read by one regex match: this runs once
        per op of dumps of 150k ops."""
        result, count, name, operands_text, attributes_text, signature, loc_text = match.groups()
        if result is None:
            results = []
        elif count is None:
            results = [result]
        else:
            results = [f"{result}#{i}" for i in range(int(count))]
        if not operands_text:
            operands = []
        elif _OPERANDS_RE.fullmatch(operands_text):
            operands = operands_text.split(", ")
        else:
            operands = _VALUE_RE.findall(operands_text)
        attributes = parse_attribute_dict(attributes_text) if attributes_text else {}
        operand_types, result_types = self.signature_types(number, name, signature, operands, results)
        if name in _TERMINATORS:
            return
        self.builder.op(name, results, result_types, operands, attributes, self.loc(loc_text, number), number)

    def signature_types(
        self, number: int, name: str, signature: str, operands: list[str], results: list[str]
    ) -> tuple[list[str], list[str]]:
        """Operand and result types of ``(a, b) -> (c)`` (memoised: dumps repeat a few
        signatures many times), checked against the op's operand and result counts."""
        types = self.signatures.get(signature)
        if types is None:
            arrow = signature.find(") -> ")
            if arrow < 0:
                raise ArtifactError.at(self.path, number, f"{name}: no '(operand types) -> result types'")
            result_text = signature[arrow + 5 :].strip()
            if result_text.startswith("(") and result_text.endswith(")"):
                result_text = result_text[1:-1]
            types = self.signatures[signature] = (split_top(signature[1:arrow]), split_top(result_text))
        operand_types, result_types = types
        if len(operand_types) != len(operands) or len(result_types) != len(results):
            raise ArtifactError.at(
                self.path,
                number,
                f"{name}: {len(operands)} operands and {len(results)} results but a "
                f"signature of {len(operand_types)} -> {len(result_types)}",
            )
        return operand_types, result_types

    def split_loc(self, rest: str) -> tuple[str, str | None]:
        rest = rest.rstrip()
        at = rest.rfind(" loc(")
        if at >= 0 and rest.endswith(")"):
            return rest[:at], rest[at + 5 : -1]
        return rest, None

    def generic(
        self, number: int, name: str, results_text: str | None, operands_text: str, rest: str
    ) -> None:
        results = self.results(number, results_text)
        operands = operands_text.split(", ") if operands_text else []
        if not all(item[:1] == "%" and " " not in item and "," not in item for item in operands):
            operands = _VALUE_RE.findall(operands_text)
        rest = rest.strip()
        attributes: dict[str, str] = {}
        if rest.startswith("<{"):
            end = _matching(rest, 1, "{", "}")
            attributes.update(parse_attribute_dict(rest[2 : end - 1]))
            rest = rest[end + 1 :].strip()
        if rest.startswith("({"):
            if name in _STRUCTURE:
                # A module or a function in generic form: its block arguments come on
                # the next '^bb0(...)' line, its '})' closes no operator.
                if name == "func.func":
                    self.builder.function(attributes.get("sym_name", "func"))
                    self.block_arguments = True
                self.open_regions.append((number, name, [], [], {}, None))
                return
            if name in _TERMINATORS:
                return
            reserved = self.builder.reserve(name)
            self.open_regions.append((number, name, operands, results, attributes, reserved))
            return
        self.finish_generic(number, name, results, operands, attributes, rest, None)

    def close_region(self, number: int, line: str) -> None:
        if not self.open_regions:
            raise ArtifactError.at(self.path, number, "'})' closes no op region")
        _, name, operands, results, attributes, reserved = self.open_regions.pop()
        if reserved is None:
            return
        match = _REGION_CLOSE_RE.match(line)
        assert match is not None
        self.finish_generic(
            number, name, results, operands, attributes, match.group("rest").strip(), reserved
        )

    def finish_generic(
        self,
        number: int,
        name: str,
        results: list[str],
        operands: list[str],
        attributes: dict[str, str],
        rest: str,
        reserved: tuple[str, int] | None,
    ) -> None:
        rest, loc_text = self.split_loc(rest)
        signature_at = rest.rfind(" : (")
        if signature_at >= 0:
            head, signature = rest[:signature_at].strip(), rest[signature_at + 3 :].strip()
        elif rest.startswith(": ("):
            head, signature = "", rest[2:].strip()
        else:
            raise ArtifactError.at(self.path, number, f"{name}: no type signature")
        if head.startswith("{") and head.endswith("}"):
            attributes.update(parse_attribute_dict(head[1:-1]))
        operand_types, result_types = self.signature_types(number, name, signature, operands, results)
        if name in _TERMINATORS:
            return
        self.builder.op(
            name, results, result_types, operands, attributes, self.loc(loc_text, number), number, reserved
        )

    def custom(self, number: int, match: re.Match[str]) -> None:
        """``%r = dialect.Op %a, %b {attrs} : type loc(...)``: the custom assembly the
        parser rejects for an unregistered op. Operand types come from their producers;
        the trailing type is the result type (or a functional type)."""
        name = match.group("name")
        results = self.results(number, match.group("res"))
        rest, loc_text = self.split_loc(match.group("rest").strip())
        attributes: dict[str, str] = {}
        brace = rest.find("{")
        colon = rest.rfind(" : ")
        operand_end = min(i for i in (brace, colon, len(rest)) if i >= 0)
        operands = _VALUE_RE.findall(rest[:operand_end])
        if brace >= 0 and (colon < 0 or brace < colon):
            end = _matching(rest, brace, "{", "}")
            attributes.update(parse_attribute_dict(rest[brace + 1 : end - 1]))
        type_text = rest[colon + 3 :].strip() if colon >= 0 else ""
        if type_text.startswith("(") and ") -> " in type_text:
            type_text = type_text[type_text.index(") -> ") + 5 :].strip()
            if type_text.startswith("(") and type_text.endswith(")"):
                type_text = type_text[1:-1]
        types = split_top(type_text)
        if len(types) == 1 and len(results) > 1:
            types = types * len(results)
        if len(types) != len(results):
            raise ArtifactError.at(
                self.path, number, f"{name}: {len(results)} results but types {type_text!r}"
            )
        if name in _TERMINATORS:
            return
        self.builder.op(name, results, types, operands, attributes, self.loc(loc_text, number), number)


# -- the bindings walk -------------------------------------------------------------------


def _read_with_bindings(path: Path, text: str, builder: _Builder) -> str | None:
    """Walk the dump with the MLIR parser; returns None, or the parser's diagnostic when
    it rejects the text (nothing is added to ``builder`` then)."""
    from iree.compiler import ir

    from dfit_mlir.passes.mlir_engine import to_loc

    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as error:
            lines = [line.strip() for line in str(error).splitlines() if line.strip().startswith("error:")]
            first = lines[0][len("error:") :].strip() if lines else "rejected by the MLIR parser"
            return first.replace('"-":', f"{path}:", 1)
        loc_cache: dict[Any, Loc] = {}
        for function in module.body.operations:
            function = function.operation
            if function.name != "func.func":
                _walk_ops(function, builder, loc_cache, to_loc, ir)
                continue
            builder.function(ir.StringAttr(function.attributes["sym_name"]).value)
            region = function.regions[0]
            if not region.blocks:
                continue
            for index, argument in enumerate(region.blocks[0].arguments):
                loc = to_loc(argument.location, loc_cache)
                builder.argument(argument, index, str(argument.type), loc)
            _walk_ops(function, builder, loc_cache, to_loc, ir, skip_root=True)
        del module
    return None


def _walk_ops(
    root: Any,
    builder: _Builder,
    loc_cache: dict[Any, Loc],
    to_loc: Callable[..., Loc],
    ir: Any,
    skip_root: bool = False,
) -> None:
    ops: list[Any] = []

    def visit(op: Any) -> Any:
        ops.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit, ir.WalkOrder.PRE_ORDER)
    for op in ops[1:] if skip_root else ops:
        name = op.name
        if name in _TERMINATORS:
            continue
        named = op.attributes
        attributes = {key: attribute_value(str(named[key])) for key in named}
        location = op.location
        loc = to_loc(location, loc_cache)
        results = list(op.results)
        op_id = builder.op(
            name, results, [str(result.type) for result in results], list(op.operands), attributes, loc, None
        )
        for region in op.regions:
            for number, block in enumerate(region.blocks):
                for index, argument in enumerate(block.arguments):
                    builder.argument(
                        argument,
                        index,
                        str(argument.type),
                        to_loc(argument.location, loc_cache),
                        block=f"{op_id}/bb{number}",
                    )


class CirhReader:
    """A CIRH MLIR dump: operators with shapes, attributes, locations, phase, module path,
    kernel; tensors with producer and consumers."""

    format: ClassVar[str] = "cerebras-cirh"

    def __init__(self, path: Path, parser: str = "auto", scope_prefix: str = ""):
        if parser not in ("auto", MLIR_BINDINGS, LINE_READER):
            raise ValueError(f"parser must be auto, {MLIR_BINDINGS} or {LINE_READER}, not {parser!r}")
        self.path = Path(path)
        self.parser = parser
        self.scope_prefix = scope_prefix

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        if path.suffix != ".mlir":
            return False
        return _NAME_RE.search(path.name) is not None or b'"cirh.' in head or b" cirh." in head

    @paused_gc()
    def read(self) -> Recovery:
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            line = self.path.read_bytes()[: error.start].count(b"\n") + 1
            raise ArtifactError.at(self.path, line, f"not UTF-8 text ({error.reason})") from None
        compile_hash = compile_hash_of(self.path)
        extra: dict[str, Any] = {}
        depth = region_depth(text) if len(text) <= BINDINGS_MAX_BYTES else 0
        use_bindings = self.parser == MLIR_BINDINGS or (
            self.parser == "auto" and len(text) <= BINDINGS_MAX_BYTES and depth <= BINDINGS_MAX_DEPTH
        )
        if self.parser == MLIR_BINDINGS and depth > BINDINGS_MAX_DEPTH:
            raise ArtifactError.at(
                self.path, None,
                f"regions nested {depth} deep: over the {BINDINGS_MAX_DEPTH} the MLIR bindings are given "
                "(they recurse); read it with the line reader",
            )
        if use_bindings:
            builder = _Builder(self.path, compile_hash, self.scope_prefix)
            rejected = _read_with_bindings(self.path, text, builder)
            if rejected is None:
                return builder.recovery(MLIR_BINDINGS, extra)
            extra["parser_fallback"] = rejected
        elif self.parser == "auto" and depth > BINDINGS_MAX_DEPTH:
            extra["parser_choice"] = (
                f"line reader: regions nested {depth} deep (the MLIR bindings recurse; limit {BINDINGS_MAX_DEPTH})"
            )
        elif self.parser == "auto":
            extra["parser_choice"] = f"line reader: the dump is over {BINDINGS_MAX_BYTES >> 20} MiB"
        builder = _Builder(self.path, compile_hash, self.scope_prefix)
        _LineReader(self.path, text, builder).read()
        return builder.recovery(LINE_READER, extra)

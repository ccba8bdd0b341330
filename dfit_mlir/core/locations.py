"""Engine-neutral MLIR location trees and what dfit reads out of them.

MLIR and xDSL each have their own location classes; both are converted into the small
frozen records below, so that ID extraction, source attribution and lineage are written
once. The dfit encoding is a NameLoc whose name is ``dfit:<id>`` wrapping the op's
original location, e.g. ``loc("dfit:main/linalg.matmul#0"("model.py":15:9))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Union

DFIT_NAME_PREFIX = "dfit:"


@dataclass(frozen=True, slots=True)
class FileLoc:
    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True, slots=True)
class NameLoc:
    name: str
    child: "Loc | None" = None


@dataclass(frozen=True, slots=True)
class CallSiteLoc:
    callee: "Loc"
    caller: "Loc"


@dataclass(frozen=True, slots=True)
class FusedLoc:
    locations: tuple["Loc", ...]


@dataclass(frozen=True, slots=True)
class UnknownLoc:
    pass


Loc = Union[FileLoc, NameLoc, CallSiteLoc, FusedLoc, UnknownLoc]
UNKNOWN = UnknownLoc()


def walk(loc: Loc) -> Iterator[Loc]:
    """Pre-order walk over every node of a location tree."""
    stack = [loc]
    while stack:
        node = stack.pop()
        yield node
        match node:
            case NameLoc(child=child) if child is not None:
                stack.append(child)
            case CallSiteLoc(callee=callee, caller=caller):
                stack.extend((caller, callee))
            case FusedLoc(locations=locations):
                stack.extend(reversed(locations))


def dfit_ids(loc: Loc) -> tuple[str, ...]:
    """The dfit IDs an op's location tree names as the op's own origin, in pre-order and
    without repeats: through name and fused locations and the callee side of call sites.

    The caller side of a call site is context, not origin: when IREE inlines a function,
    every inlined op gets ``callsite(<op loc> at <call loc>)``, and the call op's (or the
    function's) ID there says where the op was called from, not what it came from.
    """
    found: dict[str, None] = {}
    stack = [loc]
    while stack:
        node = stack.pop()
        match node:
            case NameLoc(name=name, child=child):
                if name.startswith(DFIT_NAME_PREFIX):
                    found.setdefault(name[len(DFIT_NAME_PREFIX) :], None)
                if child is not None:
                    stack.append(child)
            case CallSiteLoc(callee=callee):
                stack.append(callee)
            case FusedLoc(locations=locations):
                stack.extend(reversed(locations))
    return tuple(found)


def dfit_context_ids(loc: Loc) -> tuple[str, ...]:
    """dfit IDs on the caller side of call-site locations (call ops, inlined functions)."""
    found: dict[str, None] = {}
    for node in walk(loc):
        if isinstance(node, CallSiteLoc):
            for item in dfit_ids(node.caller):
                found.setdefault(item, None)
    return tuple(found)


def strip_dfit(loc: Loc) -> Loc:
    """The location with every dfit NameLoc replaced by its child (the original)."""
    match loc:
        case NameLoc(name=name, child=child) if name.startswith(DFIT_NAME_PREFIX):
            return strip_dfit(child) if child is not None else UNKNOWN
        case NameLoc(name=name, child=child):
            return NameLoc(name, strip_dfit(child) if child is not None else None)
        case CallSiteLoc(callee=callee, caller=caller):
            return CallSiteLoc(strip_dfit(callee), strip_dfit(caller))
        case FusedLoc(locations=locations):
            return FusedLoc(tuple(strip_dfit(item) for item in locations))
    return loc


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """What a location says about where an op came from."""

    file_loc: FileLoc | None
    """The innermost file:line:col of the op itself (the callee end of a call chain)."""
    name_path: tuple[str, ...]
    """Non-dfit NameLoc names from outermost to innermost (TFLite tensor names, JAX
    scopes, ONNX node names)."""
    call_stack: tuple[FileLoc, ...]
    """File locations of a call-site chain, innermost (callee) first."""


def source_info(loc: Loc) -> SourceInfo:
    """Source file, name path and call stack of the first non-fused branch of ``loc``.

    Names come from the callee side (the op's own scope names, e.g. ``conv1``); the call
    stack lists every file location from the callee outwards through the callers.
    """
    names: list[str] = []
    stack: list[FileLoc] = []
    pending: list[Loc] = [loc]  # callee first, then each caller outwards
    while pending:
        node: Loc | None = pending.pop(0)
        first_frame = not stack
        while node is not None:
            match node:
                case NameLoc(name=name, child=child):
                    if first_frame and not name.startswith(DFIT_NAME_PREFIX):
                        names.append(name)
                    node = child
                case CallSiteLoc(callee=callee, caller=caller):
                    pending.insert(0, caller)
                    node = callee
                case FusedLoc(locations=locations):
                    node = locations[0] if locations else None
                case FileLoc():
                    stack.append(node)
                    node = None
                case _:
                    node = None
    return SourceInfo(stack[0] if stack else None, tuple(names), tuple(stack))


def render(loc: Loc) -> str:
    """MLIR textual form (without the ``loc(...)`` wrapper)."""
    match loc:
        case FileLoc(file=file, line=line, col=col):
            return f"{_quote(file)}:{line}:{col}"
        case NameLoc(name=name, child=child):
            return _quote(name) if child is None else f"{_quote(name)}({render(child)})"
        case CallSiteLoc(callee=callee, caller=caller):
            return f"callsite({render(callee)} at {render(caller)})"
        case FusedLoc(locations=locations):
            return "fused[" + ", ".join(render(item) for item in locations) + "]"
    return "unknown"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --- the source model's frames ---------------------------------------------------------

#: Files that name a model artifact, not source code: converters give their ops
#: ``loc("<tensor>"("model.tflite":0:0))``; such a frame has no line to read.
ARTIFACT_SUFFIXES = (".tflite", ".onnx", ".pb", ".mlirbc")


def is_source_line(frame: dict | FileLoc | None) -> bool:
    """Whether a frame points at a line of source code (not line 0 of a model file)."""
    if frame is None:
        return False
    file, line = (frame.get("file"), frame.get("line")) if isinstance(frame, dict) else (frame.file, frame.line)
    return bool(file) and (line or 0) > 0 and not str(file).endswith(ARTIFACT_SUFFIXES)


def model_frame(frames: list[dict] | tuple[dict, ...], is_model_code: Callable[[str], bool]) -> dict | None:
    """The innermost frame of ``frames`` (innermost first) that is model code: a source
    line whose file ``is_model_code`` accepts (see :class:`dfit_mlir.frontends.CodeRules`)."""
    return next((frame for frame in frames if is_source_line(frame) and is_model_code(frame["file"])), None)

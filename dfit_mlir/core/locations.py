"""Engine-neutral MLIR location trees and what dfit reads out of them.

MLIR and xDSL each have their own location classes; both are converted into the small
frozen records below, so that ID extraction, source attribution and lineage are written
once. The dfit encoding is a NameLoc whose name is ``dfit:<id>`` wrapping the op's
original location, e.g. ``loc("dfit:main/linalg.matmul#0"("model.py":15:9))``.
"""

from __future__ import annotations

import re
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


# --- location chains in messages -------------------------------------------------------

#: A quoted file location as MLIR prints it, with an optional range: ``"m.py":7:23 to :39``.
_PRINTED_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)(?: to (?:\d+)?:\d+)?')
#: ``file:line:col: note: called from``: one frame of a call-site chain in a diagnostic,
#: followed by its indented source line and caret.
_CALLED_FROM = re.compile(r"^(?P<file>\S.*?):(?P<line>\d+):(?P<col>\d+): note: called from$")


@dataclass(frozen=True, slots=True)
class FrameFilter:
    """Which frames of a location chain a message keeps: ``keep(file)`` for the model's
    files; ``owner(file)`` names what a cut frame belongs to (``dfit``, ``click``, ``the
    standard library``) so that the message says what it left out."""

    keep: Callable[[str], bool]
    owner: Callable[[str], str]


def cut_location_chains(text: str, frames: FrameFilter) -> str:
    """``text`` (a compiler's diagnostics) with every call-site chain cut to the frames
    ``frames.keep`` accepts, saying how many were cut and whose they were.

    Two shapes are cut: a printed ``loc(callsite(... at callsite(...)))`` (a diagnostic
    of the compiler library, whose location is not a plain file) becomes
    ``loc(<dfit ID> at model.py:7:23; 17 frames of dfit, click cut)``; and the
    ``file:line:col: note: called from`` notes a diagnostic lists per frame (with their
    source line) lose the cut frames' notes, one ``note:`` line saying what went. A
    chain none of whose frames is kept keeps its innermost one (where the op is)."""
    text = _cut_printed_locations(text, frames)
    return _cut_called_from_notes(text, frames)


def _cut_printed_locations(text: str, frames: FrameFilter) -> str:
    pieces, start = [], 0
    while (found := text.find("loc(callsite(", start)) >= 0:
        end = closing_paren(text, found + 3)
        if end < 0:
            break
        pieces.append(text[start:found])
        pieces.append(_cut_printed_location(text[found:end + 1], frames))
        start = end + 1
    pieces.append(text[start:])
    return "".join(pieces)


def closing_paren(text: str, opening: int, pair: str = "()") -> int:
    """Index of the bracket closing ``text[opening]`` (``pair``: its opening and closing
    characters: ``()``, ``{}``), skipping quoted strings; -1 when the text ends first (a
    diagnostic or an IR line cut short)."""
    open_char, close_char = pair[0], pair[1]
    depth, index, quoted = 0, opening, False
    while index < len(text):
        char = text[index]
        if quoted:
            if char == "\\":
                index += 1
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == open_char:
            depth += 1
        elif char == close_char:
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return -1


def _cut_printed_location(location: str, frames: FrameFilter) -> str:
    """One printed ``loc(...)``: its frames in order (callee first), the kept ones
    rendered ``file:line:col``, the cut ones counted; unchanged when nothing is cut."""
    found = [(match.group(1), f"{match.group(1)}:{match.group(2)}:{match.group(3)}")
             for match in _PRINTED_FILE_LOC.finditer(location)]
    kept = [where for file, where in found if frames.keep(file)] or [where for _, where in found[:1]]
    cut = [file for file, where in found if where not in kept]
    if not cut:
        return location
    ids = [name for name in re.findall(r'"(dfit:[^"]+)"', location)[:1]]
    kept = list(dict.fromkeys(kept))  # a frame printed as both the op's and its call's
    return f"loc({' at '.join(ids + kept)}; {_cut_summary(cut, frames)})"


def _cut_summary(cut: list[str], frames: FrameFilter) -> str:
    owners = list(dict.fromkeys(frames.owner(file) for file in cut))
    return f"{len(cut)} frame{'s' * (len(cut) != 1)} of {', '.join(owners)} cut"


def _cut_called_from_notes(text: str, frames: FrameFilter) -> str:
    lines = text.split("\n")
    output: list[str] = []
    cut: list[str] = []
    summary_at = -1
    index = 0
    while index < len(lines):
        match = _CALLED_FROM.match(lines[index])
        # The frame's note, then its source line and caret (indented).
        block_end = index + 1
        while match and block_end < len(lines) and lines[block_end][:1].isspace():
            block_end += 1
        if match and not frames.keep(match.group("file")):
            cut.append(match.group("file"))
            if summary_at < 0:
                summary_at = len(output)
            index = block_end
            continue
        if not match and cut and summary_at >= 0:  # the chain ended: say what went, where it went
            output.insert(summary_at, f"note: {_cut_summary(cut, frames)} (called-from notes)")
            cut, summary_at = [], -1
        output.extend(lines[index:block_end])
        index = block_end
    if cut and summary_at >= 0:
        output.insert(summary_at, f"note: {_cut_summary(cut, frames)} (called-from notes)")
    return "\n".join(output)

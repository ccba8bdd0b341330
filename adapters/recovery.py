"""What a reconstruction reader recovers from a closed backend's artifacts.

Readers (one class per artifact format) return a :class:`Recovery`; a backend merges the
recoveries of every file of one dump into one, and ``dfit reconstruct`` turns that into
the same bundle an IREE run writes (manifest + normalized events). Nothing here knows a
backend: the records are the backend-neutral vocabulary the readers share.

Conventions every reader follows:

* Operator IDs are stable for the same artifact and readable:
  ``<scope>/<op type>#<k>`` with ``k`` counting ops of that type within the scope in
  the artifact's own order (``subgraph0/CONV_2D#3``, ``train/cirh.MatMul#12``,
  ``partition_3_0/linear#0``). Where the backend names an op (a SambaNova operator name,
  a TFLite output tensor name) that name goes into ``name`` and ``module_path``; it is
  not the ID, because vendor names are not unique.
* Sizes are bytes, times seconds, counts plain integers; the original text of a figure
  that was converted (``"4.21MiB"``) is kept in ``attributes`` when it helps a reader
  of the bundle trust the number.
* Nothing is guessed silently: a figure the artifact does not carry stays ``None``, and
  a coverage note says which aspects were recovered, recovered in part, or are not
  exposed by the backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Protocol

from dfit_mlir.core.errors import InvalidInputError


class ArtifactError(InvalidInputError):
    """An artifact a reader recognised but cannot read; the message names the file and
    the line (or record) at fault."""

    #: A message longer than this is cut: a pathological line must not flood the error.
    MAX_MESSAGE = 400

    @classmethod
    def at(cls, path: str | Path, line: int | None, message: str) -> ArtifactError:
        where = f"{path}:{line}" if line is not None else str(path)
        if len(message) > cls.MAX_MESSAGE:
            message = message[: cls.MAX_MESSAGE] + "…"
        error = cls(f"{where}: {message}")
        #: The message without its ``path:line:`` (what a line account lists).
        error.reason = message
        return error


@dataclass(frozen=True)
class SourceLoc:
    """A place in the user's model code (``torch/nn/functional.py:2243``)."""

    file: str
    line: int = 0
    col: int = 0


@dataclass(frozen=True)
class ValueInfo:
    """One operand or result of an operator."""

    name: str | None
    shape: tuple[int | None, ...] | None
    dtype: str | None
    bytes: int | None = None


@dataclass(frozen=True)
class RecoveredOperator:
    id: str
    #: The op type as the backend spells it, with a backend prefix
    #: (``tflite.CONV_2D``, ``cirh.MatMul``, ``sambanova.linear``).
    op: str
    #: Position in the artifact (TFLite operator index, line of a log, ...).
    index: int | None = None
    #: The backend's own name for this op, when it has one.
    name: str | None = None
    inputs: tuple[ValueInfo, ...] = ()
    outputs: tuple[ValueInfo, ...] = ()
    macs: int | None = None
    flops: int | None = None
    bytes: int | None = None
    source: SourceLoc | None = None
    #: Model-code module path, outermost first (``("bert", "encoder", "layer", "3")``).
    module_path: tuple[str, ...] = ()
    #: ``forward`` | ``backward`` | ``optimizer`` | ``None`` when the artifact does not say.
    phase: str | None = None
    #: ID of the :class:`RecoveredPartition` that executes this op, if known.
    partition: str | None = None
    #: Backend mapping status of this op (``"Mapped to Edge TPU"``, ``"cpu"``, ...).
    status: str | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    #: Model-code frames, innermost (callee) first, when the artifact has call chains.
    call_stack: tuple[SourceLoc, ...] = ()


@dataclass(frozen=True)
class RecoveredTensor:
    id: str
    producer: str | None
    consumers: tuple[str, ...]
    shape: tuple[int | None, ...] | None
    dtype: str | None
    bytes: int | None
    #: Weights / parameters (constant buffers) as opposed to activations.
    constant: bool = False
    name: str | None = None


@dataclass(frozen=True)
class RecoveredPartition:
    """A unit the backend schedules: an Edge TPU custom op or the CPU remainder, a
    SambaFlow partition or section, a Cerebras kernel."""

    id: str
    #: ``edgetpu-custom-op``, ``cpu``, ``partition``, ``section``, ``kernel``, ``subgraph``.
    kind: str
    operator_ids: tuple[str, ...] = ()
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Measurement:
    """A figure the backend reported: a compile phase time, a training step's loss and
    rate, a throughput summary, a memory figure, a compiler estimate.

    ``kind`` is one of the normalized event kinds (``compile``, ``program``, ``memory``,
    ``metric``, ...); ``name`` says what was measured (``compile.phase``, ``loss``,
    ``samples_per_sec``, ``on_chip_parameter_bytes``)."""

    kind: str
    name: str
    value: float | None
    unit: str | None = None
    #: Seconds since the epoch (or since the start of the log when only offsets exist).
    start_s: float | None = None
    duration_s: float | None = None
    step: int | None = None
    partition: str | None = None
    ids: tuple[str, ...] = ()
    #: ``path:line`` the figure was read from.
    origin: str | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)


class Coverage(str, Enum):
    RECOVERED = "recovered"
    PARTIAL = "partial"
    NOT_EXPOSED = "not-exposed"


@dataclass(frozen=True)
class CoverageNote:
    """What a reconstruction could say about one aspect (``operators``, ``shapes``,
    ``lineage``, ``per_op_timing``, ``memory``, ``partitions``, ...)."""

    aspect: str
    status: Coverage
    detail: str


@dataclass(frozen=True)
class LineAccount:
    """What became of every line of one text file a reader read: consumed by a rule
    (records and decoration alike) or unparsed. ``problems`` are the unparsed lines a
    rule recognised but could not read, with the reason; ``examples`` the first few
    unparsed lines with their numbers; ``unparsed_ranges`` all of them, as inclusive
    ``(first, last)`` line ranges (so the accounts of two readers of one file merge)."""

    total: int
    consumed: int
    unparsed: int
    examples: tuple[tuple[int, str], ...] = ()
    problems: tuple[tuple[int, str], ...] = ()
    problem_count: int = 0
    unparsed_ranges: tuple[tuple[int, int], ...] = ()
    #: Lines that held NUL bytes (dropped before the rules saw the line): what a writer
    #: that crashed or preallocated its file leaves; the first such line's number.
    nul_lines: int = 0
    first_nul_line: int | None = None

    def as_json(self) -> dict[str, Any]:
        found = {
            "total": self.total,
            "consumed": self.consumed,
            "unparsed": self.unparsed,
            "examples": [[number, text] for number, text in self.examples],
            "problems": [[number, text] for number, text in self.problems],
        }
        if self.nul_lines:
            found["nul_lines"] = self.nul_lines
            found["first_nul_line"] = self.first_nul_line
        return found

    @staticmethod
    def merged(accounts: Sequence[LineAccount]) -> LineAccount:
        """One file read by several readers: a line is unparsed when no reader took it."""
        if len(accounts) == 1:
            return accounts[0]
        unparsed = _intersect([a.unparsed_ranges for a in accounts])
        inside = _membership(unparsed)
        examples = sorted({e for a in accounts for e in a.examples if inside(e[0])})
        problems = sorted({p for a in accounts for p in a.problems if inside(p[0])})
        count = sum(last - first + 1 for first, last in unparsed)
        total = max(a.total for a in accounts)
        nul_lines = max(a.nul_lines for a in accounts)
        first_nul = min((a.first_nul_line for a in accounts if a.first_nul_line is not None), default=None)
        return LineAccount(total, total - count, count, tuple(examples[:8]), tuple(problems[:8]),
                           len(problems), tuple(unparsed), nul_lines, first_nul)


def _intersect(range_lists: Sequence[tuple[tuple[int, int], ...]]) -> tuple[tuple[int, int], ...]:
    result = list(range_lists[0])
    for other in range_lists[1:]:
        merged: list[tuple[int, int]] = []
        i = j = 0
        while i < len(result) and j < len(other):
            first, last = max(result[i][0], other[j][0]), min(result[i][1], other[j][1])
            if first <= last:
                merged.append((first, last))
            if result[i][1] < other[j][1]:
                i += 1
            else:
                j += 1
        result = merged
    return tuple(result)


def _membership(ranges: tuple[tuple[int, int], ...]) -> Any:
    import bisect

    starts = [first for first, _ in ranges]

    def inside(number: int) -> bool:
        at = bisect.bisect_right(starts, number) - 1
        return at >= 0 and ranges[at][0] <= number <= ranges[at][1]

    return inside


@dataclass(frozen=True)
class SourceArtifact:
    """One file a reconstruction read."""

    path: str
    #: Name of the reader class's format (``edgetpu-oplog``, ``cerebras-console-log``).
    format: str
    sha256: str
    #: How it was parsed when there is a choice (``mlir-bindings`` / ``line-reader``).
    parser: str | None = None
    #: What became of each line, for a text file read by the line-reader engine.
    lines: LineAccount | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Recovery:
    backend: str
    sources: tuple[SourceArtifact, ...] = ()
    operators: tuple[RecoveredOperator, ...] = ()
    tensors: tuple[RecoveredTensor, ...] = ()
    partitions: tuple[RecoveredPartition, ...] = ()
    measurements: tuple[Measurement, ...] = ()
    coverage: tuple[CoverageNote, ...] = ()
    #: Model- or run-level facts with no better home (compiler version, compile hash,
    #: job ids, model names of a co-compile, ...).
    attributes: Mapping[str, Any] = field(default_factory=dict)


class ArtifactReader(Protocol):
    """One class per artifact format: ``XReader(path).read()``.

    ``recognises`` looks at the file name and its first bytes only (``head``, at most
    :data:`HEAD_BYTES`), so auto-detection over a whole dump directory stays cheap."""

    format: ClassVar[str]

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool: ...

    def read(self) -> Recovery: ...


#: How much of a file :meth:`ArtifactReader.recognises` gets to see.
HEAD_BYTES = 8192


#: How far a text file's head is read when NUL bytes fill its first :data:`HEAD_BYTES`.
NUL_SCAN_BYTES = 64 * HEAD_BYTES


def read_head(path: Path) -> bytes:
    with path.open("rb") as stream:
        return stream.read(HEAD_BYTES)


def text_head(path: Path, head: bytes) -> bytes:
    """The head a text format is recognised by: the file's first :data:`HEAD_BYTES`
    without NUL bytes. A writer that crashed (or preallocated its file) leaves runs of
    NULs that the line engine drops when it reads the file; they must not push the
    lines that name the format out of the head either."""
    if b"\0" not in head:
        return head
    with path.open("rb") as stream:
        return stream.read(NUL_SCAN_BYTES).replace(b"\0", b"")[:HEAD_BYTES]


def readers_of(readers: Sequence[Any], path: Path) -> list[Any]:
    """The readers (most specific first) that recognise the file ``path``.

    A reader may *claim* a file by its name (``refuses(path, head)``: a ``.tflite`` is a
    TFLite model whatever else it holds) and say why its bytes are not that format; such
    a file is refused (:class:`ArtifactError` naming it and what is wrong) instead of
    being passed over, which would leave a smaller model and no word said. Readers of
    binary formats (``binary = True``) see the raw head; text readers the head without
    NUL bytes (:func:`text_head`)."""
    try:
        head = read_head(path)
    except OSError as error:
        raise ArtifactError.at(path, None, f"cannot read: {error.strerror or error}") from None
    for reader in readers:
        refuses = getattr(reader, "refuses", None)
        why = refuses(path, head) if refuses is not None else None
        if why:
            raise ArtifactError.at(path, None, why)
    text: bytes | None = None
    found = []
    for reader in readers:
        if getattr(reader, "binary", False):
            seen = head
        else:
            text = text_head(path, head) if text is None else text
            seen = text
        if reader.recognises(path, seen):
            found.append(reader)
    return found


def files_of(paths: Sequence[Path | str], readers: Sequence[Any] = ()) -> list[Path]:
    """The files of ``paths`` (directories searched recursively), in a stable order and
    each once. A path that does not exist is an error; so is a directory one of
    ``readers`` claims by its name (a folder called ``model.tflite``)."""
    found: dict[Path, None] = {}
    for given in map(Path, paths):
        if given.is_dir():
            for directory in (given, *sorted(p for p in given.rglob("*") if p.is_dir())):
                for reader in readers:
                    refuses = getattr(reader, "refuses", None)
                    why = refuses(directory, b"") if refuses is not None else None
                    if why:
                        raise ArtifactError.at(directory, None, why)
            for item in sorted(given.rglob("*")):
                if item.is_file():
                    found.setdefault(item, None)
        elif given.is_file():
            found.setdefault(given, None)
        elif given.exists():  # a FIFO or a device: reading it could block forever
            raise ArtifactError.at(given, None, "not a regular file")
        else:
            raise ArtifactError.at(given, None, "no such file or directory")
    return list(found)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_artifact(
    path: Path, format: str, parser: str | None = None, lines: LineAccount | None = None
) -> SourceArtifact:
    return SourceArtifact(path=str(path), format=format, sha256=sha256_of(path), parser=parser, lines=lines)

"""What both structural joins share: the dispatch records (one object per record,
:class:`DispatchEvent`, or columns, :class:`DispatchColumns`), the join's result as
columns (:class:`JoinColumns`), and the join's rules — which recordings a function may
execute (:func:`candidate_recordings`), whether a recording explains a block of records
(:func:`explains`), and where the invocations start (:func:`invocation_starts`).

The per-record join (``hal_profile._join_per_record``, the reference) and the columnar
one (``columnar_join``) both import this module, so that ``columnar_join`` needs nothing
of ``hal_profile`` (which calls it): no import cycle.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from dfit_mlir.core.errors import UnresolvedRecordError

#: ``command_index`` value when the driver does not number commands (local-sync).
NO_COMMAND_INDEX = 0xFFFFFFFF


class UnresolvedDispatchError(UnresolvedRecordError):
    """A runtime dispatch record that no manifest call site explains."""


@dataclass(frozen=True, slots=True)
class DispatchEvent:
    """One dispatch as HAL host-execution profiling saw it."""

    key: str
    """The export name (``main_dispatch_3_matmul_1x32x3136_f32``)."""
    submission_id: int
    command_buffer_id: int
    command_index: int | None
    start_ns: int
    end_ns: int
    workgroup_count: tuple[int, ...]
    tile_count: int | None
    #: Threads per workgroup, x, y, z (``()``: not recorded).
    workgroup_size: tuple[int, ...] = ()

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class DispatchColumns:
    """Dispatch records as columns, one row per record (what :func:`hal_profile.decode_columns`
    makes of a profile, without a Python object per record). Export names and workgroup
    counts are codes into their distinct values (``keys``, ``workgroup_counts``);
    ``command_index`` and ``tile_count`` are ``-1`` where the record has none."""

    key: np.ndarray
    keys: tuple[str, ...]
    submission_id: np.ndarray
    command_buffer_id: np.ndarray
    command_index: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    workgroup: np.ndarray
    workgroup_counts: tuple[tuple[int, ...], ...]
    tile_count: np.ndarray
    #: Workgroup size per row, a code into ``workgroup_sizes`` (``None``: not recorded).
    workgroup_size: np.ndarray | None = None
    workgroup_sizes: tuple[tuple[int, ...], ...] = ()

    def __len__(self) -> int:
        return len(self.submission_id)

    def size_codes(self) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
        """(workgroup size code of each row, the sizes): ``()`` for all where none recorded."""
        if self.workgroup_size is None:
            return np.zeros(len(self), np.int32), ((),)
        return self.workgroup_size, self.workgroup_sizes

    @property
    def numbered(self) -> bool:
        """Whether the driver numbers commands (local-task); local-sync does not."""
        return bool((self.command_index >= 0).any())

    @classmethod
    def from_events(cls, events: Sequence[DispatchEvent]) -> DispatchColumns:
        """The columns of ``events``, in their order; one C-level pass per field (``map``
        over an ``attrgetter``)."""
        count = len(events)

        def integers(name: str) -> np.ndarray:
            return np.fromiter(map(attrgetter(name), events), np.int64, count)

        def optional(name: str) -> np.ndarray:
            values = list(map(attrgetter(name), events))
            if None in values:
                return np.fromiter((-1 if v is None else v for v in values), np.int64, count)
            return np.fromiter(values, np.int64, count)

        def coded(name: str) -> tuple[np.ndarray, tuple[Any, ...]]:
            values = list(map(attrgetter(name), events))
            distinct = {value: code for code, value in enumerate(dict.fromkeys(values))}
            return np.fromiter(map(distinct.__getitem__, values), np.int32, count), tuple(distinct)

        key, keys = coded("key")
        workgroup, workgroup_counts = coded("workgroup_count")
        size, sizes = coded("workgroup_size")
        return cls(key=key, keys=keys, submission_id=integers("submission_id"),
                   command_buffer_id=integers("command_buffer_id"), command_index=optional("command_index"),
                   start_ns=integers("start_ns"), end_ns=integers("end_ns"), workgroup=workgroup,
                   workgroup_counts=workgroup_counts, tile_count=optional("tile_count"), workgroup_size=size,
                   workgroup_sizes=sizes)

    def event(self, row: int) -> DispatchEvent:
        """Row ``row`` as a record (for the per-record matcher and error messages)."""
        index, tiles = int(self.command_index[row]), int(self.tile_count[row])
        size, sizes = self.size_codes()
        return DispatchEvent(self.keys[self.key[row]], int(self.submission_id[row]), int(self.command_buffer_id[row]),
                             None if index < 0 else index, int(self.start_ns[row]), int(self.end_ns[row]),
                             self.workgroup_counts[self.workgroup[row]], None if tiles < 0 else tiles,
                             sizes[size[row]])

    def events(self) -> list[DispatchEvent]:
        """Every row as a record: what the per-record join reads (not the columnar route)."""
        keys, groups = self.keys, self.workgroup_counts
        size, sizes = self.size_codes()
        return [DispatchEvent(keys[k], s, b, None if i < 0 else i, start, end, groups[g], None if t < 0 else t,
                              sizes[z])
                for k, s, b, i, start, end, g, t, z in zip(
                    self.key.tolist(), self.submission_id.tolist(), self.command_buffer_id.tolist(),
                    self.command_index.tolist(), self.start_ns.tolist(), self.end_ns.tolist(),
                    self.workgroup.tolist(), self.tile_count.tolist(), size.tolist(), strict=True)]

    def take(self, rows: np.ndarray) -> DispatchColumns:
        """The rows ``rows`` (indices), in that order."""
        return DispatchColumns(key=self.key[rows], keys=self.keys, submission_id=self.submission_id[rows],
                               command_buffer_id=self.command_buffer_id[rows], command_index=self.command_index[rows],
                               start_ns=self.start_ns[rows], end_ns=self.end_ns[rows], workgroup=self.workgroup[rows],
                               workgroup_counts=self.workgroup_counts, tile_count=self.tile_count[rows],
                               workgroup_size=None if self.workgroup_size is None else self.workgroup_size[rows],
                               workgroup_sizes=self.workgroup_sizes)

    def in_runtime_order(self) -> DispatchColumns:
        """The rows in the order the runtime executed them: by submission, command buffer,
        command index (unnumbered: 0) and start time, as ``hal_profile.decode`` sorts."""
        order = runtime_order(self.submission_id, self.command_buffer_id, np.maximum(self.command_index, 0),
                              self.start_ns)
        return self if order is None else self.take(order)


def runtime_order(*keys: np.ndarray) -> np.ndarray | None:
    """Indices sorting the rows stably by ``keys`` (most significant first), or ``None``
    if they are sorted so already (decoded profiles are: one vectorised comparison)."""
    if len(keys[0]) < 2:
        return None
    ahead = np.zeros(len(keys[0]) - 1, dtype=bool)  # row i+1 sorts strictly after row i
    tied = np.ones(len(keys[0]) - 1, dtype=bool)
    for key in keys:
        ahead |= tied & (key[1:] > key[:-1])
        tied &= key[1:] == key[:-1]
    if (ahead | tied).all():
        return None
    return np.lexsort(keys[::-1])


@dataclass(frozen=True)
class JoinColumns:
    """One row per dispatch record, in runtime order (blocks in submission order, each
    in command order): the record's index in the input, its call site and invocation
    (``-1``: load time), its times, workgroup count product (``-1``: none) and tiles, and
    its workgroup shape: a code into ``shapes``, (count, size) per axis (``None``: not
    kept)."""

    event: np.ndarray
    site: np.ndarray
    invocation: np.ndarray
    start_ns: np.ndarray
    duration_ns: np.ndarray
    workgroups: np.ndarray
    tiles: np.ndarray
    shape: np.ndarray | None = None
    shapes: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()

    def where(self, rows: np.ndarray) -> JoinColumns:
        """The rows ``rows`` (a mask or indices)."""
        return JoinColumns(self.event[rows], self.site[rows], self.invocation[rows], self.start_ns[rows],
                           self.duration_ns[rows], self.workgroups[rows], self.tiles[rows],
                           None if self.shape is None else self.shape[rows], self.shapes)

    def shape_attributes(self) -> tuple[np.ndarray, tuple[str, ...]] | None:
        """Each row's workgroup shape as the dispatch event's attributes (JSON text):
        (code of each row, the texts); ``None`` when no shape was recorded."""
        if self.shape is None or not any(count or size for count, size in self.shapes):
            return None
        texts = tuple(json.dumps({name: list(axes) for name, axes in (("workgroup_count", count),
                                                                      ("workgroup_size", size)) if axes})
                      if count or size else "" for count, size in self.shapes)
        return self.shape, texts


def shape_codes(workgroup: np.ndarray, counts: tuple[tuple[int, ...], ...], size: np.ndarray,
                sizes: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, tuple[tuple[tuple[int, ...], ...], ...]]:
    """(code of each row's (workgroup count, workgroup size), the distinct pairs)."""
    pair = workgroup.astype(np.int64) * max(len(sizes), 1) + size
    distinct, inverse = np.unique(pair, return_inverse=True)
    shapes = tuple((counts[int(p) // max(len(sizes), 1)], sizes[int(p) % max(len(sizes), 1)])
                   for p in distinct.tolist())
    return inverse.ravel().astype(np.int32), shapes  # type: ignore[return-value]


def candidate_recordings(manifest: dict[str, Any], function: str) -> tuple[list[int], list[int]]:
    """(recordings an invocation of ``function`` may execute, load-time recordings).
    Only the function run — and what it calls — executes; initializers run at load."""
    from dfit_mlir.passes.host_calls import reachable

    partitions = manifest["partitions"]
    functions = partitions.get("host_functions") or {}
    if function not in functions:
        raise UnresolvedDispatchError(
            f"the manifest's host program has no function {function!r} "
            f"(it has {', '.join(n for n, f in functions.items() if f['public']) or 'none'})")
    reach = reachable([function], {name: f["calls"] for name, f in functions.items()})
    invocation, load = [], []
    for recording in partitions["recordings"]:
        if recording["load_time"]:
            load.append(recording["index"])
        elif reach.intersection(recording["executors"]):
            invocation.append(recording["index"])
    return invocation, load


def explains(recording: dict[str, Any], block: Sequence[DispatchEvent], numbered: bool) -> list[int] | None:
    """Command positions of ``recording`` that issued ``block`` (one command buffer's
    dispatch records, in order), or ``None`` if the recording cannot have issued them.

    ``numbered`` (local-task): each record's ``command_index`` is its command's position.
    Otherwise (local-sync) the records are the recording's dispatches in order."""
    commands = recording["commands"]
    dispatches = [i for i, c in enumerate(commands) if c["op"].startswith("dispatch")]
    if numbered:
        positions = [e.command_index for e in block]
        if any(p is None or p >= len(commands) for p in positions) or len(set(positions)) != len(positions):
            return None
    else:
        if len(block) != len(dispatches):
            return None
        positions = dispatches
    for position, event in zip(positions, block, strict=True):
        command = commands[position]  # type: ignore[index]
        if not command["op"].startswith("dispatch") or command.get("export") != event.key:
            return None
        wanted = command.get("workgroups")
        if wanted is not None and event.workgroup_count and tuple(wanted) != tuple(event.workgroup_count):
            return None
    return positions  # type: ignore[return-value]


@dataclass(frozen=True)
class Executions:
    """Command-buffer executions as columns: (submission, command buffer) of each."""

    submission_id: np.ndarray
    command_buffer_id: np.ndarray

    def __len__(self) -> int:
        return len(self.submission_id)

    @classmethod
    def of(cls, executions: Executions | Sequence[tuple[int, int]]) -> Executions:
        if isinstance(executions, Executions):
            return executions
        pairs = np.array(executions, dtype=np.int64).reshape(-1, 2)
        return cls(pairs[:, 0], pairs[:, 1])

    def submissions_of(self, buffers: Sequence[int]) -> np.ndarray:
        """The submissions that executed any of ``buffers``, in order."""
        return np.sort(self.submission_id[np.isin(self.command_buffer_id, np.array(buffers, dtype=np.int64))])


def invocation_starts(manifest: dict[str, Any], function: str, invocations: int,
                      recording_of_buffer: dict[int, int], executions: Executions | Sequence[tuple[int, int]],
                      flush_starts: Sequence[int] | np.ndarray | None = None) -> list[int]:
    """:func:`invocation_start_array` as a list."""
    return invocation_start_array(manifest, function, invocations, recording_of_buffer, executions,
                                  flush_starts).tolist()


def invocation_start_array(manifest: dict[str, Any], function: str, invocations: int,
                           recording_of_buffer: dict[int, int], executions: Executions | Sequence[tuple[int, int]],
                           flush_starts: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """First submission id of each invocation (int64), from the host code's structure.

    The anchor of ``function`` is the first command-buffer execution in its entry block:
    it runs exactly once per call, after a fixed number of queue operations (one
    submission each). So the k-th execution of the anchor's recording is submission
    ``a_k``, and invocation k starts at ``a_k - queue_ops_before``. Without an anchor
    (every execution under control flow: a loop or an ``scf.if`` first) the invocations
    are the benchmark tool's iterations: it flushes the profile after each call, and
    ``flush_starts`` holds the first submission of each flush (:func:`flush_invocation_starts`).
    One invocation starts after the load-time work."""
    executions = Executions.of(executions)
    anchor = _anchor_executions(manifest, function, recording_of_buffer, executions)
    if anchor is not None:
        anchored, issued_before, wanted = anchor
        if not len(anchored):
            anchored = _dispatchless_anchor(manifest, wanted, invocations, recording_of_buffer, executions)
        if len(anchored) == invocations:
            # Numbers, not Python ints: 1M starts as lists peaked 76 MiB up, as an array 7 (issue 29).
            return anchored.astype(np.int64) - issued_before
        if len(anchored):
            raise UnresolvedDispatchError(
                f"{len(anchored)} executions of {function}'s first command buffer (recording "
                f"{'/'.join(map(str, sorted(wanted)))}) for {invocations} invocation(s)")
    if invocations == 1:
        return np.array([_first_after_load(manifest, recording_of_buffer, executions)], np.int64)
    return flush_invocation_starts(function, invocations, flush_starts)


def invocation_starts_so_far(manifest: dict[str, Any], function: str, invocations: int,
                             recording_of_buffer: dict[int, int], executions: Executions,
                             flush_starts: np.ndarray) -> np.ndarray | None:
    """The first submissions of the invocations that a profile still being written holds
    so far (``executions`` and ``flush_starts`` so far): the first of those
    :func:`invocation_start_array` gives once the profile is whole, where the rule it
    will take can be told already — the anchor's executions seen, or no anchor and a
    flush per call. ``None`` where it cannot (an anchor not executed yet, or one that
    issues no dispatch; one invocation; more starts than invocations, an error the whole
    profile names)."""
    anchor = _anchor_executions(manifest, function, recording_of_buffer, executions)
    if anchor is not None:
        anchored, issued_before, _ = anchor
        starts = anchored.astype(np.int64) - issued_before if len(anchored) else None
    else:
        starts = np.asarray(flush_starts, np.int64)
    return None if invocations == 1 or starts is None or len(starts) > invocations else starts


def _anchor_executions(manifest: dict[str, Any], function: str, recording_of_buffer: dict[int, int],
                       executions: Executions) -> tuple[np.ndarray, int, set[int]] | None:
    """(the submissions of the executions of ``function``'s anchor, the queue operations
    each call issues before it, the anchor's recordings), or ``None`` where the function
    has none (:func:`invocation_start_array`)."""
    from dfit_mlir.passes.host_calls import anchor as entry_anchor

    found = entry_anchor(manifest["partitions"]["host_functions"], function)
    if found is None:
        return None
    wanted, issued_before = set(found[0]), found[1]
    # The anchor's recordings must run nowhere else in the function, or their
    # executions would not count calls.
    others = [e for e in _executions_reachable(manifest, function) if e is None or wanted.intersection(e)]
    if len(others) != 1:
        return None
    buffers = [buffer for buffer, index in recording_of_buffer.items() if index in wanted]
    return executions.submissions_of(buffers), issued_before, wanted


def flush_invocation_starts(function: str, invocations: int,
                            flush_starts: Sequence[int] | np.ndarray | None) -> np.ndarray:
    """Invocation starts of a function without an anchor, from the profile's flushes:
    one per invocation, each the first submission of its call. A call that issues no
    submission (a loop that ran no trip, a branch with no work) writes no flush, so the
    flushes no longer say which call was which: that is the error, naming the shape."""
    shape = "its entry block executes no command buffer (every execution sits under control flow)"
    if flush_starts is None:
        raise UnresolvedDispatchError(
            f"cannot split {invocations} invocations of {function}: {shape}, and this profile has no queue events "
            f"to split by (they come with the queue-events family of iree-benchmark-module); run it with --repeat 1")
    if not len(flush_starts):  # no call issued anything: every invocation is empty
        return np.zeros(invocations, np.int64)
    if len(flush_starts) != invocations:
        raise UnresolvedDispatchError(
            f"cannot split {invocations} invocations of {function}: {shape}, and only {len(flush_starts)} of the "
            f"{invocations} calls issued a queue operation (a loop that ran no trip or a branch with no device work "
            f"issues none), so which calls did the work cannot be told; run it with --repeat 1")
    return np.asarray(flush_starts, np.int64)


def _dispatchless_anchor(manifest: dict[str, Any], wanted: set[int], invocations: int,
                         recording_of_buffer: dict[int, int], executions: Executions) -> np.ndarray:
    """Executions of an anchor recording that issues no dispatch (copies, fills): no
    dispatch record names its buffer. A memoized one is the only buffer no dispatch
    explains that runs exactly once per invocation; else none is found."""
    recordings = manifest["partitions"]["recordings"]
    if any(c["op"].startswith("dispatch") for index in wanted for c in recordings[index]["commands"]) or \
            not all(recordings[index].get("global_name") for index in wanted):
        return np.zeros(0, np.int64)
    unexplained = ~np.isin(executions.command_buffer_id, np.array(list(recording_of_buffer), dtype=np.int64))
    buffers, counts = np.unique(executions.command_buffer_id[unexplained], return_counts=True)
    fitting = buffers[counts == invocations].tolist()
    return executions.submissions_of(fitting) if len(fitting) == 1 else np.zeros(0, np.int64)


def _executions_reachable(manifest: dict[str, Any], function: str) -> list[list[int] | None]:
    from dfit_mlir.passes.host_calls import reachable

    functions = manifest["partitions"]["host_functions"]
    reach = reachable([function], {name: f["calls"] for name, f in functions.items()})
    return [executed for name in sorted(reach) if name in functions for executed in functions[name]["executes"]]


def _first_after_load(manifest: dict[str, Any], recording_of_buffer: dict[int, int],
                      executions: Executions) -> int:
    """The submission after the last load-time execution (0 when there is none)."""
    recordings = manifest["partitions"]["recordings"]
    load = executions.submissions_of([b for b, index in recording_of_buffer.items()
                                      if recordings[index]["load_time"]])
    return int(load[-1]) + 1 if len(load) else 0

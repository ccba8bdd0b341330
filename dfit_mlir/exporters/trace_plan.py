"""How much of a run the traces draw (``trace.pftrace``, ``trace.json``).

Every event, up to :data:`TRACE_MAX_EVENTS` events in the run. Past it, a trace of
every event is more than the Perfetto UI opens (≈200 bytes of ``trace.pftrace`` and
≈500 of ``trace.json`` per event), so the traces keep the first and last invocations
in full (as many at each end as hold :data:`TRACE_MAX_EVENTS` / 2 events together, at
least one) and draw every invocation between as one summary slice (from its first
event's start to its last event's end; its event and dispatch counts and dispatch time
in its args), on a track of its own. Events of no invocation are always kept. The
choice is recorded in ``summary.json`` (``trace``, :meth:`TracePlan.record`);
``dfit run --trace-all`` keeps every event whatever the size.

The summaries are computed in one pass over the events before the traces are written:
five integers per invocation while they are added up (40 bytes: 40 MiB at 1M
invocations), not per event. Given a folder (``dfit run`` gives a scratch one), those
arrays are kept in files there (:class:`~dfit_mlir.core.paged.PagedArrays`, the pages a
batch touched handed back after it), the ends are found and the summarised invocations'
totals (36 bytes each) written there :attr:`_Accumulator.STEP` invocations at a time, and
read back a batch of summary slices at a time while the traces are drawn: no array over
every invocation is in memory at once. Without a folder they are held in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dfit_mlir.core import event_schema as es
from dfit_mlir.core.event_pipeline import Policy
from dfit_mlir.core.paged import PagedArrays, append_values
from dfit_mlir.core.perf import add_counts, release_freed_memory
from dfit_mlir.exporters.traces import BATCH_ROWS, SUMMARY_KIND, _codes

#: Events past which the traces summarise the middle invocations (documented in ``dfit run
#: --help``; the CLI's text is held to it by a test).
TRACE_MAX_EVENTS = 1_000_000


@dataclass(frozen=True)
class TraceLimit:
    """The traces' size limit: ``max_events`` events (None: no limit, every event drawn)."""

    max_events: int | None = TRACE_MAX_EVENTS

    def keeps_all(self, events: int) -> bool:
        """Whether a run of ``events`` events (or fewer) is drawn whole."""
        return self.max_events is None or events <= self.max_events

    @staticmethod
    def of(policy: Policy) -> TraceLimit:
        """The limit a run's event policy asks for: none under ``dfit run --trace-all``
        (``Policy.trace_all``), else the default."""
        return KEEP_ALL if policy.trace_all else DEFAULT_LIMIT


KEEP_ALL = TraceLimit(None)
DEFAULT_LIMIT = TraceLimit()

#: The columns the planning pass reads.
PLAN_COLUMNS = [es.INVOCATION, es.START_NS, es.DURATION_NS, es.KIND, es.STAGE, "track_group"]


#: The columns of the summarised invocations' totals and their types (invocation numbers
#: are 32-bit in a bundle; counts of one invocation's events in one group fit 32 bits).
TOTALS_COLUMNS = {"invocation": np.dtype(np.int32), "first_start": np.dtype(np.int64),
                  "last_end": np.dtype(np.int64), "events": np.dtype(np.int32), "dispatches": np.dtype(np.int32),
                  "dispatch_ns": np.dtype(np.int64)}


class _GroupedRows:
    """Rows of consecutive groups (:attr:`groups`: (track group, its stage, its rows)):
    the group and stage are kept once per group, not once per row (a million references
    each at 1M invocations)."""

    groups: tuple[tuple[Any, Any, int], ...]

    def __len__(self) -> int:
        return sum(count for _, _, count in self.groups)

    def groups_of(self, rows: slice) -> list[Any]:
        """The track group of each of ``rows``."""
        return [self.groups[code][0] for code in self._group_codes(rows).tolist()]

    def stages_of(self, rows: slice) -> list[Any]:
        """The stage of each of ``rows``."""
        return [self.groups[code][1] for code in self._group_codes(rows).tolist()]

    def _group_codes(self, rows: slice) -> np.ndarray:
        """Which entry of :attr:`groups` each of ``rows`` is in."""
        ends = np.cumsum([count for _, _, count in self.groups])
        return np.searchsorted(ends, np.arange(*rows.indices(len(self))), side="right")


@dataclass(frozen=True)
class InvocationTotals(_GroupedRows):
    """Per (track group, invocation) of the summarised ones, in invocation order within
    each group: where its events start and end, how many there are, how many are
    dispatches and their time (:data:`TOTALS_COLUMNS`)."""

    groups: tuple[tuple[Any, Any, int], ...]
    invocation: np.ndarray
    first_start: np.ndarray
    last_end: np.ndarray
    events: np.ndarray
    dispatches: np.ndarray
    dispatch_ns: np.ndarray

    def rows(self, part: slice) -> dict[str, np.ndarray]:
        """Each column's values of rows ``part``."""
        return {name: getattr(self, name)[part] for name in TOTALS_COLUMNS}


@dataclass(frozen=True)
class SpilledTotals(_GroupedRows):
    """:class:`InvocationTotals` written to ``folder`` (a file per column, raw values),
    read back a slice at a time (read, not mapped: a mapping's pages would stay resident
    as they are read). Valid while the folder is."""

    groups: tuple[tuple[Any, Any, int], ...]
    folder: Path

    def rows(self, part: slice) -> dict[str, np.ndarray]:
        begin, end, _ = part.indices(len(self))
        return {name: np.fromfile(self.folder / name, dtype=dtype, count=max(0, end - begin),
                                  offset=begin * dtype.itemsize)
                for name, dtype in TOTALS_COLUMNS.items()}


@dataclass(frozen=True)
class TracePlan:
    """What the traces keep: every event, or the invocations outside ``summarised``
    (an inclusive range of invocation numbers) in full and ``totals`` for those inside."""

    events: int
    max_events: int | None
    full_each_end: int = 0
    summarised: tuple[int, int] | None = None
    totals: InvocationTotals | SpilledTotals | None = field(default=None, repr=False)
    #: Distinct invocation numbers among the summarised ones (over every group).
    summarised_invocations: int = 0

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` says of it (its ``trace`` entry)."""
        document: dict[str, Any] = {"max_events": self.max_events, "events": self.events,
                                    "kept": "all" if self.summarised is None else "ends"}
        if self.summarised is not None and self.totals is not None:
            document.update({"full_invocations_each_end": self.full_each_end,
                             "summarised_invocations": self.summarised_invocations,
                             "summarised_range": list(self.summarised), "summary_slices": len(self.totals)})
        return document

    def batches(self, source: Iterable[Any]) -> Iterator[Any]:
        """``source``'s batches without the summarised invocations' events, then the
        summary slices (events of kind :data:`~dfit_mlir.exporters.traces.SUMMARY_KIND`)."""
        if self.summarised is None:
            yield from source
            return
        import pyarrow as pa
        import pyarrow.compute as pc

        first, last = self.summarised
        for batch in source:
            if es.INVOCATION not in batch.schema.names:
                yield batch
                continue
            invocation = batch.column(es.INVOCATION)
            inside = pc.and_(pc.greater_equal(invocation, pa.scalar(first, invocation.type)),
                             pc.less_equal(invocation, pa.scalar(last, invocation.type)))
            yield batch.filter(pc.invert(pc.fill_null(inside, False)))
        yield from self._summary_batches()

    def _summary_batches(self) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        totals = self.totals
        assert totals is not None
        text = pa.string()

        def number(values: np.ndarray) -> Any:
            return pc.cast(pa.array(values), text)

        for begin in range(0, len(totals), BATCH_ROWS):
            end = min(len(totals), begin + BATCH_ROWS)
            part = slice(begin, end)
            count = end - begin
            row = totals.rows(part)
            attributes = pc.binary_join_element_wise(
                '{"invocation": ', number(row["invocation"]), ', "events": ', number(row["events"]),
                ', "dispatches": ', number(row["dispatches"]), ', "dispatch_ns": ',
                number(row["dispatch_ns"]), "}", "")
            columns = {
                es.KIND: pa.array([SUMMARY_KIND] * count, text),
                es.STAGE: pa.array(totals.stages_of(part), text),
                es.INVOCATION: pa.array(row["invocation"], pa.int32()),
                es.START_NS: pa.array(row["first_start"]),
                es.DURATION_NS: pa.array(row["last_end"] - row["first_start"]),
                es.ATTRIBUTES: attributes,
            }
            if any(group is not None for group, _, _ in totals.groups):
                columns["track_group"] = pa.array(totals.groups_of(part), text)
            yield pa.RecordBatch.from_pydict(columns)


def plan_trace(events: int, limit: TraceLimit, batches: Callable[[], Iterable[Any]],
               folder: Path | None = None) -> TracePlan:
    """The plan for a run of ``events`` events; ``batches()``: its events (with at least
    :data:`PLAN_COLUMNS` those it has), read once more only when it is over the limit;
    ``folder``: where the summarised invocations' totals are written (:class:`SpilledTotals`;
    ``None``: kept in memory)."""
    if limit.keeps_all(events):
        return TracePlan(events, limit.max_events)
    assert limit.max_events is not None  # (no limit keeps all)
    totals = _Accumulator(PagedArrays(folder))
    try:
        plan = _planned(events, limit.max_events, batches, totals, folder)
    finally:
        totals.paged.discard()  # the accumulator's files (in ``folder``), not the totals spilled there
    # The accumulator and what reading the events freed, handed back before the traces
    # are drawn: kept, they were 150 MiB of a 1M-invocation run's 22M events (37 live).
    del totals
    release_freed_memory(now=True)
    return plan


def _planned(events: int, max_events: int, batches: Callable[[], Iterable[Any]], totals: _Accumulator,
             folder: Path | None) -> TracePlan:
    for batch in batches():
        totals.add(batch)
        totals.paged.release()  # the pages of the invocations this batch touched
        release_freed_memory()  # what the batch freed, as it piles up
        if totals.sparse:  # invocation numbers far apart (not a run's 0..N-1): every event is kept
            return TracePlan(events, max_events)
    budget = max_events // 2
    count, front, back = totals.ends(budget)
    keep = _full_at_each_end(front[1], back[1], count, budget)
    if keep == 0:  # too few invocations to summarise any: every event is kept
        return TracePlan(events, max_events)
    summarised = (int(front[0][keep]), int(back[0][keep]))
    between = totals.between(*summarised) if folder is None else totals.spill(*summarised, folder)
    # (those with events in the range: all but the ends)
    return TracePlan(events, max_events, keep, summarised, between, summarised_invocations=count - 2 * keep)


def _full_at_each_end(front: np.ndarray, back: np.ndarray, count: int, budget: int) -> int:
    """The largest k (at least 1) such that the first k and last k of ``count``
    invocations hold at most ``budget`` events together; 0 when fewer than 2k + 1
    invocations leave nothing between to summarise. ``front``, ``back``: the events of
    the first and of the last invocations (the last first), as many as may be kept."""
    if count < 3:
        return 0
    common = min((count - 1) // 2, len(front), len(back))  # at least one invocation between
    both = np.cumsum(front[:common]) + np.cumsum(back[:common])
    return max(1, int(np.searchsorted(both, budget, side="right")))


class _Accumulator:
    """Per (track group, invocation): first start, last end, events, dispatches, dispatch
    time; dense arrays indexed by invocation number (they are small and consecutive)."""

    #: Invocation numbers past this many per event seen (plus a margin) are too sparse for
    #: dense arrays (a bundle's numbers may be anything up to 2^31 - 1).
    SPARSE = 16
    #: Each array's value for an invocation with no event yet.
    FILLS = {"first_start": np.iinfo(np.int64).max, "last_end": -1, "events": 0, "dispatches": 0, "dispatch_ns": 0}

    def __init__(self, paged: PagedArrays | None = None) -> None:
        """``paged``: where the arrays are kept (default: in memory)."""
        self.paged = PagedArrays(None) if paged is None else paged
        self.groups: dict[Any, dict[str, np.ndarray]] = {}
        self.stages: dict[Any, Any] = {}
        self.seen = 0
        self.sparse = False

    def add(self, batch: Any) -> None:
        import pyarrow.compute as pc

        names = batch.schema.names
        if es.INVOCATION not in names or es.START_NS not in names:
            return
        invocation, start = batch.column(es.INVOCATION), batch.column(es.START_NS)
        valid = np.asarray(pc.and_(pc.is_valid(invocation), pc.is_valid(start)), dtype=bool)
        if not valid.any():
            return
        # A negative number (load time -1, outside any submission -2, or whatever a crafted
        # bundle holds) is no invocation: not planned, so outside every summarised range.
        valid &= np.asarray(invocation.fill_null(-1), dtype=np.int64) >= 0
        if not valid.any():
            return
        rows = np.flatnonzero(valid)
        numbers = np.asarray(invocation.fill_null(0), dtype=np.int64)[rows]
        self.seen += len(rows)
        if int(numbers.max()) > self.SPARSE * self.seen + (1 << 20):
            self.sparse = True
            return
        starts = np.asarray(start.fill_null(0), dtype=np.int64)[rows]
        durations = np.asarray(batch.column(es.DURATION_NS).fill_null(0), dtype=np.int64)[rows] \
            if es.DURATION_NS in names else np.zeros(len(rows), dtype=np.int64)
        kinds, kind_values = _codes(batch.column(es.KIND))
        dispatch = np.array([value == "dispatch" for value in kind_values])[kinds[rows]]
        stages, stage_values = _codes(batch.column(es.STAGE)) if es.STAGE in names else \
            (np.zeros(batch.num_rows, dtype=np.int64), [None])
        groups, group_values = _codes(batch.column("track_group")) if "track_group" in names else \
            (np.zeros(batch.num_rows, dtype=np.int64), [None])
        group_of_row = groups[rows]
        for code in np.unique(group_of_row).tolist():
            mine = group_of_row == code
            group = group_values[code]
            self.stages.setdefault(group, stage_values[stages[rows][mine][0]])
            self._add(group, numbers[mine], starts[mine], starts[mine] + durations[mine], dispatch[mine],
                      durations[mine])

    def _add(self, group: Any, numbers: np.ndarray, starts: np.ndarray, ends: np.ndarray, dispatch: np.ndarray,
             durations: np.ndarray) -> None:
        arrays = self.groups.get(group)
        size = int(numbers.max()) + 1
        if arrays is None:
            prefix = f"group{len(self.groups)}-"
            arrays = self.groups[group] = {name: self.paged.full(prefix + name, size, fill, np.int64)
                                           for name, fill in self.FILLS.items()}
        elif len(arrays["events"]) < size:
            # Grown a quarter more at once (in memory: ``resize``, a realloc, which moves
            # a mapped block's pages and otherwise holds one array's old and new copies at
            # most, not fresh arrays beside the old ones: at 1M invocations the five are
            # 40 MiB). Nothing but this dict refers to them while the events are added up.
            grown = max(size, len(arrays["events"]) * 5 // 4)
            prefix = f"group{list(self.groups).index(group)}-"
            for name in list(arrays):
                arrays[name] = self.paged.grown(prefix + name, arrays.pop(name), grown, self.FILLS[name])
        np.minimum.at(arrays["first_start"], numbers, starts)
        np.maximum.at(arrays["last_end"], numbers, ends)
        add_counts(arrays["events"], numbers)
        add_counts(arrays["dispatches"], numbers[dispatch])
        # Summed exactly (a float bincount rounds past 2^53 ns).
        np.add.at(arrays["dispatch_ns"], numbers[dispatch], durations[dispatch])

    def ends(self, budget: int) -> tuple[int, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """(how many invocation numbers have events; the first of them and their events
        over all groups, up to the first past ``budget`` events together; the last ones
        likewise, the last first), read :data:`STEP` invocations at a time: never an
        array over every invocation, nor more of them than the traces can keep in full."""
        size = max((len(arrays["events"]) for arrays in self.groups.values()), default=0)
        begins = range(0, size, self.STEP)
        count = sum(len(numbers) for numbers, _ in self._with_events(begins))
        return count, self._first_with_events(begins, budget), \
            self._first_with_events(reversed(begins), budget, backwards=True)

    #: Invocations read at a time where a pass goes over all of them.
    STEP = 1 << 18

    def _with_events(self, begins: Iterable[int], backwards: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(numbers with events, their events over all groups) of invocations
        ``begin``..``begin + STEP`` for each of ``begins``, each in order (or reversed)."""
        for begin in begins:
            events = np.zeros(self.STEP, dtype=np.int64)
            for arrays in self.groups.values():
                part = arrays["events"][begin:begin + self.STEP]
                events[:len(part)] += part
            numbers = np.flatnonzero(events)
            if backwards:
                numbers = numbers[::-1]
            yield begin + numbers, events[numbers]
            self.paged.release()

    def _first_with_events(self, begins: Iterable[int], budget: int,
                           backwards: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The first invocations with events (of ``begins``' pieces, in turn) and their
        events, up to and with the first that takes them past ``budget`` events, and at
        least two (one end's invocation always kept in full, and the one after it)."""
        numbers, events, held, taken = [], [], 0, 0
        for found, per_number in self._with_events(begins, backwards):
            within = int(np.searchsorted(held + np.cumsum(per_number), budget, side="right"))
            take = max(within + 1, 2 - taken)
            numbers.append(found[:take])
            events.append(per_number[:take])
            held += int(events[-1].sum())
            taken += len(events[-1])
            if held > budget and taken >= 2:
                break
        return (np.concatenate(numbers) if numbers else np.zeros(0, np.int64),
                np.concatenate(events) if events else np.zeros(0, np.int64))

    def between(self, first: int, last: int) -> InvocationTotals:
        """The totals of invocations ``first``..``last`` (inclusive) that have events,
        group by group (each group's in invocation order): copies of exactly those
        rows, so that the accumulator's grown arrays go with it (their fifth more, and
        the invocations outside the range)."""
        parts: dict[str, list[np.ndarray]] = {name: [] for name in TOTALS_COLUMNS}
        groups = []
        for group, stage, pieces in self._rows_between(first, last):
            rows = 0
            for piece in pieces:
                for name, values in piece.items():
                    parts[name].append(values)
                rows += len(piece["invocation"])
            groups.append((group, stage, rows))
        joined = {name: (values[0] if len(values) == 1 else np.concatenate(values)) if values
                  else np.zeros(0, dtype=TOTALS_COLUMNS[name]) for name, values in parts.items()}
        return InvocationTotals(tuple(groups), **joined)

    def spill(self, first: int, last: int, folder: Path) -> SpilledTotals:
        """:meth:`between`, written to ``folder`` :data:`STEP` invocations at a time
        (where the rows of a group at once were 36 MiB at 1M invocations)."""
        for name in TOTALS_COLUMNS:
            (folder / name).write_bytes(b"")
        groups = []
        for group, stage, pieces in self._rows_between(first, last):
            rows = 0
            for piece in pieces:
                for name, values in piece.items():
                    append_values(folder / name, values)
                rows += len(piece["invocation"])
                del piece, values  # gone before the next piece is copied, not when it is bound
                self.paged.release()
            groups.append((group, stage, rows))
        return SpilledTotals(tuple(groups), folder)

    def _rows_between(self, first: int, last: int) -> Iterator[tuple[Any, Any, Iterator[dict[str, np.ndarray]]]]:
        """Per group: (the group, its stage, its rows of invocations ``first``..``last``
        that have events, :data:`STEP` invocations at a time: each of
        :data:`TOTALS_COLUMNS`' values, copied)."""
        for group, arrays in self.groups.items():

            def pieces(arrays: dict[str, np.ndarray] = arrays) -> Iterator[dict[str, np.ndarray]]:
                for begin in range(first, min(last + 1, len(arrays["events"])), self.STEP):
                    end = min(last + 1, len(arrays["events"]), begin + self.STEP)
                    with_events = arrays["events"][begin:end] > 0
                    taken: Any
                    if with_events.all():  # a run's: a slice (copied below), no list of numbers
                        kept, taken = np.arange(begin, end, dtype=np.int32), slice(begin, end)
                    else:
                        taken = begin + np.flatnonzero(with_events)
                        kept = taken.astype(np.int32)
                    yield {"invocation": kept, **{name: arrays[name][taken].astype(dtype)
                                                  for name, dtype in TOTALS_COLUMNS.items() if name != "invocation"}}

            yield group, self.stages.get(group), pieces()

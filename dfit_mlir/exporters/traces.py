"""How a run's events become trace tracks and slices: the part the two trace writers
share (:mod:`dfit_mlir.exporters.perfetto`, Perfetto's native protobuf, and
:mod:`dfit_mlir.exporters.chrome`, Chrome trace JSON; both open in the Perfetto UI).

Tracks: under one process-like track per stage, one track per invocation carrying
``program`` / ``function`` / ``dispatch`` slices (they nest: a function runs inside its
program, dispatches inside both) and ``tensor`` instants; runtime records that belong
to no invocation's model code (``queue`` submissions and host operations, ``memory``
events) get a track per operation. Slices are named ``<op> <root id>`` (dispatches) or
by function / operation, with export, site, fused IDs, source location, stage, MACs
and tensor statistics in their args.

Both writers stream: they read ``events.parquet`` batch by batch and write as they go,
so memory stays bounded however long the run (only the track table and a bounded cache
of serialized slice descriptions are kept).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dfit_mlir.core import event_schema as es
from dfit_mlir.core import locations
from dfit_mlir.core.ids import op_name_of
from dfit_mlir.core.perf import release_freed_memory

#: Kinds drawn on an invocation's track; the others get a track per operation.
INVOCATION_KINDS = frozenset({"program", "function", "dispatch", "tensor"})


#: The kind of a summary slice: one per invocation a long run's traces do not draw in
#: full (:mod:`dfit_mlir.exporters.trace_plan`), all on one track. Not an event kind:
#: such slices are made for the traces, never stored.
SUMMARY_KIND = "invocation"


SUMMARY_TRACK = "invocations (summarised)"


SUMMARY_SLICE = "invocation (summary)"


_TENSOR_ARGS = (es.TENSOR_MIN, es.TENSOR_MAX, es.TENSOR_MEAN, es.TENSOR_STD, es.TENSOR_NANS, es.TENSOR_INFS)


#: Event fields the traces read; all but the per-event ones (invocation, start,
#: duration) describe a slice, and runs repeat the same description many times.
_PER_EVENT = (es.INVOCATION, es.START_NS, es.DURATION_NS)


DESCRIBING = (es.KIND, es.STAGE, es.SITE, es.ROOT_ID, es.PARTITION, es.MACS, es.BYTES, es.NAME, *_TENSOR_ARGS)


#: Per-event text (a queue submission's or an allocation's own numbers, as JSON): it is
#: not part of a slice's description, or every such event would have its own; the
#: writers add it to the event's args column-wise, uninterned.
_PER_EVENT_ARGS = (es.ATTRIBUTES,)


#: Slice descriptions kept for reuse (distinct ones: call sites, operations).
DESCRIPTION_CACHE = 100_000


def track_name(kind: str, invocation: int | None, partition: str | None, name: str | None) -> str:
    """The track an event is drawn on, within its stage: its invocation's, else its operation's."""
    if kind in INVOCATION_KINDS and invocation is not None:
        return f"invocation {invocation}"
    if kind == SUMMARY_KIND:
        return SUMMARY_TRACK
    return f"{kind}: {partition or name or kind}"


#: The page a slice's ``view`` arg names (``dfit view``'s usual ``-o view.html``; dfit
#: writes no output inside the bundle it reads). Perfetto's UI shows an arg as a link only
#: when its value starts with ``http://`` or ``https://`` (its args panel), so the arg is
#: text to paste into the page's search box, or its fragment after the page's address.
VIEW_PAGE = "view.html"


def view_link(op_id: str, page: str = VIEW_PAGE) -> str:
    """``view.html#op=main%2Flinalg.matmul%230``: the page with ``op_id`` selected (the
    fragment the page reads, the ID percent-encoded as ``encodeURIComponent`` does)."""
    from urllib.parse import quote

    return page + "#op=" + quote(op_id, safe="-_.!~*'()")


class SliceNamer:
    """Event → slice name and args, with the per-site and per-op lookups built once (the
    writers memoise descriptions themselves)."""

    def __init__(self, manifest: dict[str, Any]):
        self.operators = {op["id"]: op for op in manifest.get("operators", [])}
        self.sites = manifest.get("partitions", {}).get("dispatch_sites", [])
        # The frontends package is heavy and traces are written late: imported here.
        from dfit_mlir.frontends import CodeRules

        self.rules = CodeRules.default()

    def name(self, event: dict[str, Any]) -> str:
        """``h.0.mlp.c_fc torch.aten.addmm`` (module path + op) where the frontend gave
        a module path, else ``linalg.matmul main/linalg.matmul#3`` (op + stable ID)."""
        root = event[es.ROOT_ID]
        if event[es.KIND] == SUMMARY_KIND:  # its invocation and counts are in its attributes
            return SUMMARY_SLICE
        if root:
            op = self.operators.get(root) or {}
            path = op.get("module_path")
            if path is not None:
                return f"{path or '(root)'} {op.get('source_op') or op.get('op') or op_name_of(root)}"
            return f"{op_name_of(root) or event[es.KIND]} {root}"
        label = event[es.PARTITION] or event.get(es.NAME)
        return f"{event[es.KIND]} {label}" if label else event[es.KIND]

    def args(self, event: dict[str, Any]) -> dict[str, Any]:
        root = event[es.ROOT_ID]
        op = (self.operators.get(root) or {}) if root else {}
        source = self._model_line(op)
        site_index = event[es.SITE]
        site = self.sites[site_index] if site_index is not None and 0 <= site_index < len(self.sites) else None
        args: dict[str, Any] = {
            "kind": event[es.KIND],
            "partition": event[es.PARTITION],
            "site": site_index if site is not None else None,
            "root_id": root,
            "op_id": root,  # the stable ID a browser view links back by
            "view": view_link(root) if root else None,
            "module_path": op.get("module_path"),
            "op": op.get("op"),
            "fused_ids": ", ".join(site["fused_ids"]) if site else None,
            "fused_modules": ", ".join(dict.fromkeys(
                path for i in site["fused_ids"] if (path := (self.operators.get(i) or {}).get("module_path"))))
            if site else None,
            "source": f"{source['file']}:{source['line']}:{source['col']}" if source else None,
            "stage": event[es.STAGE],
            "macs": event[es.MACS],
            "bytes": event[es.BYTES],
            "name": event.get(es.NAME),
            **{name: event.get(name) for name in _TENSOR_ARGS},
        }
        if event.get(es.ATTRIBUTES):
            args["attributes"] = event[es.ATTRIBUTES]
        return {name: value for name, value in args.items() if value not in (None, "")}


    def _model_line(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """The op's innermost model-code frame (not a framework line), else its source."""
        frames = [frame for frame in (*(op.get("call_stack") or ()), op.get("source")) if frame and frame.get("file")]
        return locations.model_frame(frames, self.rules.is_model_code) or op.get("source")


def event_batches(parquet: Path, columns: list[str] | None = None,
                  skip_invocations: tuple[int, int] | None = None, batch_size: int | None = None) -> Iterator[Any]:
    """``events.parquet``'s batches, with the columns the writers read (or ``columns``,
    those of them the file has); ``skip_invocations``: row groups holding only events
    of these invocations (first, last) are not read (a trace's summarised middle);
    ``batch_size``: rows a batch (default :data:`READ_ROWS`)."""
    events = es.open_parquet(parquet)
    wanted = trace_columns(events) if columns is None else \
        [name for name in columns if name in events.schema_arrow.names]
    # A reader per few row groups (event_schema.row_group_batches): one over a long run's
    # whole file holds memory for every row group it has passed.
    return es.row_group_batches(events, batch_size=batch_size or READ_ROWS, columns=wanted,
                                skip_invocations=skip_invocations)


def trace_columns(events: Any) -> list[str]:
    """The columns of ``events`` (a ``pq.ParquetFile``) the traces read."""
    return trace_column_names(events.schema_arrow.names)


def trace_column_names(names: Iterable[str]) -> list[str]:
    """Those of the columns ``names`` the traces read, in the order they read them."""
    present = set(names)
    return [name for name in (*_PER_EVENT, *DESCRIBING, *_PER_EVENT_ARGS) if name in present]


class TraceWriter:
    """What both trace writers share: events taken as batches (grouped here) or as
    :func:`grouped_slices`' groups, each group drawn by :meth:`write_grouped`."""

    lanes: Lanes
    written: int

    def write_grouped(self, grouped: Grouped) -> None:
        raise NotImplementedError

    def write_batches(self, batches: Any) -> int:
        return self.write_groups(grouped_slices(batches, self.lanes))

    def write_groups(self, groups: Iterable[Grouped | None]) -> int:
        """Write :func:`grouped_slices`' groups; returns the events written."""
        for grouped in groups:
            if grouped is None:  # a read batch's end
                release_freed_memory()
            else:
                self.write_grouped(grouped)
        return self.written

    def write_batch(self, batch: Any) -> None:
        grouped = group_batch(batch, self.lanes)
        if grouped is not None:
            self.write_grouped(grouped)


def write_in_parallel(items: Iterable[Any], *writers: Callable[[Iterable[Any]], Any]) -> list[Any]:
    """Each of ``writers`` (a function of an iterable) over the same ``items`` (made once,
    in this thread: the events read and grouped, :func:`grouped_slices`), each writer in
    its own thread, fed through a short queue, so the two traces are encoded at once on
    two cores (their numpy and Arrow work releases the GIL). Returns what each writer
    returned; the first writer's error is raised once every thread has stopped."""
    import queue
    import threading

    done = object()
    feeds: list[queue.Queue[Any]] = [queue.Queue(maxsize=2) for _ in writers]
    results: list[Any] = [None] * len(writers)
    errors: list[BaseException | None] = [None] * len(writers)

    ended = [False] * len(writers)

    def drain(k: int) -> Iterator[Any]:
        while (item := feeds[k].get()) is not done:
            yield item
        ended[k] = True

    def work(k: int) -> None:
        try:
            results[k] = writers[k](drain(k))
        except BaseException as error:  # raised in the calling thread below
            errors[k] = error
        while not ended[k]:  # a writer that stopped early: the reader still goes on to the end
            ended[k] = feeds[k].get() is done

    threads = [threading.Thread(target=work, args=(k,), name=f"dfit-trace-{k}", daemon=True)
               for k in range(len(writers))]
    for thread in threads:
        thread.start()
    try:
        for item in items:
            for feed in feeds:
                feed.put(item)
    finally:
        for feed in feeds:
            feed.put(done)
        for thread in threads:
            thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results


#: Tracks of invocations (and operations) remembered: events of an invocation that come
#: back after this many others were drawn go on a second track of the same name. Keeps
#: the writer's memory bounded however many invocations a run has.
LIVE_TRACKS = 65_536


def forget_oldest(recent: OrderedDict[Any, Any]) -> None:
    """Keep the :data:`LIVE_TRACKS` most recently used entries of ``recent`` (used ones
    are popped and put back, so they come last). An OrderedDict: dropping the first
    entries of a plain dict again and again makes each drop slower (its iteration skips
    the emptied slots), which showed past 65,536 invocations."""
    while len(recent) > LIVE_TRACKS:
        recent.popitem(last=False)


#: Events read at a time.
BATCH_ROWS = 65_536
#: Rows read from ``events.parquet`` at a time for the traces: the writers encode
#: :data:`ENCODE_ROWS` at a time, and Arrow's reader held what it decoded of a batch's
#: columns (the per-event ``attributes`` text above all): reading the 15 row groups a
#: long run's traces keep (22M events) peaked 46 MiB over the start in batches of 65,536
#: rows, 22 in batches of 8,192.
READ_ROWS = 8_192
#: Events encoded at a time (a read batch is cut into slices this long, no copy): the
#: encoding's temporaries are a few times its output, ≈ 500 bytes an event in trace.json,
#: so this bounds the writers' memory (65,536 at once peaked 160 MiB above the run's).
ENCODE_ROWS = 8_192


def encode_slices(batches: Iterable[Any]) -> Iterator[Any | None]:
    """The events of ``batches`` in slices of :data:`ENCODE_ROWS` events cut at the same
    rows whatever the batches are (views, not copies, but for the one slice across two
    batches), and ``None`` after each batch. The traces depend on where the slices are
    cut (a track's lanes are assigned a slice at a time), and a run's batches as its
    pipeline exports them are not the batches ``events.parquet`` gives back (the reader
    cuts at multiples of its batch size too): cut by position, the traces drawn from
    either are the same bytes. A batch of other columns (a plan's summary slices) ends
    the slice before it."""
    pending: list[Any] = []  # the start of a slice, from the end of the batches before
    held = 0
    for batch in batches:
        start = 0
        if pending and batch.schema != pending[0].schema:
            yield _combined(pending)
            pending, held = [], 0
        if pending:
            start = min(ENCODE_ROWS - held, batch.num_rows)
            pending.append(batch.slice(0, start))
            held += start
            if held == ENCODE_ROWS:
                yield _combined(pending)
                pending, held = [], 0
        while batch.num_rows - start >= ENCODE_ROWS:
            yield batch.slice(start, ENCODE_ROWS)
            start += ENCODE_ROWS
        if start < batch.num_rows:
            pending, held = [batch.slice(start)], batch.num_rows - start
        yield None
    if pending:
        yield _combined(pending)


def _combined(parts: list[Any]) -> Any:
    """One record batch of ``parts`` (batches of one schema), its dictionary columns
    decoded: each row group read back has dictionaries of its own, and unifying them
    copies every value of each (a row group of queue events: 65,536 distinct attribute
    texts) for a slice of 8,192 rows (5M events: 40-60 MiB more at the peak)."""
    import pyarrow as pa

    if len(parts) == 1:
        return parts[0]
    plain = [pa.RecordBatch.from_arrays([column.dictionary_decode() if pa.types.is_dictionary(column.type) else column
                                         for column in part.columns], names=part.schema.names) for part in parts]
    return pa.Table.from_batches(plain).combine_chunks().to_batches()[0]


def grouped_slices(batches: Iterable[Any], lanes: Lanes | None = None) -> Iterator[Grouped | None]:
    """The events of ``batches``, :data:`ENCODE_ROWS` at a time (:func:`encode_slices`),
    grouped for the writers (:func:`group_batch`, one :class:`Lanes` over the whole
    stream), and ``None`` after each batch (a writer hands back what the batch freed
    there). Both traces draw the same groups: grouped once, they are written by both
    (:func:`write_in_parallel`)."""
    lanes = Lanes() if lanes is None else lanes
    for part in encode_slices(batches):
        if part is None:
            yield None
            continue
        grouped = group_batch(part, lanes)
        if grouped is not None:
            yield grouped


def data_end(array: Any) -> int:
    """Where the values of ``array`` (large_binary, unsliced) end in its data buffer."""
    assert array.offset == 0
    return int(np.frombuffer(array.buffers()[1], dtype=np.int64, count=len(array) + 1)[-1])


def _codes(column: Any) -> tuple[np.ndarray, list[Any]]:
    """(code per row, value per code) of an Arrow column; null is a value like any other."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count == len(column):
        return np.zeros(len(column), dtype=np.int64), [None]
    encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
    values = encoded.dictionary.to_pylist() + [None]
    indices = encoded.indices.fill_null(len(values) - 1)
    return np.asarray(indices, dtype=np.int64), values


def _row_keys(codes: list[tuple[np.ndarray, list[Any]]], count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group rows by their codes: (first row of each group, group of each row, group order).
    Groups are numbered in first-use order when the codes fit one integer key (hashed by
    Arrow, no sort), else by a row-wise sort and then put in first-use order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    codes = [(column, values) for column, values in codes if len(values) > 1]  # a constant tells no row apart
    radix = 1
    for _, values in codes:
        radix *= len(values)
    if radix < 2**62:
        key = np.zeros(count, dtype=np.int64)
        for column, values in codes:
            key = key * len(values) + column
        encoded = pc.dictionary_encode(pa.array(key))
        inverse = np.asarray(encoded.indices, dtype=np.int64)
        # Groups are numbered as they first appear, so a group's first row is where the
        # running maximum of the group numbers first reaches it.
        first = np.flatnonzero(np.diff(np.maximum.accumulate(inverse), prepend=-1) > 0)
        return first, inverse, np.arange(len(first))
    stacked = np.ascontiguousarray(np.stack([column for column, _ in codes], axis=1))
    _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1), np.argsort(first, kind="stable")


class Lanes:
    """Which lane of its track each slice goes on, so that the slices of one lane nest
    (Perfetto ends the most recent open slice of a track: crossing slices would be paired
    wrongly). Most tracks nest already and stay on lane 0, found by a vectorized check
    that also sees the slices still open at the end of the previous batch; a track with
    crossing slices is laid out slice by slice, first-fit, and keeps its lanes' open
    slices for the next batches (the most recently used :data:`LIVE_TRACKS` tracks).

    Events are expected in time order across batches, as every bundle writes them: a
    slice starting before the previous batch's last start is checked against the slices
    still open then, not against all earlier ones."""

    def __init__(self) -> None:
        #: Laid-out track → per lane, the ends of its open slices (innermost last).
        self.open: OrderedDict[tuple[Any, ...], list[list[int]]] = OrderedDict()
        #: Nesting track → its slices (start, end, kind) still open at the last batch's
        #: last start: what a slice of the next batch could cross.
        self.carried: dict[tuple[Any, ...], list[tuple[int, int, int]]] = {}
        self.kind_numbers: dict[Any, int] = {}

    def kinds(self, codes: np.ndarray, values: list[Any]) -> np.ndarray:
        """Kind codes of one batch → kind numbers that hold across batches."""
        numbers = self.kind_numbers
        return np.array([numbers.setdefault(value, len(numbers)) for value in values], dtype=np.int64)[codes]

    def assign(self, tracks: list[tuple[Any, ...]], track_of_row: np.ndarray, kinds: np.ndarray,
               starts: np.ndarray, ends: np.ndarray, instant: np.ndarray) -> np.ndarray:
        """The lane of each row (0 for instants); ``kinds`` from :meth:`kinds`."""
        lanes = np.zeros(len(starts), dtype=np.int64)
        rows = np.flatnonzero(~instant)
        if not len(rows):
            return lanes
        # The batch's slices and the carried ones (row -1), by track, start, longest first.
        keys = list(tracks)
        index_of = {key: index for index, key in enumerate(keys)} if self.carried else {}
        carried: list[tuple[int, int, int, int]] = []
        for key, slices in self.carried.items():
            index = index_of.get(key)
            if index is None:  # a track of an earlier batch: its slices still count
                index = index_of[key] = len(keys)
                keys.append(key)
            carried += [(index, *slice_) for slice_ in slices]
        carried.sort(key=lambda slice_: slice_[1])  # they started before this batch: first, in time order
        track = np.concatenate([np.array([c[0] for c in carried], dtype=np.int64), track_of_row[rows]])
        start = np.concatenate([np.array([c[1] for c in carried], dtype=np.int64), starts[rows]])
        end = np.concatenate([np.array([c[2] for c in carried], dtype=np.int64), ends[rows]])
        kind = np.concatenate([np.array([c[3] for c in carried], dtype=np.int64), kinds[rows]])
        row = np.concatenate([np.full(len(carried), -1, dtype=np.int64), rows])
        order = _by_track_then_start(track, start)
        track, start, end, kind, row = track[order], start[order], end[order], kind[order], row[order]
        crossing = _crossing(track, kind, start, end)
        todo = {index for index, key in enumerate(keys) if key in self.open} if self.open else set()
        if crossing.any():
            todo |= set(track[crossing].tolist())
        bounds = np.searchsorted(track, [sorted(todo), np.add(sorted(todo), 1)])
        for index, begin, stop in zip(sorted(todo), bounds[0].tolist(), bounds[1].tolist(), strict=True):
            key = keys[index]
            stacks = self.open.pop(key, None)
            if stacks is None:  # its carried slices nest (they all hold one instant): lane 0's stack
                stacks = [[end for _, end, _ in sorted(self.carried.pop(key, []))]]
            # Longest first among equal starts, so that the shorter nest in it.
            for at in sorted(range(begin, stop), key=lambda at: (start[at], -end[at])):
                if row[at] >= 0:
                    lanes[row[at]] = _first_fit(stacks, int(start[at]), int(end[at]))
            self.open[key] = stacks
        forget_oldest(self.open)
        # What the nesting tracks carry into the next batch.
        last_start = int(starts[rows].max())
        keep = end > last_start
        if todo:
            keep &= ~np.isin(track, sorted(todo))
        self.carried = {}
        for index, slice_start, slice_end, slice_kind in zip(track[keep].tolist(), start[keep].tolist(),
                                                             end[keep].tolist(), kind[keep].tolist(), strict=True):
            self.carried.setdefault(keys[index], []).append((slice_start, slice_end, slice_kind))
        return lanes


def _by_track_then_start(track: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The order of rows by track, then start (one stable sort when the rows come in
    time order, as they do from every bundle)."""
    if len(start) < 2 or bool((start[1:] >= start[:-1]).all()):
        return np.argsort(track, kind="stable")
    return np.lexsort((start, track))


def _first_fit(stacks: list[list[int]], start: int, end: int) -> int:
    """The first lane where a slice [start, end) nests (its open slices that ended are
    closed first), opening a new lane if none; the slice is pushed on it."""
    for lane, stack in enumerate(stacks):
        while stack and stack[-1] <= start:
            stack.pop()
        if not stack or end <= stack[-1]:
            stack.append(end)
            return lane
    stacks.append([end])
    return len(stacks) - 1


def _crossing(track: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which slices may cross another of their track (rows sorted by track, then start;
    equal starts in any order).

    Exact when each kind's slices on a track are disjoint (one invocation's program,
    functions and dispatches; one queue's operations): then two slices can only cross if
    they are of different kinds, and a slice y can only cross the slice x of another kind
    that starts last at or before it — y must end inside x, or start at or after x's end.
    Slices of one kind that overlap are flagged as they are (first-fit sorts them out)."""
    count = len(start)
    flagged = np.zeros(count, dtype=bool)
    by_kind = np.argsort(track * (int(kind.max()) + 1) + kind, kind="stable")  # start order kept
    same_group = (track[by_kind][1:] == track[by_kind][:-1]) & (kind[by_kind][1:] == kind[by_kind][:-1])
    overlap = same_group & (start[by_kind][1:] < end[by_kind][:-1])
    flagged[by_kind[1:][overlap]] = True
    flagged[by_kind[:-1][overlap]] = True
    # Position of each slice in (track, start) order: rows are sorted so already.
    for kind_x in np.unique(kind).tolist():
        xs = np.flatnonzero(kind == kind_x)
        ys = np.flatnonzero(kind != kind_x)
        if not len(ys):
            continue
        # The x of the same track starting last at or before each y: xs are in
        # (track, start) order, so a search on the rows' order finds it.
        found = np.searchsorted(xs, ys, side="right") - 1
        has = found >= 0
        x = xs[np.maximum(found, 0)]
        has &= track[x] == track[ys]
        nested = end[ys] <= end[x]
        after = start[ys] >= end[x]
        same_start = start[ys] == start[x]  # nested one way or the other: checked from x's side
        bad = has & ~nested & ~after & ~same_start
        flagged[ys[bad]] = True
        flagged[x[bad]] = True
    return flagged


@dataclass(frozen=True)
class Grouped:
    """A batch of events (those with a start time), grouped for the trace writers: the
    few distinct tracks and slice descriptions, and which one each event has."""

    count: int
    starts: np.ndarray
    durations: np.ndarray
    #: Drawn as an instant (a tensor record, or no duration), not a slice.
    instant: np.ndarray
    #: (group, stage, track name, lane) of each distinct track.
    tracks: list[tuple[str | None, str, str, int]]
    track_of_row: np.ndarray
    #: (instant, the describing fields) of each distinct description, in first-use order.
    descriptions: list[tuple[bool, dict[str, Any]]]
    description_of_row: np.ndarray
    #: The first row with each description.
    description_rows: np.ndarray
    #: Row → flow id (merged traces: events sharing one are linked).
    flows: dict[int, int]
    #: Each event's attributes (Arrow large_binary, empty for none: no annotation).
    attributes: Any


def group_batch(batch: Any, lanes: Lanes) -> Grouped | None:
    """Group ``batch``'s events (Arrow record batch of :func:`trace_columns`, plus the
    optional ``track_group`` and ``flow_id``); ``None`` when none has a start time.
    A track whose slices cross is split into lanes (``lanes``, the writer's own)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    if es.START_NS not in names or not batch.num_rows:
        return None
    starts_column = batch.column(es.START_NS)
    if starts_column.null_count:
        batch = batch.filter(pc.is_valid(starts_column))
    count = batch.num_rows
    if not count:
        return None
    column = {name: batch.column(name) for name in names}

    def optional(name: str) -> Any:
        return column[name] if name in column else pa.nulls(count, pa.string())

    starts = np.asarray(column[es.START_NS], dtype=np.int64)
    durations = np.asarray(column[es.DURATION_NS].fill_null(0), dtype=np.int64) if es.DURATION_NS in column \
        else np.zeros(count, dtype=np.int64)
    kinds, kind_values = _codes(column[es.KIND])
    tensor_kind = np.array([value == "tensor" for value in kind_values])
    instant = tensor_kind[kinds] | (durations <= 0)

    # Tracks: distinct (group, stage, kind, invocation, partition, name), then their track names.
    track_columns = [_codes(optional(name)) for name in ("track_group", es.STAGE)] + [(kinds, kind_values)] + \
        [_codes(optional(name)) for name in (es.INVOCATION, es.PARTITION, es.NAME)]
    # An invocation's events share its track whatever their partition; the others, one per operation.
    (invocations, invocation_values), (partitions, partition_values), (names_, name_values) = track_columns[3:]
    on_invocation = np.array([value in INVOCATION_KINDS for value in kind_values])[kinds] & \
        (invocations != len(invocation_values) - 1)
    track_columns[3] = (np.where(on_invocation, invocations, len(invocation_values) - 1), invocation_values)
    track_columns[4] = (np.where(on_invocation, len(partition_values) - 1, partitions), partition_values)
    track_columns[5] = (np.where(on_invocation, len(name_values) - 1, names_), name_values)
    first, inverse, order = _row_keys(track_columns, count)
    rows = first[order]
    values_of = [[values[code] for code in codes[rows].tolist()] for codes, values in track_columns]
    named: dict[tuple[str | None, str, str], int] = {}
    track_of_key = np.zeros(len(first), dtype=np.int64)
    for key_index, (group, stage, kind, invocation, partition, name) in zip(
            order.tolist(), zip(*values_of, strict=True), strict=True):
        track_of_key[key_index] = named.setdefault(
            (group, stage, track_name(kind, invocation, partition, name)), len(named))
    # Slices on one track must nest; where some cross (asynchronous queue operations,
    # overlapping vendor phases), they go on lanes: tracks of the same name (Perfetto's
    # UI shows same-named siblings as one track).
    named_tracks = list(named)
    lane = lanes.assign(named_tracks, track_of_key[inverse], lanes.kinds(kinds, kind_values), starts,
                        starts + durations, instant)
    track_of_row = track_of_key[inverse]
    tracks = [(*key, 0) for key in named_tracks]
    if lane.any():
        width = int(lane.max()) + 1
        laned, track_of_row = np.unique(track_of_row * width + lane, return_inverse=True)
        tracks = [(*named_tracks[key // width], key % width) for key in laned.tolist()]

    # Descriptions: distinct (instant, describing fields), in first-use order.
    describing = [(instant.astype(np.int64), [False, True])] + \
        [_codes(column[name]) if name in column else (np.zeros(count, dtype=np.int64), [None])
         for name in DESCRIBING]
    first, description_of_row, order = _row_keys(describing, count)
    descriptions = []
    for key_index in order.tolist():
        row = first[key_index]
        descriptions.append((bool(instant[row]), {name: describing[k + 1][1][describing[k + 1][0][row]]
                                                  for k, name in enumerate(DESCRIBING)}))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    flows: dict[int, int] = {}
    if "flow_id" in column and column["flow_id"].null_count < count:
        flows = {row: int(flow) for row, flow in enumerate(column["flow_id"].to_pylist()) if flow is not None}
    attributes = pa.nulls(count, pa.large_binary()) if es.ATTRIBUTES not in column \
        else column[es.ATTRIBUTES].cast(pa.large_string()).cast(pa.large_binary())
    return Grouped(count, starts, durations, instant, tracks, np.asarray(track_of_row).reshape(-1), descriptions,
                    rank[description_of_row], first[order], flows, attributes.fill_null(b""))

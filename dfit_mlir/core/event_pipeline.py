"""The normalized event pipeline: raw dispatch records → policy → normalized rows →
a streaming Parquet sink (plus the site table that interns each site's IDs).

Everything is columnar: dispatch records arrive as arrays (site index, start, duration,
workgroups, tiles), the policy filters them with masks, and per-site values (root ID,
fused IDs, export name, MACs/FLOPs) are gathered with ``take`` from tables built once
from the manifest. Memory is bounded by the batch size, whatever the run's length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import numpy as np

from dfit_mlir.core import event_schema as es
from dfit_mlir.core import filters
from dfit_mlir.core.perf import release_freed_memory
from dfit_mlir.core.site_costs import dispatch_site_costs
from dfit_mlir.core.write_behind import WriteBehind


@dataclass(frozen=True)
class Policy:
    """What to keep. ``ids``: globs over the names of root and fused ops — IDs, op names
    as the frontend shows them, module paths, ignoring case (``dfit_mlir/core/filters.py``;
    empty: all);
    ``sample_every``: keep one dispatch event in k, deterministically by event index;
    ``max_events``: a budget, events past it are dropped and counted;
    ``trace_all``: the traces draw every event however long the run (else, past
    ``dfit_mlir.exporters.trace_plan.TRACE_MAX_EVENTS``, they summarise the middle
    invocations: ``dfit run --trace-all``)."""

    mode: str = "full"
    ids: tuple[str, ...] = ()
    sample_every: int = 1
    max_events: int | None = None
    batch_size: int = 65_536
    trace_all: bool = False

    def __post_init__(self) -> None:
        if self.sample_every < 1:
            raise ValueError("sample_every must be >= 1")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")

    def selects(self, ids: Sequence[str], names: Mapping[str, Iterable[str]] | None = None) -> bool:
        """Whether any of ``ids`` matches; ``names``: each ID's names (else the ID and its
        op name)."""
        if not self.ids:
            return True
        selection = filters.NameFilter(self.ids, "--ids")
        return any(selection.matches((names or {}).get(i) or filters.id_names(i)) for i in ids)

    def check(self, manifest: dict[str, Any], where: str = "the manifest") -> dict[str, tuple[str, ...]]:
        """Each operator's names; :class:`~dfit_mlir.core.filters.FilterMatchesNothing` if an
        ``ids`` glob matches no operator of ``manifest``."""
        names = filters.names_by_id(manifest.get("operators") or ())
        if self.ids:
            filters.NameFilter(self.ids, "--ids").select(names, where)
        return names


@dataclass(frozen=True, slots=True)
class EventRow:
    """One non-dispatch event before normalization (``None``: the field does not apply)."""

    invocation: int | None
    partition: str | None
    root_id: str | None
    start_ns: int | None
    duration_ns: int | None
    bytes: int | None = None
    attributes: dict[str, Any] | None = None
    tensor_min: float | None = None
    tensor_max: float | None = None
    tensor_mean: float | None = None
    tensor_std: float | None = None
    tensor_nans: int | None = None
    tensor_infs: int | None = None
    name: str | None = None
    value: float | None = None
    step: int | None = None


def _tensor_columns(pa: Any) -> tuple[tuple[str, str, Any], ...]:
    return (
        (es.TENSOR_MIN, "tensor_min", pa.float64()), (es.TENSOR_MAX, "tensor_max", pa.float64()),
        (es.TENSOR_MEAN, "tensor_mean", pa.float64()), (es.TENSOR_STD, "tensor_std", pa.float64()),
        (es.TENSOR_NANS, "tensor_nans", pa.int64()), (es.TENSOR_INFS, "tensor_infs", pa.int64()),
    )


@dataclass
class Counts:
    seen: int = 0
    kept: int = 0
    filtered: int = 0
    sampled_out: int = 0
    dropped: int = 0


class EventSink(Protocol):
    """Where normalized batches go (narrow, like an OpenTelemetry exporter)."""

    def export(self, batch: Any) -> None: ...

    def shutdown(self) -> None: ...


class ParquetSink:
    """Streams record batches into one Parquet file, written from a thread of its own
    (:class:`~dfit_mlir.core.write_behind.WriteBehind`: Parquet's encoding and zstd
    release the GIL, so a long run's join goes on while the last batch is compressed —
    a quarter of the join's time at 660k events); at most two batches wait."""

    def __init__(self, path: Path, source: str | None = None):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = path
        #: What the events come from, as an error names it (default: the file written).
        self.source = source or str(path)
        schema = es.arrow_schema()
        self._fields = {field.name: field for field in schema}
        self._rows = 0
        # Parquet's dictionary pages only for the columns that repeat a few values (the
        # interned strings, the attribute texts): on unique times and sizes they cost
        # time and bytes (5M events: ~10% less to write, a third smaller).
        repeated = [f.name for f in schema if pa.types.is_dictionary(f.type)] + [es.ATTRIBUTES]
        self._writer = pq.ParquetWriter(str(path), schema, compression="zstd",
                                        use_dictionary=repeated)  # type: ignore[arg-type]  # a list: documented
        self._behind = WriteBehind(self._write, depth=2, name="dfit-parquet-writer")

    def _write(self, batch: Any) -> None:
        self._writer.write_batch(batch)
        # What the batches free is handed back as it piles up, so a long run's peak RSS
        # stays about that of one batch (-40 MiB at 5M events).
        release_freed_memory()

    def export(self, batch: Any) -> None:
        # dfit never writes events its own readers refuse (a damaged profile's event that
        # ends before it begins, a time past their bounds): checked as they check, and
        # the writer's atomic folder is then left unwritten.
        es.check_values(self.source, batch, self._fields, self._rows)
        self._rows += batch.num_rows
        self._behind.write(batch)

    def shutdown(self) -> None:
        try:
            self._behind.close()
        except BaseException:
            with contextlib.suppress(Exception):  # the write's error is the one to see
                self._writer.close()
            raise
        self._writer.close()


class MemorySink:
    """Keeps every batch: for tests."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def export(self, batch: Any) -> None:
        self.batches.append(batch)

    def shutdown(self) -> None:
        pass

    def table(self) -> Any:
        import pyarrow as pa

        return pa.Table.from_batches(self.batches, schema=es.arrow_schema())


@dataclass
class _SiteTable:
    """Per-site values, gathered by site index: built once from the manifest."""

    root_ids: Any
    partitions: Any
    macs: Any
    flops: Any
    selected: np.ndarray


def _site_table(manifest: dict[str, Any], policy: Policy,
                names: Mapping[str, Iterable[str]] | None = None) -> _SiteTable:
    import pyarrow as pa

    sites = manifest["partitions"]["dispatch_sites"]
    return _SiteTable(
        root_ids=pa.array([s["root_id"] for s in sites], pa.string()).dictionary_encode(),
        partitions=pa.array([s["export"] for s in sites], pa.string()).dictionary_encode(),
        # An op split over several dispatches counts once, where it computes.
        macs=pa.array(dispatch_site_costs(manifest, "macs"), pa.int64()),
        flops=pa.array(dispatch_site_costs(manifest, "flops"), pa.int64()),
        selected=np.array([policy.selects(s["fused_ids"] or s["ids"], names) for s in sites], dtype=bool),
    )


@dataclass
class EventPipeline:
    """Dispatch records in, normalized ``events.parquet`` rows out."""

    manifest: dict[str, Any]
    policy: Policy
    sink: EventSink
    session: str
    backend: str = "iree"
    stage: str = "runtime"
    counts: Counts = field(default_factory=Counts)

    def __post_init__(self) -> None:
        self._names = self.policy.check(self.manifest) if self.policy.ids else {}
        self._sites = _site_table(self.manifest, self.policy, self._names)
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        #: Dispatch attribute texts (JSON) -> code, in first-use order.
        self._text_codes: dict[str, int] = {}
        #: The column streams being written (:meth:`add_columns`): key -> rows not yet
        #: written (pieces of columns), in the order the streams were opened.
        self._streams: dict[tuple[Any, ...], list[dict[str, np.ndarray]]] = {}
        #: Null columns of a whole batch, by type (:meth:`_null_column`).
        self._nulls: dict[Any, Any] = {}

    def add_dispatches(self, site: np.ndarray, start_ns: np.ndarray, duration_ns: np.ndarray,
                       workgroups: np.ndarray, tiles: np.ndarray, invocation: np.ndarray, *,
                       attributes: tuple[np.ndarray, Sequence[str]] | None = None) -> None:
        """A block of dispatch records (equal-length arrays, events in runtime order).
        ``attributes``: (code of each row, JSON texts; ``""`` or a code ``< 0``: none),
        the few distinct texts interned across blocks (a dispatch's workgroup shape).
        Written in whole batches, beside the column streams (:meth:`add_columns`)."""
        count = len(site)
        first = self.counts.seen
        self.counts.seen += count
        keep = self._sites.selected[site]
        self.counts.filtered += int(count - keep.sum())
        if self.policy.sample_every > 1:
            sampled = (np.arange(first, first + count) % self.policy.sample_every) == 0
            self.counts.sampled_out += int((keep & ~sampled).sum())
            keep &= sampled
        indices = np.flatnonzero(keep)
        if self.policy.max_events is not None:
            room = max(0, self.policy.max_events - self.counts.kept - self._pending_rows)
            self.counts.dropped += max(0, len(indices) - room)
            indices = indices[:room]
        if not len(indices):
            return
        columns = {"site": site[indices], "start_ns": start_ns[indices], "duration_ns": duration_ns[indices],
                   "workgroups": workgroups[indices], "tiles": tiles[indices], "invocation": invocation[indices],
                   "attributes": self._attribute_codes(attributes, indices)}
        self._pending.append(columns)
        self._pending_rows += len(indices)
        while self._pending_rows >= self.policy.batch_size:
            self._flush(self.policy.batch_size)

    def _attribute_codes(self, attributes: tuple[np.ndarray, Sequence[str]] | None,
                         indices: np.ndarray) -> np.ndarray:
        """Pipeline-wide codes (into ``self._texts``; ``-1``: none) of ``attributes``' rows."""
        if attributes is None:
            return np.full(len(indices), -1, np.int32)
        codes, texts = attributes
        known = self._text_codes
        lookup = np.array([known.setdefault(text, len(known)) if text else -1 for text in texts] + [-1], np.int32)
        return lookup[codes[indices]]

    def add_joined(self, joined: Iterable[Any], invocation: int) -> None:
        """Records from :func:`dfit_mlir.runtime_hooks.hal_profile.join`."""
        rows = [(j.site_index, j.event.start_ns, j.event.duration_ns,
                 int(np.prod(j.event.workgroup_count)) if j.event.workgroup_count else -1,
                 j.event.tile_count if j.event.tile_count is not None else -1) for j in joined]
        if not rows:
            return
        site, start, duration, workgroups, tiles = (np.array(column, dtype=np.int64) for column in zip(*rows, strict=True))
        self.add_dispatches(site.astype(np.int32), start, duration, workgroups, tiles,
                            np.full(len(rows), invocation, dtype=np.int32))

    def add_programs(self, function: str, spans: Sequence[tuple[int, int]], first_invocation: int = 0) -> None:
        """One ``program`` event per invocation of ``function``: (start ns, duration ns)."""
        self.add_rows("program", [EventRow(first_invocation + k, function, None, start, duration)
                                  for k, (start, duration) in enumerate(spans)])

    def add_rows(self, kind: str, rows: Sequence[EventRow]) -> None:
        """Events other than dispatches (program, function, queue, memory, tensor): few
        per invocation, built row by row. The ID filter applies to rows that carry an
        ID, the event budget to all; sampling is the producer's business (tensor
        traces are sampled before they are copied)."""
        import json

        import pyarrow as pa

        if kind not in es.EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        self._flush_streams()  # rows keep the order they were added in
        self.counts.seen += len(rows)
        kept = [row for row in rows if row.root_id is None or self.policy.selects((row.root_id,), self._names)]
        self.counts.filtered += len(rows) - len(kept)
        if self.policy.max_events is not None:
            room = max(0, self.policy.max_events - self.counts.kept - self._pending_rows)
            self.counts.dropped += max(0, len(kept) - room)
            kept = kept[:room]
        if not kept:
            return
        self.counts.kept += len(kept)

        def column(name: str, arrow_type: Any) -> Any:
            return pa.array([getattr(row, name) for row in kept], arrow_type)

        self.sink.export(self._record_batch(len(kept), {
            es.KIND: kind,
            es.INVOCATION: column("invocation", pa.int32()),
            es.ROOT_ID: column("root_id", pa.string()).dictionary_encode(),
            es.PARTITION: column("partition", pa.string()).dictionary_encode(),
            es.START_NS: column("start_ns", pa.int64()),
            es.DURATION_NS: column("duration_ns", pa.int64()),
            es.BYTES: column("bytes", pa.int64()),
            **{field_name: column(attr, arrow_type) for field_name, attr, arrow_type in _tensor_columns(pa)},
            es.ATTRIBUTES: pa.array([None if row.attributes is None else json.dumps(row.attributes, sort_keys=True)
                                     for row in kept], pa.string()),
            es.NAME: column("name", pa.string()).dictionary_encode(),
            es.VALUE: column("value", pa.float64()),
            es.STEP: column("step", pa.int64()),
        }))

    def add_columns(self, kind: str, partition: tuple[np.ndarray, Sequence[str]], start_ns: np.ndarray, duration_ns: np.ndarray, *,
                    invocation: np.ndarray, bytes_: np.ndarray | None = None,
                    attributes: Mapping[str, np.ndarray] | None = None) -> None:
        """Events other than dispatches as columns (no object per row): what
        :meth:`add_rows` makes of :class:`EventRow` objects, for rows without an ID.
        ``partition``: (code of each row, the names); ``invocation``: ``-2`` for none
        (null); ``bytes_``: ``< 0`` for none;
        ``attributes``: name -> values, written as :meth:`add_rows` writes them (sorted
        keys, ``json.dumps``' separators).

        Calls with the same kind, names and attribute fields are one stream, written in
        whole batches (:attr:`Policy.batch_size`) as it fills, whatever is added between
        its calls: several families fed a window at a time each (a long run's, window by
        window, ``run.WindowedRun``) are written in batches as large as each family fed
        at once, in the order they fill (cut at every change of family, a 5M-event
        bundle's readers took a quarter longer: 252 row groups instead of 77). What is
        left of each stream is written at :meth:`close` (or before :meth:`add_rows`), in
        the order the streams were opened."""
        if kind not in es.EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        count = len(start_ns)
        self.counts.seen += count
        if self.policy.max_events is not None:
            room = max(0, self.policy.max_events - self.counts.kept - self._pending_rows - self._held())
            self.counts.dropped += max(0, count - room)
            count = min(count, room)
        stream = (kind, tuple(partition[1]), tuple(sorted(attributes or {})), bytes_ is None)
        if not count:
            return
        rows = slice(0, count)
        parts = self._streams.setdefault(stream, [])
        parts.append({
            "partition": partition[0][rows], "start_ns": start_ns[rows], "duration_ns": duration_ns[rows],
            "invocation": invocation[rows], **({} if bytes_ is None else {"bytes": bytes_[rows]}),
            **{f"attribute:{name}": values[rows] for name, values in (attributes or {}).items()}})
        while self._held(stream) >= self.policy.batch_size:
            self._write_stream(stream, self.policy.batch_size)

    def _held(self, stream: tuple[Any, ...] | None = None) -> int:
        """Rows not yet written of column stream ``stream`` (None: of every stream)."""
        pieces = self._streams.get(stream, []) if stream is not None else [
            part for parts in self._streams.values() for part in parts]
        return sum(len(part["start_ns"]) for part in pieces)

    def _flush_streams(self) -> None:
        for stream in list(self._streams):
            while self._streams.get(stream):
                self._write_stream(stream, self.policy.batch_size)
        self._streams.clear()

    def _write_stream(self, stream: tuple[Any, ...], rows: int) -> None:
        """Write the first ``rows`` rows of column stream ``stream`` (at most: all it
        holds) as one batch."""
        import pyarrow as pa
        import pyarrow.compute as pc

        parts = self._streams[stream]
        merged = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
        rows = min(rows, len(merged["start_ns"]))
        rest = {name: values[rows:] for name, values in merged.items()}
        self._streams[stream] = [rest] if len(rest["start_ns"]) else []
        now = {name: values[:rows] for name, values in merged.items()}
        kind, labels, attribute_names, no_bytes = stream
        k = now["invocation"]
        size = None if no_bytes else now["bytes"]
        attributes = {name: now[f"attribute:{name}"] for name in attribute_names}
        self.counts.kept += rows
        self.sink.export(self._record_batch(rows, {
            es.KIND: kind,
            es.INVOCATION: pa.array(k, pa.int32(), mask=k == -2),
            es.PARTITION: pa.DictionaryArray.from_arrays(pa.array(now["partition"], pa.int32()),
                                                         pa.array(list(labels), pa.string())),
            es.START_NS: pa.array(now["start_ns"], pa.int64()),
            es.DURATION_NS: pa.array(now["duration_ns"], pa.int64()),
            es.BYTES: pa.nulls(rows, pa.int64()) if size is None else pa.array(size, pa.int64(), mask=size < 0),
            es.ATTRIBUTES: None if not attributes else _json_objects(attributes, pa, pc),
        }))

    def close(self) -> Counts:
        self._flush_streams()
        while self._pending_rows:
            self._flush(self._pending_rows)
        self.sink.shutdown()
        return self.counts

    def _flush(self, rows: int) -> None:
        merged = {name: np.concatenate([block[name] for block in self._pending]) for name in self._pending[0]}
        now = {name: values[:rows] for name, values in merged.items()}
        rest = {name: values[rows:] for name, values in merged.items()}
        self._pending = [rest] if len(rest["site"]) else []
        self._pending_rows = len(rest["site"])
        self.sink.export(self._batch(now))
        self.counts.kept += rows

    def _batch(self, columns: dict[str, np.ndarray]) -> Any:
        import pyarrow as pa

        sites = pa.array(columns["site"], pa.int32())
        table = self._sites

        def optional(values: np.ndarray) -> Any:
            return pa.array(values, pa.int64(), mask=values < 0)

        return self._record_batch(len(columns["site"]), {
            es.KIND: "dispatch",
            es.INVOCATION: pa.array(columns["invocation"], pa.int32()),
            es.SITE: sites,
            es.ROOT_ID: table.root_ids.take(sites),
            es.PARTITION: table.partitions.take(sites),
            es.START_NS: pa.array(columns["start_ns"], pa.int64()),
            es.DURATION_NS: pa.array(columns["duration_ns"], pa.int64()),
            es.MACS: table.macs.take(sites),
            es.FLOPS: table.flops.take(sites),
            es.WORKGROUPS: optional(columns["workgroups"]),
            es.TILES: optional(columns["tiles"]),
            es.ATTRIBUTES: self._attribute_texts(columns["attributes"]),
        })

    def _attribute_texts(self, codes: np.ndarray) -> Any:
        """The dispatch rows' attributes (null where none), taken from the interned texts."""
        import pyarrow as pa

        if not self._text_codes or (codes < 0).all():
            return None
        texts = pa.array(list(self._text_codes), pa.string())
        return texts.take(pa.array(codes, pa.int32(), mask=codes < 0))

    def _null_column(self, count: int, arrow_type: Any) -> Any:
        """``count`` nulls of ``arrow_type``: for a whole batch, one column per type shared
        by every batch (immutable; each would otherwise hold a buffer of zeros, 0.5 MiB of
        a 65,536-row batch for each of a dozen null columns, several batches at once in
        the writers)."""
        import pyarrow as pa

        if count != self.policy.batch_size:
            return pa.nulls(count, arrow_type)
        if arrow_type not in self._nulls:
            self._nulls[arrow_type] = pa.nulls(count, arrow_type)
        return self._nulls[arrow_type]

    def _record_batch(self, count: int, columns: dict[str, Any]) -> Any:
        """A batch of the event schema: ``columns`` plus this session's constants; strings
        become one-value dictionary columns, fields not given are null."""
        import pyarrow as pa

        schema = es.arrow_schema()
        given = {es.SESSION: self.session, es.BACKEND: self.backend, es.STAGE: self.stage, **columns}
        arrays = []
        for column in schema:
            value = given.get(column.name)
            if value is None:
                arrays.append(self._null_column(count, column.type))
            elif isinstance(value, str):
                indices = pa.array(np.zeros(count, dtype=np.int32), pa.int32())
                arrays.append(pa.DictionaryArray.from_arrays(indices, pa.array([value])))
            else:
                arrays.append(value)
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _json_objects(columns: Mapping[str, np.ndarray], pa: Any, pc: Any) -> Any:
    """``json.dumps(row, sort_keys=True)`` of each row of ``columns`` (integers and
    strings), built column by column."""
    parts: list[Any] = []
    for position, name in enumerate(sorted(columns)):
        values = columns[name]
        text = pa.array(values, pa.string()) if values.dtype == object else pc.cast(pa.array(values), pa.string())
        if values.dtype == object:
            text = pc.binary_join_element_wise('"', text, '"', "")
        parts += [("{" if position == 0 else ", ") + f'"{name}": ', text]
    parts.append("}")
    return pc.binary_join_element_wise(*parts, "")


def site_table(manifest: dict[str, Any]) -> Any:
    """The interned IDs of ``events.parquet``: one row per dispatch call site with its
    export, root ID and every source ID fused into it."""
    import pyarrow as pa

    sites = manifest["partitions"]["dispatch_sites"]
    return pa.table({
        "site": pa.array([s["index"] for s in sites], pa.int32()),
        "function": [s["function"] for s in sites],
        "partition": [s["export"] for s in sites],
        "root_id": [s["root_id"] for s in sites],
        "ids": pa.array([s["fused_ids"] or s["ids"] for s in sites], pa.list_(pa.string())),
    })

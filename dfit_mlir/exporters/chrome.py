"""``trace.json``: a run's events as Chrome trace event JSON (complete and instant
events), streamed; tracks and slices grouped as :mod:`dfit_mlir.exporters.traces` says.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from dfit_mlir.core.write_behind import WriteBehind
from dfit_mlir.exporters.traces import (
    DESCRIBING,
    DESCRIPTION_CACHE,
    Grouped,
    Lanes,
    SliceNamer,
    TraceWriter,
    data_end,
    event_batches,
    forget_oldest,
    grouped_slices,
)


def write_chrome_json(parquet: Path, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.json`` (Chrome trace event format: complete and instant events),
    streamed from ``events.parquet``; returns the number of events written."""
    return write_chrome_json_batches(event_batches(parquet), manifest, path)


def write_chrome_json_batches(batches: Iterable[Any], manifest: dict[str, Any], path: Path) -> int:
    """:func:`write_chrome_json` from event batches (``track_group`` and ``flow_id`` as
    the Perfetto writer takes them)."""
    return write_chrome_json_groups(grouped_slices(batches), manifest, path)


def write_chrome_json_groups(groups: Iterable[Grouped | None], manifest: dict[str, Any], path: Path) -> int:
    """:func:`write_chrome_json_batches` of events already grouped
    (:func:`~dfit_mlir.exporters.traces.grouped_slices`)."""
    with path.open("wb") as file, WriteBehind(file.write, name="dfit-trace-writer") as stream:
        writer = ChromeJsonWriter(manifest, stream)
        written = writer.write_groups(groups)
        writer.close()
    return written


class ChromeJsonWriter(TraceWriter):
    """Events → Chrome trace JSON text, a batch at a time, grouped like
    :class:`~dfit_mlir.exporters.perfetto.PerfettoWriter`'s: a process per (group and) stage, a thread per track. Each
    distinct slice description becomes its JSON text once; each event adds its thread,
    timestamp and duration, formatted for the whole batch by Arrow (exact decimal
    microseconds, so nanoseconds survive) and joined row by row."""

    def __init__(self, manifest: dict[str, Any], stream: Any):
        self.stream = stream
        self.namer = SliceNamer(manifest)
        self.pids: dict[tuple[str | None, str], int] = {}
        #: Threads by (group, stage, track name); like the Perfetto writer's tracks, only
        #: the most recently used are kept (a forgotten one comes back as a new thread).
        self.tids: OrderedDict[tuple[str | None, str, str, int], int] = OrderedDict()
        self.next_tid = 1
        self.lanes = Lanes()
        self.descriptions: dict[tuple[Any, ...], tuple[str, str]] = {}
        self.written = 0
        self.first = True
        stream.write(b'{"displayTimeUnit": "ns", "traceEvents": [\n')

    def _emit(self, text: str | bytes | memoryview) -> None:
        """Write records (text joined by ",\\n"; bytes already separated)."""
        if not text:
            return
        if isinstance(text, str):
            text = (text if self.first else ",\n" + text).encode()
        self.stream.write(text)
        self.first = False

    def close(self) -> None:
        self.stream.write(b"\n]}\n")

    def write_grouped(self, grouped: Grouped) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        metadata: list[str] = []
        threads = []
        for key in grouped.tracks:
            group, stage, track, _ = key
            pid = self.pids.get((group, stage))
            if pid is None:
                pid = self.pids[(group, stage)] = len(self.pids) + 1
                name = f"stage: {stage}" if group is None else f"{group} / stage: {stage}"
                metadata.append(json.dumps({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}))
            tid = self.tids.pop(key, None)
            if tid is None:
                tid = self.next_tid
                self.next_tid += 1
                # A run has a thread per invocation: formatted, only the name JSON-encoded.
                metadata.append(f'{{"ph": "M", "name": "thread_name", "pid": {pid}, "tid": {tid}, '
                                f'"args": {{"name": {json.dumps(track)}}}}}')
            self.tids[key] = tid
            threads.append(f'}}, "pid": {pid}, "tid": {tid}, "ts": ')
        forget_oldest(self.tids)
        self._emit(",\n".join(metadata))

        heads = []
        for instant, event in grouped.descriptions:
            key = (instant, *(event.get(field) for field in DESCRIBING))
            found = self.descriptions.get(key)
            if found is None:
                # The record and its args left open: the event's attributes go in args,
                # its thread, timestamp and duration after them.
                found = (json.dumps({"cat": "dfit", "name": self.namer.name(event), "args": self.namer.args(event)})
                         [:-2],
                         ', "ph": "i", "s": "t"}' if instant else ', "ph": "X", "dur": ')
                if len(self.descriptions) < DESCRIPTION_CACHE:
                    self.descriptions[key] = found
            heads.append(found)
        text = pa.large_string()
        description = pa.array(grouped.description_of_row)
        columns = [pa.array([head for head, _ in heads], text).take(description),
                   _json_attributes(grouped.attributes),
                   pa.array(threads, text).take(pa.array(grouped.track_of_row)),
                   _microseconds(grouped.starts),
                   pa.array([tail for _, tail in heads], text).take(description),
                   pc.if_else(pa.array(grouped.instant), pa.scalar("", text),
                              pc.binary_join_element_wise(_microseconds(grouped.durations), pa.scalar("}", text),
                                                          pa.scalar("", text)))]
        # Every record is preceded by its separator; the first of the file drops it.
        records = pc.binary_join_element_wise(pa.scalar(",\n", text), *columns, pa.scalar("", text)) \
            .cast(pa.large_binary())
        data = memoryview(records.buffers()[2])[:data_end(records)]
        self._emit(bytes(data[2:]) if self.first else data)
        self.written += grouped.count


def _json_attributes(attributes: Any) -> Any:
    """Each event's ``, "attributes": "…"`` member of its args (empty for none), an Arrow
    string array. Dispatches repeat a few texts (workgroup shapes) over millions of
    events, queue and memory events rarely one (their submission ids differ): where the
    distinct texts are few, each is escaped once and taken per event."""
    import pyarrow as pa

    text = attributes.cast(pa.large_string())
    encoded = text.dictionary_encode()
    if len(encoded.dictionary) * 4 > len(text):
        return _escaped_members(text)
    return _escaped_members(encoded.dictionary).take(encoded.indices)


def _escaped_members(text: Any) -> Any:
    """``, "attributes": "…"`` of each value of ``text`` (a large_string array), empty for
    an empty value: JSON-escaped column-wise (backslashes and quotes; the rare value with
    control characters goes through ``json.dumps``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    data, offsets = _value_bytes(text)
    # Backslashes are rare in attributes (quotes are in every one): replaced only where present.
    slashes_doubled = pc.replace_substring(text, "\\", "\\\\") if (data == 0x5C).any() else text
    escaped = pc.replace_substring(slashes_doubled, '"', '\\"')
    controls = _rows_with_control_characters(data, offsets)
    if len(controls):
        values = escaped.to_pylist()
        for row in controls.tolist():
            values[row] = json.dumps(text[row].as_py())[1:-1]
        escaped = pa.array(values, pa.large_string())
    member = pc.binary_join_element_wise(pa.scalar(', "attributes": "', pa.large_string()), escaped,
                                         pa.scalar('"', pa.large_string()), pa.scalar("", pa.large_string()))
    return pc.if_else(pc.greater(pc.binary_length(text), 0), member, pa.scalar("", pa.large_string()))


def _value_bytes(text: Any) -> tuple[np.ndarray, np.ndarray]:
    """(the bytes of the values of ``text``, a large_string array, as one array (a view);
    where each value starts in the data buffer, and where the last ends)."""
    data_buffer = text.buffers()[2] if len(text) else None
    if data_buffer is None:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    offsets = np.frombuffer(text.buffers()[1], np.int64, count=len(text) + 1, offset=text.offset * 8)
    return np.frombuffer(data_buffer, np.uint8)[offsets[0]:offsets[-1]], offsets


def _rows_with_control_characters(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Rows holding a byte below 0x20 (``data``, ``offsets``: :func:`_value_bytes` of
    the values), found by one scan of their bytes (a regex over every value cost ten
    times more)."""
    at = np.flatnonzero(data < 0x20) + offsets[0]
    return np.unique(np.searchsorted(offsets, at, side="right") - 1)


def _microseconds(nanoseconds: np.ndarray) -> Any:
    """Nanoseconds as exact decimal microseconds (``1234567`` → ``"1234.567"``), an Arrow
    string array: JSON numbers, with no float rounding of large timestamps."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pa.large_string()
    magnitude = np.abs(nanoseconds)
    whole = pc.cast(pa.array(magnitude // 1000), text)
    # The point and three digits, zeros kept (7 → ".007"), taken from a table of the 1000.
    fraction = _fractions().take(pa.array(magnitude % 1000))
    parts = [whole, fraction, pa.scalar("", text)]
    if (nanoseconds < 0).any():
        parts.insert(0, pc.if_else(pa.array(nanoseconds < 0), pa.scalar("-", text), pa.scalar("", text)))
    return pc.binary_join_element_wise(*parts)


@functools.cache
def _fractions() -> Any:
    """``".000"`` to ``".999"``: the fraction of each remainder of nanoseconds by 1000."""
    import pyarrow as pa

    return pa.array([f".{remainder:03d}" for remainder in range(1000)], pa.large_string())

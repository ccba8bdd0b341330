"""The normalized event schema: one row per runtime (or compile) event, for every backend.

Field names are constants, one docstring each; the same fields, their Arrow types and
the schema version live as data in ``schemas/events-1.yaml`` (a test keeps the two in
step). Readers accept any version from ``MIN_READER_VERSION`` up to ``SCHEMA_VERSION``'s
major. IDs are interned: a row names its call site (``site``) and root op (``root_id``,
dictionary-encoded); the fused IDs of each site live once in the site table
(:func:`dfit_mlir.core.event_pipeline.site_table`). Writing a list of IDs per row instead
halves the Parquet writer's throughput (1.8M → 1.3M rows/s, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any, Final

import yaml

SCHEMA_VERSION: Final = "1.1"
MIN_READER_VERSION: Final = "1.0"

SESSION: Final = "session"
"""Run session this event belongs to (one ``dfit run`` or one ``instrument`` block)."""
BACKEND: Final = "backend"
"""Backend that produced the event (``iree``, ``edgetpu``, ``cerebras``, ``sambanova``)."""
STAGE: Final = "stage"
"""Compiler stage or runtime layer the event was observed at (``runtime``, ``hal``, a phase)."""
KIND: Final = "kind"
"""One of :data:`EVENT_KINDS`."""
INVOCATION: Final = "invocation"
"""0-based index of the program invocation (warm-up invocations are not recorded)."""
SITE: Final = "site"
"""Index of the dispatch call site in the manifest's ``partitions.dispatch_sites``; null if none."""
ROOT_ID: Final = "root_id"
"""Stable dfit ID of the root op of the event (null for events of no single op); the
other IDs a dispatch covers are those of its ``site`` in the bundle's site table."""
PARTITION: Final = "partition"
"""Partition the event ran in: the export name of a dispatch, a subgraph or section name."""
START_NS: Final = "start_ns"
"""Start time, host CLOCK_MONOTONIC nanoseconds (same clock as ``time.perf_counter_ns``)."""
DURATION_NS: Final = "duration_ns"
"""Duration in nanoseconds."""
BYTES: Final = "bytes"
"""Bytes moved, where known (static tensor sizes for dispatches)."""
MACS: Final = "macs"
"""Multiply-accumulates of the covered ops, where derivable."""
FLOPS: Final = "flops"
"""Floating-point (or integer arithmetic) operations of the covered ops, where derivable."""
WORKGROUPS: Final = "workgroups"
"""Workgroup count of a dispatch (x*y*z)."""
TILES: Final = "tiles"
"""Tiles executed by a dispatch (CPU drivers)."""
TENSOR_MIN: Final = "tensor_min"
"""Minimum of a traced tensor."""
TENSOR_MAX: Final = "tensor_max"
"""Maximum of a traced tensor."""
TENSOR_MEAN: Final = "tensor_mean"
"""Mean of a traced tensor."""
TENSOR_STD: Final = "tensor_std"
"""Standard deviation of a traced tensor."""
TENSOR_NANS: Final = "tensor_nans"
"""NaN count of a traced tensor."""
TENSOR_INFS: Final = "tensor_infs"
"""Inf count of a traced tensor."""
ATTRIBUTES: Final = "attributes"
"""Anything else, as a JSON object string."""
NAME: Final = "name"
"""What a ``metric``/``compile``/``memory`` event measured (``loss``, ``samples_per_sec``,
``compile.phase``, ``on_chip_parameter_bytes``); since 1.1."""
VALUE: Final = "value"
"""The measured figure, in ``attributes.unit`` where one is given; since 1.1."""
STEP: Final = "step"
"""Training or run step the event belongs to (reconstructed run logs); since 1.1."""

FIELDS: Final = (
    SESSION, BACKEND, STAGE, KIND, INVOCATION, SITE, ROOT_ID, PARTITION, START_NS, DURATION_NS,
    BYTES, MACS, FLOPS, WORKGROUPS, TILES, TENSOR_MIN, TENSOR_MAX, TENSOR_MEAN, TENSOR_STD,
    TENSOR_NANS, TENSOR_INFS, ATTRIBUTES, NAME, VALUE, STEP,
)

EVENT_KINDS: Final = ("compile", "program", "function", "dispatch", "queue", "memory", "tensor", "metric")


def schema_document() -> dict[str, Any]:
    """The schema file: version, oldest version readers accept, fields with their types."""
    text = resources.files("dfit_mlir.core").joinpath("schemas/events-1.yaml").read_text()
    return yaml.safe_load(text)


@functools.cache
def arrow_schema() -> Any:
    """The Arrow schema of ``events.parquet`` (built once: the YAML is parsed on the first
    call, not per batch written; an Arrow schema is immutable, so sharing it is safe)."""
    import pyarrow as pa

    types = {
        "string": pa.string(), "dict_string": pa.dictionary(pa.int32(), pa.string()),
        "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
    }
    document = schema_document()
    fields = [pa.field(f["name"], types[f["type"]], nullable=f.get("nullable", True)) for f in document["fields"]]
    metadata: dict[bytes | str, bytes | str] = {
        "dfit.schema": "dfit.events", "dfit.version": document["version"],
        "dfit.min_reader_version": document["min_reader_version"]}
    return pa.schema(fields, metadata=metadata)


def open_parquet(path: Any) -> Any:
    """``events.parquet`` opened for streaming (``pq.ParquetFile``), its string columns
    read as dictionaries: a run repeats a few dozen strings millions of times, and reading
    them dictionary-encoded is ~3x faster than materialising every value (or than Arrow's
    default, which decodes and then re-encodes the stored dictionary columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    stored = pq.read_schema(path)
    strings = [field.name for field in stored
               if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
               or pa.types.is_dictionary(field.type)]
    return pq.ParquetFile(path, read_dictionary=strings)


def readable(version: str) -> bool:
    """Whether this reader reads events written with schema ``version``."""
    def parse(text: str) -> tuple[int, int]:
        major, _, minor = text.partition(".")
        return int(major), int(minor or 0)

    try:
        wanted = parse(version)
    except ValueError:
        return False
    return parse(MIN_READER_VERSION) <= wanted and wanted[0] == parse(SCHEMA_VERSION)[0]


# --- the one check of an events file's contents, for every reader of a bundle ------------

#: Fields a file of an older minor may lack (read as nulls): the minor that added them.
ADDED_IN: Final = {NAME: "1.1", VALUE: "1.1", STEP: "1.1"}
#: The largest time dfit accepts (about 146 years of nanoseconds): a start plus a duration,
#: or a time plus a clock offset of this size, stays inside int64.
MAX_TIME_NS: Final = 1 << 62
#: Integer fields → (lowest, highest) value an event may carry (nulls are always allowed).
RANGES: Final = {
    START_NS: (0, MAX_TIME_NS), DURATION_NS: (0, MAX_TIME_NS), INVOCATION: (0, (1 << 31) - 1),
    SITE: (0, (1 << 31) - 1), STEP: (0, (1 << 63) - 1), BYTES: (0, (1 << 63) - 1), MACS: (0, (1 << 63) - 1),
    FLOPS: (0, (1 << 63) - 1), WORKGROUPS: (0, (1 << 63) - 1), TILES: (0, (1 << 63) - 1),
    TENSOR_NANS: (0, (1 << 63) - 1), TENSOR_INFS: (0, (1 << 63) - 1),
}

def check_events(path: Any, handle: Any = None) -> dict[str, Any]:
    """The footer half of the check: refuse an ``events.parquet`` that is unreadable, has
    no dfit schema metadata, a version this reader does not read, or a column of its
    version missing or of another type (one line naming the file and column; exit 2).
    Returns the schema fields it holds (name → field). ``handle``: the file already open."""
    import pyarrow as pa

    from dfit_mlir.core.errors import InvalidInputError

    try:
        return _expected_fields(path, (handle or open_parquet(path)).schema_arrow)
    except (pa.ArrowException, OSError, ValueError) as error:  # ArrowInvalid is a ValueError
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise InvalidInputError(f"{path}: not a readable Parquet file ({first})") from None


def checked_batches(path: Any, *, batch_size: int = 65_536, columns: list[str] | None = None,
                    handle: Any = None) -> Any:
    """The one way a bundle's events are read (analyze, diff, export-explorer, merge,
    collect): :func:`check_events`, then record batches whose values are checked as they
    are read — no null where the schema allows none, ``kind`` one of :data:`EVENT_KINDS`,
    integers inside :data:`RANGES` (negative or huge times) — an error naming the file,
    the column and the first bad row. Checking the batches the reader reads anyway
    costs no second read, only the vectorised tests (``benchmarks/RESULTS.md``, "bundle
    checks"). ``handle``: a ``pq.ParquetFile`` of ``path`` (default :func:`open_parquet`)."""
    import pyarrow as pa

    from dfit_mlir.core.errors import InvalidInputError

    handle = handle or open_parquet(path)
    fields = check_events(path, handle)
    offset = 0
    total = 0.0  # the durations read so far: their sum must stay an int64 where readers add them
    try:
        for batch in row_group_batches(handle, batch_size=batch_size, columns=columns):
            check_values(path, batch, fields, offset)
            total = _check_duration_sum(path, batch, offset, total)
            offset += batch.num_rows
            yield batch
    except (pa.ArrowException, OSError) as error:  # a page damaged past the footer
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise InvalidInputError(f"{path}: not a readable Parquet file ({first})") from None


#: Row groups one Parquet reader reads. A reader over the whole file holds memory for
#: every row group it has passed (pyarrow 26: ≈0.25 MiB per row group of this schema,
#: 60 MiB over a 5M-event file of 228 row groups, whatever the batch size); a new reader
#: per this many keeps it flat. A file of fewer row groups is read by one reader, as before.
ROW_GROUPS_PER_READER = 64


def row_group_batches(handle: Any, *, batch_size: int, columns: list[str] | None = None,
                      skip_invocations: tuple[int, int] | None = None) -> Any:
    """The record batches of ``handle`` (a ``pq.ParquetFile``), a new reader every
    :data:`ROW_GROUPS_PER_READER` row groups (batches do not span two readers).
    ``skip_invocations``: (first, last); row groups whose every event has an invocation
    within it (by the footer's statistics) are not read at all."""
    groups = [group for group in range(handle.metadata.num_row_groups)
              if skip_invocations is None or not _within(handle.metadata.row_group(group), skip_invocations)]
    for first in range(0, len(groups), ROW_GROUPS_PER_READER):
        yield from handle.iter_batches(batch_size=batch_size, columns=columns,
                                       row_groups=groups[first:first + ROW_GROUPS_PER_READER])


def _within(row_group: Any, invocations: tuple[int, int]) -> bool:
    """Whether every event of ``row_group`` (its footer metadata) has an invocation in
    ``invocations`` (inclusive): no nulls, and its minimum and maximum inside."""
    for column in range(row_group.num_columns):
        chunk = row_group.column(column)
        if chunk.path_in_schema != INVOCATION:
            continue
        stats = chunk.statistics
        if stats is None or not stats.has_min_max or stats.null_count != 0:
            return False
        return invocations[0] <= stats.min and stats.max <= invocations[1]
    return False


#: The events' durations together: at most this many ns (146 years), so that every sum a
#: reader takes of them (per site, per op, per run) fits an int64.
MAX_TOTAL_DURATION_NS = 1 << 62


def _check_duration_sum(path: Any, batch: Any, offset: int, total: float) -> float:
    """``total`` plus this batch's durations, refused past :data:`MAX_TOTAL_DURATION_NS`."""
    if "duration_ns" not in batch.schema.names:
        return total
    import numpy as np

    values = batch.column("duration_ns").to_numpy(zero_copy_only=False)
    running = total + np.nancumsum(values.astype(np.float64))
    if len(running) and running[-1] > MAX_TOTAL_DURATION_NS:
        row = offset + int(np.argmax(running > MAX_TOTAL_DURATION_NS))
        raise _input_error(f"{path}: column 'duration_ns': the durations add up past 2^62 ns (146 years) at row "
                           f"{row}; not a real run")
    return float(running[-1]) if len(running) else total


def _input_error(message: str) -> Exception:
    from dfit_mlir.core.errors import InvalidInputError

    return InvalidInputError(message)


def check_values(path: Any, batch: Any, fields: dict[str, Any], offset: int = 0) -> None:
    """Check the values of ``batch`` (rows ``offset``… of ``path``), column by column."""
    for name in batch.schema.names:
        if name in fields:
            _check_column(path, fields[name], batch.column(name), offset)


def _expected_fields(path: Any, stored: Any) -> dict[str, Any]:
    """The schema fields ``stored`` must have (name → field), checked for presence and type."""

    from dfit_mlir.core.errors import InvalidInputError

    metadata = stored.metadata or {}
    if metadata.get(b"dfit.schema") != b"dfit.events":
        raise InvalidInputError(f"{path}: not a dfit events file (no dfit.events schema metadata; "
                                "written by another tool, or rewritten without it)")
    version = metadata.get(b"dfit.version", b"").decode(errors="replace")
    if not readable(version):
        raise InvalidInputError(f"{path}: event schema {version[:20]!r} is not readable by this dfit "
                                f"(reads {MIN_READER_VERSION} to {SCHEMA_VERSION.split('.')[0]}.x)")
    fields = {}
    for field in arrow_schema():
        index = stored.get_field_index(field.name)
        if index < 0:
            added = ADDED_IN.get(field.name)
            if added is not None and not readable_at_least(version, added):
                continue  # an older minor: read as nulls
            raise InvalidInputError(f"{path}: column {field.name!r} is missing (event schema {version})")
        found = stored.field(index).type
        if not _same_type(found, field.type):
            raise InvalidInputError(f"{path}: column {field.name!r} is {_type_name(found)}, the event schema "
                                    f"says {_type_name(field.type)}")
        fields[field.name] = field
    return fields


def readable_at_least(version: str, minimum: str) -> bool:
    """Whether ``version`` (MAJOR.MINOR) is ``minimum`` or later."""
    def parse(text: str) -> tuple[int, int]:
        major, _, minor = text.partition(".")
        return int(major), int(minor or 0)

    return parse(version) >= parse(minimum)


def _type_name(kind: Any) -> str:
    import pyarrow as pa

    return str(kind.value_type) if pa.types.is_dictionary(kind) else str(kind)


def _same_type(found: Any, wanted: Any) -> bool:
    import pyarrow as pa

    def is_text(kind: Any) -> bool:
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        return pa.types.is_string(kind) or pa.types.is_large_string(kind)

    return is_text(found) if is_text(wanted) else found == wanted


def _check_column(path: Any, field: Any, column: Any, offset: int) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    from dfit_mlir.core.errors import InvalidInputError

    name = field.name
    if not field.nullable and column.null_count:
        row = _first(pc.is_null(column))
        raise InvalidInputError(f"{path}: column {name!r}, row {offset + row}: null, the event schema allows none")
    if name == KIND:
        # The dictionary's few values are checked, then the rows that point at a bad one.
        dictionary = column.dictionary if pa.types.is_dictionary(column.type) else None
        known = pc.is_in(dictionary if dictionary is not None else column, pa.array(EVENT_KINDS))
        if not pc.all(known).as_py():
            valid = pc.take(known, column.indices) if dictionary is not None else known
            row = _first(pc.invert(pc.fill_null(valid, True)))
            value = column[row].as_py()
            raise InvalidInputError(f"{path}: column 'kind', row {offset + row}: {str(value)[:40]!r} is not an event "
                                    f"kind ({', '.join(EVENT_KINDS)})")
        return
    bounds = RANGES.get(name)
    if bounds is None or len(column) == column.null_count:
        return
    low, high = bounds
    extremes = pc.min_max(column)
    if extremes["min"].as_py() >= low and extremes["max"].as_py() <= high:
        return
    outside = pc.fill_null(pc.or_(pc.less(column, pa.scalar(low)), pc.greater(column, pa.scalar(high))), False)
    row = _first(outside)
    value = column[row].as_py()
    why = "negative" if value < low and low == 0 else f"outside [{low}, {high}]"
    raise InvalidInputError(f"{path}: column {name!r}, row {offset + row}: {value} is {why}")


def _first(mask: Any) -> int:
    """Index of the first true value of a boolean array."""
    import pyarrow.compute as pc

    return int(pc.indices_nonzero(mask)[0].as_py())

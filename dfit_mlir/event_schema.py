"""The normalized event schema: one row per runtime (or compile) event, for every backend.

Field names are constants, one docstring each; the same fields, their Arrow types and
the schema version live as data in ``schemas/events-1.yaml`` (a test keeps the two in
step). Readers accept any version from ``MIN_READER_VERSION`` up to ``SCHEMA_VERSION``'s
major. IDs are interned: a row names its call site (``site``) and root op (``root_id``,
dictionary-encoded); the fused IDs of each site live once in the site table
(:func:`dfit_mlir.event_pipeline.site_table`). Writing a list of IDs per row instead
halves the Parquet writer's throughput (1.8M → 1.3M rows/s, benchmarks/RESULTS.md).
"""

from __future__ import annotations

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
    text = resources.files("dfit_mlir").joinpath("schemas/events-1.yaml").read_text()
    return yaml.safe_load(text)


def arrow_schema() -> Any:
    """The Arrow schema of ``events.parquet``."""
    import pyarrow as pa

    types = {
        "string": pa.string(), "dict_string": pa.dictionary(pa.int32(), pa.string()),
        "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
    }
    document = schema_document()
    fields = [pa.field(f["name"], types[f["type"]], nullable=f.get("nullable", True)) for f in document["fields"]]
    metadata = {"dfit.schema": "dfit.events", "dfit.version": document["version"],
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

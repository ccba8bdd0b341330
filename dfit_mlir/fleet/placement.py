"""Where a bundle's events ran: the bundle's backend, the placement its ``summary.json``
records (host, rank, clock offset), and per event the host, rank, pid and run scope
that a data-parallel log's tasks tag their events with (the ``attributes`` JSON).

``dfit merge`` (ranks on one timeline) and ``dfit collect`` (the store's ``host``/``rank``
columns) read a bundle's placement the same way, through this module; neither imports
the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from dfit_mlir.core.errors import InvalidInputError

#: A rank is an int32 in the store (``runs.rank``, ``events.rank``).
MAX_RANK: Final = (1 << 31) - 1
#: A pid is an int64 in the store (``events.pid``).
MAX_PID: Final = (1 << 63) - 1
#: Clock offsets dfit accepts (``dfit run --clock-offset-ns``, ``summary.clock_offset_ns``):
#: event times are at most 2^62 (``event_schema.MAX_TIME_NS``), so a shifted time stays in int64.
MAX_CLOCK_OFFSET_NS: Final = 1 << 62


def bundle_backend(summary: dict[str, Any], manifest: dict[str, Any]) -> str:
    """The backend a bundle is of: its summary's, else its manifest's capabilities', else IREE."""
    return str(summary.get("backend") or (manifest.get("capabilities") or {}).get("backend") or "iree")


def check_summary(summary: dict[str, Any], path: Path) -> None:
    """Refuse a ``summary.json`` whose placement fields are not what dfit writes: ``rank``
    an integer in [0, 2^31), ``clock_offset_ns`` an integer within ±2^62, ``host`` and
    ``session`` strings (each may be absent or null)."""
    bounded = {"rank": (0, MAX_RANK), "clock_offset_ns": (-MAX_CLOCK_OFFSET_NS, MAX_CLOCK_OFFSET_NS)}
    for key, (low, high) in bounded.items():
        value = summary.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise InvalidInputError(f"{path}: {key} is {str(value)[:40]}, not an integer in [{low}, {high}]")
    for key in ("host", "session", "backend"):
        value = summary.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidInputError(f"{path}: {key} is {str(value)[:40]}, not a string")


def placement_columns(attributes: Any, count: int, host: str | None, rank: int | None,
                      source: str = "events.parquet", offset: int = 0) -> dict[str, Any]:
    """host, rank, pid, run_scope per event: from the event's attributes where it names
    them (a data-parallel log's tasks), else the bundle's placement. A rank or pid out
    of the store's range is refused, naming ``source`` and the row (``offset``: the
    file's row of the first event given)."""
    import pyarrow as pa

    ranks: list[int | None] = [rank] * count
    pids: list[int | None] = [None] * count
    scopes: list[str | None] = [None] * count
    if attributes is not None and attributes.null_count < count:
        for index, text in enumerate(attributes.to_pylist()):
            if text is None or not ('"rank"' in text or '"pid"' in text or '"run_scope"' in text):
                continue
            try:
                values = json.loads(text)
            except (json.JSONDecodeError, RecursionError):
                continue
            if not isinstance(values, dict):
                continue
            for key, high, found in (("rank", MAX_RANK, ranks), ("pid", MAX_PID, pids)):
                value = values.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    if not 0 <= value <= high:
                        raise InvalidInputError(f"{source}: column 'attributes', row {offset + index}: {key} {str(value)[:40]} "
                                                f"is not in [0, {high}]")
                    found[index] = value
            if values.get("run_scope") is not None:
                scopes[index] = str(values["run_scope"])
    return {
        "host": pa.array([host] * count, pa.string()),
        "rank": pa.array(ranks, pa.int32()),
        "pid": pa.array(pids, pa.int64()),
        "run_scope": pa.array(scopes, pa.string()),
    }
